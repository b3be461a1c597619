"""LiteRT's own quantizer as a step: a float Keras model to a quantized ``.tflite`` (the
TFLite converter's post-training quantization), written atomically, for LiteRT to run as
a user's .tflite file (XNNPACK, the built-in kernels or the reference ones:
bitdrift.backends.exported.litert). The conversion is the export's own
(bitdrift.backends.keras.export.write_export: Keras' LiteRT export, TensorFlow's
converter) with the converter's quantization settings passed on:

- ``mode: full_integer`` (the default): optimizations DEFAULT, a representative dataset
  over the model's inputs (its inputs file, or its dataset's test set) calibrating every
  activation's scale, and ``supported_ops = [TFLITE_BUILTINS_INT8]``, so that every
  summing op is an int8 kernel (the conversion fails where one cannot be);
  ``inference_input_type`` / ``inference_output_type`` float32 (a QUANTIZE node in, a
  DEQUANTIZE node out: the devices feed the model's float inputs as they are) or int8
  (the file's own input and output int8: the devices feed float inputs, which LiteRT
  refuses, so such a file runs on none of them);
- ``mode: dynamic_range``: optimizations DEFAULT without a dataset (int8 weights,
  activations quantized per batch at run time by the hybrid kernels);
- ``mode: float16``: float16 weights, dequantized to float32 at load."""

from __future__ import annotations

from bitdrift.errors import ConfigError, ModelFormatError

# {setting: (its values, the default)}: the default mode is the full-integer
# quantization, the types the converter's own defaults (float32)
SETTINGS = {
    "mode": (("full_integer", "dynamic_range", "float16"), "full_integer"),
    "inference_input_type": (("float32", "int8"), "float32"),
    "inference_output_type": (("float32", "int8"), "float32"),
}
# each setting's help, for `bitdrift quantize --tool litert`
HELP = {
    "mode": "full_integer (int8 ops, calibrated on --inputs), dynamic_range (int8 weights) "
            "or float16 (float16 weights)",
    "inference_input_type": "full_integer: the file's input type",
    "inference_output_type": "full_integer: the file's output type",
}
MODES = {"full_integer": tuple(SETTINGS), "dynamic_range": ("mode",), "float16": ("mode",)}
CALIBRATION_SAMPLES = 128  # samples (at most) of the representative dataset, one per step


def config_key(key: str) -> str:
    return f"quantization.{key}"


def checked_settings(settings: dict, named=config_key) -> dict:
    """``settings`` with the defaults filled in; ConfigError in one line naming the setting
    (``named(key)``) for an unknown key, a value not allowed, or a type setting given to a
    mode other than full_integer."""
    from bitdrift.backends.quantizers import checked_choices

    return checked_choices(settings, SETTINGS, named, "LiteRT's quantizer",
                           scope=("mode", MODES))


def representative_dataset(model_path, model, inputs_path):
    """The converter's representative dataset: a function yielding [one sample, float32]
    for each of the first CALIBRATION_SAMPLES samples of ``inputs_path`` (an inputs file,
    or a prepared dataset's test set). A sample of another shape than the model's input
    is one line naming the model, the file and both shapes."""
    import numpy as np

    from bitdrift.errors import DatasetError
    from bitdrift.inputs.datasets import (
        count_test_images,
        read_test_images,
        test_image_shape,
    )

    if len(model.inputs) != 1:
        raise ModelFormatError(f"{model_path}: LiteRT's quantizer here takes a model of "
                               f"one input, not {len(model.inputs)}")
    expected = tuple(model.inputs[0].shape[1:])
    try:
        found, count = test_image_shape(inputs_path), count_test_images(inputs_path)
    except DatasetError as error:
        raise ModelFormatError(f"quantization of {model_path}: its calibration set "
                               f"{inputs_path} cannot be read ({error})") from error
    if len(found) != len(expected) or any(
            size is not None and size != got for size, got in zip(expected, found, strict=True)):
        shown = ", ".join("None" if size is None else str(size) for size in expected)
        raise ModelFormatError(
            f"quantization of {model_path}: its calibration set {inputs_path} holds "
            f"samples of shape {tuple(found)}, the model takes ({shown})")
    indices = list(range(min(count, CALIBRATION_SAMPLES)))

    def samples():
        images = read_test_images(inputs_path, indices)
        for image in images:
            yield [np.ascontiguousarray(image[None], dtype=np.float32)]

    return samples


