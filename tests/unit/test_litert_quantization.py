"""LiteRT's own quantizer as a step (bitdrift.backends.exported.litert_quantization): the
example Keras CNN quantized by the TFLite converter in each mode, run through bitdrift's
LiteRT devices (XNNPACK, the built-in kernels, the reference kernels), gives the bits of
the same file run directly in LiteRT's interpreter with that resolver on the same
batches; the full-integer file's summing ops are int8 in the file itself; a calibration
set of the wrong shape, an unknown setting, an op without an int8 kernel and an int8-input
file on a device are one line each."""

import numpy as np
import pytest

from bitdrift.backends.exported.litert_quantization import (
    checked_settings,
    quantize_model,
    tensor_types,
)
from bitdrift.cli import main
from bitdrift.config import validate_config
from bitdrift.errors import ConfigError, InferenceError, ModelFormatError
from bitdrift.inputs.examples import keras_cnn
from bitdrift.record.reader import Record
from bitdrift.run.inference import infer

SAMPLES = list(range(6))
BATCH = 2
RESOLVERS = {"xnnpack": "AUTO", "builtin": "BUILTIN_WITHOUT_DEFAULT_DELEGATES",
             "reference": "BUILTIN_REF"}  # LiteRT's names, written out here
MODES = ("full_integer", "dynamic_range", "float16")
SUMMING = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("litert_quantization")
    keras_cnn.write(folder / "cnn.keras", folder / "cnn.npy", samples=len(SAMPLES))
    for mode in MODES:
        assert quantize_model(folder / "cnn.keras", folder / f"{mode}.tflite",
                              {"mode": mode}, folder / "cnn.npy") \
            == checked_settings({"mode": mode})
    return folder


@pytest.fixture(scope="module")
def float_outputs(models):
    """The float Keras model's outputs on the example's inputs (Keras, float32), run once."""
    return run_directly_keras(models / "cnn.keras", np.load(models / "cnn.npy"))


def run_directly(path, inputs, resolver):
    from ai_edge_litert import interpreter

    loaded = interpreter.Interpreter(
        model_path=str(path), num_threads=1,
        experimental_op_resolver_type=getattr(interpreter.OpResolverType,
                                              RESOLVERS[resolver]))
    runner = loaded.get_signature_runner()
    (name,) = runner.get_input_details()
    return np.concatenate([next(iter(runner(**{name: inputs[start:start + BATCH]}).values()))
                           for start in range(0, len(inputs), BATCH)])


def run_as_device(path, inputs_path, out, resolver, checked=None):
    """The device's record of ``path`` (its job, as the workflow runs it: the config
    checked on ``checked``, the file a quantized model's, made after the config is read)."""
    device = {"accelerator": "cpu", "backend": "litert", "threads": 1, "batch_size": BATCH,
              "op_resolver": resolver}
    config = validate_config({"models": {"q": {"file": str(checked or path),
                                               "inputs": str(inputs_path)}},
                              "devices": {"lite": device}, "samples": SAMPLES})
    with open(out.with_suffix(".log"), "w") as log:
        infer(model_name="q", device_name="lite", device=config["devices"]["lite"],
              model_path=path, dataset_path=inputs_path, samples=SAMPLES, out=out,
              layers=True, kernels=False, log=log)
    with Record(out) as record:
        return np.stack([record.deployed_output(sample).values[0] for sample in SAMPLES]), \
            record.observer_check


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("resolver", sorted(RESOLVERS))
def test_the_quantized_file_runs_on_the_device_as_in_litert_directly(models, mode, resolver,
                                                                      float_outputs):
    path, inputs = models / f"{mode}.tflite", np.load(models / "cnn.npy")
    direct = run_directly(path, inputs, resolver)
    recorded, observed = run_as_device(path, models / "cnn.npy",
                                       models / f"{mode}_{resolver}.h5", resolver)
    assert recorded.dtype == direct.dtype == np.float32 and direct.shape == (6, 10)
    assert np.array_equal(recorded.view(np.uint32), direct.view(np.uint32))
    assert observed["equal"]
    # and not the float model's outputs (Keras, float32): near them
    floats = float_outputs
    assert not np.array_equal(floats, direct)
    assert np.corrcoef(floats.ravel(), direct.ravel())[0, 1] > 0.95


def run_directly_keras(path, inputs):
    from bitdrift.backends.keras.export import load_model

    keras, model = load_model(path)
    return keras.ops.convert_to_numpy(model(inputs, training=False))


