"""ONNX Runtime's own quantizer as a step: a float ONNX model to a quantized one
(``onnxruntime.quantization``), written atomically, for ONNX Runtime to run as a user's
ONNX file. Dynamic quantization (``quantize_dynamic``: weights quantized ahead,
activations by DynamicQuantizeLinear at run time, MatMulInteger and ConvInteger nodes) or
static (``quantize_static``: activations' scales calibrated on the model's inputs, as QDQ
pairs around float ops or as QOperator nodes such as QLinearMatMul), with the settings
users switch. Each setting's default is ONNX Runtime's own."""

from __future__ import annotations

from pathlib import Path

from bitdrift.errors import ConfigError, ModelFormatError
from bitdrift.runtimes import QUANTIZATION_METHODS, QUANTIZATION_SETTINGS

# {setting: (its values, ONNX Runtime's default)}; the settings each method takes
SETTINGS, METHODS = QUANTIZATION_SETTINGS, QUANTIZATION_METHODS
# each setting's help, for `bitdrift quantize --tool onnxruntime`
HELP = {
    "method": "dynamic: activations quantized at run time; static: calibrated on --inputs",
    "weight_type": "the weights' 8-bit type",
    "activation_type": "static: the activations' 8-bit type (dynamic's are uint8)",
    "per_channel": "a weight scale per output channel",
    "reduce_range": "7-bit weights",
    "format": "static: QDQ pairs around the float ops, or QOperator nodes (QLinearMatMul)",
    "calibrate_method": "static: how the activations' ranges are calibrated",
}
CALIBRATION_BATCH = 16  # samples a calibration step feeds, where the batch axis is free


def config_key(key: str) -> str:
    return f"quantization.{key}"


def checked_settings(settings: dict, named=config_key) -> dict:
    """``settings`` with ONNX Runtime's defaults filled in; ConfigError in one line naming
    the setting (``named(key)``: a config key, a command's option) for an unknown key, a
    value not allowed, or a static-only setting given to dynamic quantization."""
    settings = dict(settings or {})
    method = settings.get("method", SETTINGS["method"][1])
    if method not in SETTINGS["method"][0]:
        raise ConfigError(f"{named('method')}: {method!r} is none of "
                          f"{', '.join(SETTINGS['method'][0])}")
    for key, value in settings.items():
        if key not in SETTINGS:
            raise ConfigError(f"{named(key)}: unknown quantization setting (known: "
                              f"{', '.join(SETTINGS)})")
        if key not in METHODS[method]:
            raise ConfigError(f"{named(key)}: a setting of static quantization only, not "
                              f"of {method}")
        allowed = SETTINGS[key][0]
        if value not in allowed or type(value) is not type(allowed[0]):
            raise ConfigError(f"{named(key)}: {value!r} is none of "
                              f"{', '.join(map(repr, allowed))}")
    return {key: settings.get(key, SETTINGS[key][1]) for key in METHODS[method]}


def calibration_batches(model_path, inputs_path, batch: int = CALIBRATION_BATCH,
                        step: str = "static quantization"):
    """The model's inputs file (a .npy, or a .npz of one array per input) as feeds
    {input name: array} of ``batch`` samples each (the model's own batch size where it
    fixes one), for a quantizer's calibration (``step`` names it in errors). The inputs
    are checked against the model first: a mismatch is one line naming the model, the
    file and why."""
    import numpy as np

    from bitdrift.formats import check_inputs
    from bitdrift.inputs.datasets import NamedInputs, read_inputs, sample_count

    try:
        signature = check_inputs(inputs_path, model_path, "onnx")
    except ModelFormatError as error:
        raise ModelFormatError(f"{step} of {model_path}: its calibration set does not fit "
                               f"({error})") from error
    inputs = read_inputs(inputs_path)
    fixed = signature[0].shape[0] if signature and signature[0].shape else None
    batch = fixed or batch
    count = sample_count(inputs) // batch * batch if fixed else sample_count(inputs)
    if count == 0:
        raise ModelFormatError(f"{step} of {model_path}: {inputs_path} holds "
                               f"{sample_count(inputs)} samples, fewer than the model's fixed "
                               f"batch of {fixed}")
    for start in range(0, count, batch):
        rows = inputs[start:start + batch]
        if isinstance(rows, NamedInputs):
            yield {name: np.ascontiguousarray(array) for name, array in rows.items()}
        else:
            yield {signature[0].name: np.ascontiguousarray(rows)}


def calibration_reader(model_path, inputs_path):
    """An onnxruntime CalibrationDataReader over the model's inputs file: batches of
    CALIBRATION_BATCH samples (calibration_batches; the inputs checked first)."""
    from onnxruntime.quantization import CalibrationDataReader

    first = list(calibration_batches(model_path, inputs_path))  # checked here, not lazily

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._batches = iter(first)

        def get_next(self):
            return next(self._batches, None)

        def rewind(self):
            self._batches = iter(first)

    return Reader()


def quantize_model(model_path, out, settings: dict | None = None, inputs_path=None,
                   named=config_key) -> dict:
    """Quantize the float ONNX model at ``model_path`` with ONNX Runtime's quantizer into
    ``out`` (written atomically): ``settings`` (SETTINGS; ORT's defaults where left out;
    a wrong one named by ``named``), static quantization calibrated on ``inputs_path``,
    the model's inputs. Returns the settings used, defaults filled in."""
    from bitdrift.atomic import atomic_output
    from bitdrift.backends.exported import common as exported
    from bitdrift.backends.exported.onnxruntime import NAME, PIN
    from bitdrift.formats import detect

    settings = checked_settings(settings, named)
    if detect(model_path) != "onnx":
        raise ModelFormatError(f"{model_path}: ONNX Runtime's quantizer takes an ONNX model")
    exported.require("onnxruntime", NAME, PIN)
    from onnxruntime import quantization

    common = {"per_channel": settings["per_channel"],
              "reduce_range": settings["reduce_range"],
              "weight_type": getattr(quantization.QuantType, settings["weight_type"])}
    if settings["method"] == "static" and inputs_path is None:
        raise ConfigError(f"static quantization of {model_path} needs its inputs to "
                          "calibrate on")
    reader = calibration_reader(model_path, inputs_path) \
        if settings["method"] == "static" else None
    with atomic_output(out) as tmp:
        try:
            if reader is None:
                quantization.quantize_dynamic(str(model_path), str(tmp), **common)
            else:
                quantization.quantize_static(
                    str(model_path), str(tmp), reader,
                    quant_format=getattr(quantization.QuantFormat, settings["format"]),
                    activation_type=getattr(quantization.QuantType,
                                            settings["activation_type"]),
                    calibrate_method=getattr(quantization.CalibrationMethod,
                                             settings["calibrate_method"]),
                    **common)
        except (ValueError, RuntimeError, KeyError, TypeError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ModelFormatError(f"{model_path}: ONNX Runtime's quantizer cannot quantize "
                                   f"it ({settings['method']}: {first})") from error
        if not Path(tmp).is_file():
            raise ModelFormatError(f"{model_path}: ONNX Runtime's quantizer wrote no model")
    return settings