def converter_settings(settings: dict, model_path, model, inputs_path) -> dict:
    """The TFLite converter's attributes for ``settings`` (Keras' export sets each)."""
    import tensorflow as tf

    if settings["mode"] == "float16":
        return {"optimizations": [tf.lite.Optimize.DEFAULT],
                "target_spec": {"supported_types": [tf.float16]}}
    if settings["mode"] == "dynamic_range":
        return {"optimizations": [tf.lite.Optimize.DEFAULT]}
    if inputs_path is None:
        raise ConfigError(f"full-integer quantization of {model_path} needs its inputs to "
                          "calibrate on")
    types = {"float32": tf.float32, "int8": tf.int8}
    return {"optimizations": [tf.lite.Optimize.DEFAULT],
            "representative_dataset": representative_dataset(model_path, model, inputs_path),
            "target_spec": {"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]},
            "inference_input_type": types[settings["inference_input_type"]],
            "inference_output_type": types[settings["inference_output_type"]]}


def quantize_model(model_path, out, settings: dict | None = None, inputs_path=None,
                   named=config_key) -> dict:
    """Quantize the float Keras model at ``model_path`` with the TFLite converter into the
    .tflite ``out`` (written atomically): ``settings`` (SETTINGS; the defaults where left
    out; a wrong one named by ``named``), full-integer quantization calibrated on
    ``inputs_path``, the model's inputs. Returns the settings used, defaults filled in."""
    import numpy as np

    from bitdrift.backends.keras.export import ExportError, load_model, write_export
    from bitdrift.formats import detect

    settings = checked_settings(settings, named)
    if detect(model_path) != "keras":
        raise ModelFormatError(f"{model_path}: LiteRT's quantizer takes a Keras model")
    keras, model = load_model(model_path)
    converter = converter_settings(settings, model_path, model, inputs_path)
    # Keras exports a called model (an open axis is called at 1, as the export does)
    model(np.zeros((1, *(size or 1 for size in model.inputs[0].shape[1:])), np.float32))
    layers = [layer.name for layer in model.layers]
    try:
        write_export(model, "tflite", out, model_path, layers, **converter)
    except ExportError as error:
        raise ModelFormatError(_failure(model_path, settings["mode"], layers, error)) \
            from error
    return settings


def _failure(model_path, mode: str, layers: list[str], error: Exception) -> str:
    """One line: the converter's reason (its last ``error:`` line that is not a source
    location: MLIR puts the op's location first, the reason last) and the Keras layer
    whose scope it names (TensorFlow's scope is the layer's name, a ``_N`` suffix added
    where the model is traced again)."""
    import re

    text = str(error.__cause__ or error)
    reasons = [line.split("error:", 1)[1].strip() for line in text.splitlines()
               if "error:" in line and not line.split("error:", 1)[1].strip().startswith("loc(")]
    reason = (reasons[-1] if reasons else str(error)).split(". ")[0][:300]
    named = [layer for layer in layers
             if re.search(rf"/{re.escape(layer)}(_\d+)?/", text)]
    where = f"layer {max(named, key=len)!r}" if named else "the model"
    return (f"{model_path}: LiteRT's quantizer ({mode}) cannot convert {where} to "
            f"{'int8 ops' if mode == 'full_integer' else 'its ops'} ({reason})")


def tensor_types(path) -> dict:
    """What the .tflite at ``path`` computes in, read from the file by LiteRT's interpreter
    (bitdrift.formats.tflite.load_interpreter; nothing run): {op name: sorted dtype names
    of its inputs and outputs (-1, an absent optional input, left out)} of every node."""
    import numpy as np

    from bitdrift.formats.tflite import load_interpreter

    loaded = load_interpreter(path)
    dtypes = {int(detail["index"]): np.dtype(detail["dtype"]).name
              for detail in loaded.get_tensor_details()}
    found: dict[str, set] = {}
    for op in loaded._get_ops_details():  # LiteRT's only listing of its nodes
        tensors = [int(tensor) for tensor in (*op["inputs"], *op["outputs"])
                   if int(tensor) >= 0]
        found.setdefault(op["op_name"], set()).update(dtypes[tensor] for tensor in tensors)
    return {name: sorted(types) for name, types in found.items()}