def test_each_mode_writes_the_types_it_names_in_the_file(models):
    """Read from the file (no run): full-integer's summing ops are int8 with int32 biases,
    a QUANTIZE in and a DEQUANTIZE out (float32 at the edges); dynamic range's
    FULLY_CONNECTED has int8 weights and float32 activations; float16's weights are
    float16, dequantized to the float32 its ops compute in."""
    full = tensor_types(models / "full_integer.tflite")
    for op in SUMMING:
        assert full[op] == ["int32", "int8"], (op, full[op])
    assert full["QUANTIZE"] == full["DEQUANTIZE"] == ["float32", "int8"]
    assert not any("float32" in types for op, types in full.items()
                   if op not in ("QUANTIZE", "DEQUANTIZE")), full
    dynamic = tensor_types(models / "dynamic_range.tflite")
    assert dynamic["FULLY_CONNECTED"] == ["float32", "int8"]
    # XNNPACK takes the int8 nodes (its QS8 operators), the built-in resolver none
    from ai_edge_litert import interpreter

    from bitdrift.backends.exported.litert import _delegated

    for resolver, taken in (("AUTO", set(SUMMING)), ("BUILTIN_WITHOUT_DEFAULT_DELEGATES",
                                                     set())):
        loaded = interpreter.Interpreter(
            model_path=str(models / "full_integer.tflite"), num_threads=1,
            experimental_op_resolver_type=getattr(interpreter.OpResolverType, resolver))
        runner = loaded.get_signature_runner()
        (name,) = runner.get_input_details()
        runner(**{name: np.load(models / "cnn.npy")[:1]})
        details = loaded._get_ops_details()
        delegated = {op["op_name"] for op in details if int(op["index"]) in _delegated(details)}
        assert set(SUMMING) & delegated == taken, (resolver, delegated)
    half = tensor_types(models / "float16.tflite")
    assert half["DEQUANTIZE"] == ["float16", "float32"]
    assert all(half[op] == ["float32"] for op in SUMMING)


def test_int8_edges_give_an_int8_file_that_a_device_cannot_feed(models, tmp_path):
    """inference_input_type/output_type int8: the file's own input and output are int8;
    the model's float inputs do not fit it: the config says so where the file exists
    (config key and dtypes), and a device's job, where it is made later (the workflow's
    quantized model), fails in one line naming the file and the dtypes."""
    path = tmp_path / "edges.tflite"
    settings = {"inference_input_type": "int8", "inference_output_type": "int8"}
    assert quantize_model(models / "cnn.keras", path, settings, models / "cnn.npy") \
        == {"mode": "full_integer", **settings}
    types = tensor_types(path)
    assert "QUANTIZE" not in types and "DEQUANTIZE" not in types
    assert not any("float32" in found for found in types.values()), types
    with pytest.raises(ConfigError) as raised:
        run_as_device(path, models / "cnn.npy", tmp_path / "edges.h5", "xnnpack")
    message = str(raised.value)
    assert message.startswith("config key models.q.inputs: ") and "\n" not in message
    assert "edges.tflite" in message and "float32" in message and "int8" in message
    with pytest.raises((InferenceError, ModelFormatError)) as raised:
        run_as_device(path, models / "cnn.npy", tmp_path / "edges.h5", "xnnpack",
                      checked=models / "full_integer.tflite")
    message = str(raised.value)
    assert "\n" not in message and "edges.tflite" in message and "int8" in message
    assert not (tmp_path / "edges.h5").exists()


def test_a_calibration_set_of_the_wrong_shape_is_one_line_and_leaves_no_file(models):
    wrong = models / "wrong.npy"
    np.save(wrong, np.zeros((6, 16, 16, 3), np.float32))  # the CNN takes (32, 32, 3)
    out = models / "wrong" / "q.tflite"
    with pytest.raises(ModelFormatError) as raised:
        quantize_model(models / "cnn.keras", out, {}, wrong)
    message = str(raised.value)
    assert "\n" not in message and "cnn.keras" in message and "wrong.npy" in message
    assert "(16, 16, 3)" in message and "(32, 32, 3)" in message
    assert not out.exists() and (not out.parent.exists() or not any(out.parent.iterdir()))


def test_an_op_the_int8_op_set_lacks_is_one_line_naming_the_layer(models, tmp_path):
    """An LSTM's TensorFlow loop (TensorList ops): no builtin op of the int8 op set, which
    full-integer quantization allows alone (the float export takes TensorFlow's own ops)."""
    from bitdrift.backends.keras.export import load_model

    keras, _ = load_model(models / "cnn.keras")
    inputs = keras.Input(shape=(5, 8))
    keras.Model(inputs, keras.layers.LSTM(4, name="recurrent")(inputs)).save(
        tmp_path / "lstm.keras")
    np.save(tmp_path / "lstm.npy", np.ones((4, 5, 8), np.float32))
    with pytest.raises(ModelFormatError) as raised:
        quantize_model(tmp_path / "lstm.keras", tmp_path / "lstm.tflite", {},
                       tmp_path / "lstm.npy")
    message = str(raised.value)
    assert "\n" not in message and "lstm.keras" in message and "'recurrent'" in message
    assert "int8" in message and "tensor list" in message.lower()
    assert not (tmp_path / "lstm.tflite").exists()


@pytest.mark.parametrize("settings,named", [
    ({"mdoe": "float16"}, "quantization.mdoe"),
    ({"mode": "int4"}, "quantization.mode"),
    ({"mode": "float16", "inference_input_type": "int8"}, "quantization.inference_input_type"),
    ({"inference_output_type": "uint8"}, "quantization.inference_output_type"),
])
def test_a_wrong_setting_is_named(models, settings, named, tmp_path):
    with pytest.raises(ConfigError, match=named):
        quantize_model(models / "cnn.keras", tmp_path / "q.tflite", settings,
                       models / "cnn.npy")
    assert not (tmp_path / "q.tflite").exists()


def test_full_integer_without_inputs_and_a_model_of_another_format_are_refused(models,
                                                                               tmp_path):
    with pytest.raises(ConfigError, match="needs its inputs"):
        quantize_model(models / "cnn.keras", tmp_path / "q.tflite", {})
    with pytest.raises(ModelFormatError, match="takes a Keras model"):
        quantize_model(models / "full_integer.tflite", tmp_path / "q.tflite", {},
                       models / "cnn.npy")
    assert list(tmp_path.iterdir()) == []


def test_the_quantize_command(models, tmp_path, capsys):
    out = tmp_path / "f16.tflite"
    assert main(["quantize", "--tool", "litert", "--model-file", str(models / "cnn.keras"),
                 "--out", str(out), "--mode", "float16"]) == 0
    assert "mode float16" in capsys.readouterr().out
    assert tensor_types(out) == tensor_types(models / "float16.tflite")
    assert main(["quantize", "--tool", "litert", "--model-file", str(models / "cnn.keras"),
                 "--out", str(tmp_path / "x.tflite"), "--weight-type", "QUInt8"]) == 2
    error = capsys.readouterr().err.strip()
    assert "--weight-type" in error and "\n" not in error
    assert not (tmp_path / "x.tflite").exists()


def test_calibrated_on_a_prepared_dataset_the_file_runs_on_its_test_images(models, tmp_path):
    """The preset's way: the float Keras model reads a dataset (digits, embedded), so its
    quantized file is calibrated on the test images and run on them, as LiteRT directly
    gives on those images; a dataset of other images is one line naming both shapes."""
    import h5py

    from bitdrift.inputs.datasets import load_digits, write_dataset

    digits = tmp_path / "digits.h5"
    write_dataset(load_digits(), "digits", "digits", digits)
    path = tmp_path / "digits_int8.tflite"
    quantize_model(models / "cnn.keras", path, {}, digits)
    with h5py.File(digits, "r") as handle:
        images = handle["x_test"][:len(SAMPLES)].astype(np.float32)
    direct = run_directly(path, images, "xnnpack")
    recorded, observed = run_as_device(path, digits, tmp_path / "digits.h5.record.h5",
                                       "xnnpack")
    assert np.array_equal(recorded.view(np.uint32), direct.view(np.uint32))
    # not the calibration on the example's own inputs: other scales, other outputs
    assert not np.array_equal(run_directly(models / "full_integer.tflite", images, "xnnpack"),
                              direct)
    small = tmp_path / "small.h5"
    write_dataset(load_digits(image_size=16), "digits", "digits", small)
    with pytest.raises(ModelFormatError) as raised:
        quantize_model(models / "cnn.keras", tmp_path / "small.tflite", {}, small)
    message = str(raised.value)
    assert "\n" not in message and "(16, 16, 3)" in message and "(32, 32, 3)" in message
