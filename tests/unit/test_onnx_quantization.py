"""ONNX Runtime's own quantizer as a step (bitdrift.backends.exported.onnx_quantization):
each setting's quantized file, run through bitdrift's ONNX Runtime device (every layer
recorded, fresh processes), gives the bits of the same file run directly in
onnxruntime on the same batches; the file holds the integer ops and types asked for; a
calibration set of the wrong shape, an unknown setting and a static quantization without
inputs are one line each, and leave no file. (Recording a dynamic model's layers once
failed the device: DynamicQuantizeLinear's scale, a scalar per batch, was taken for a
layer.)"""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from bitdrift.backends.exported.onnx_quantization import checked_settings, quantize_model
from bitdrift.cli import main
from bitdrift.config import validate_config
from bitdrift.errors import ConfigError, ModelFormatError
from bitdrift.inputs.examples import onnx_cnn, onnx_transformer
from bitdrift.record.reader import Record
from bitdrift.run.inference import infer

SAMPLES = list(range(6))
BATCH = 2  # dynamic quantization's activation scale is the batch's: both runs cut the same
CASES = {
    "dynamic_s8": ("encoder", {"method": "dynamic"}),
    "dynamic_u8": ("encoder", {"method": "dynamic", "weight_type": "QUInt8"}),
    "dynamic_s8_per_channel_reduced": ("encoder", {"per_channel": True,
                                                   "reduce_range": True}),
    "static_qdq": ("encoder", {"method": "static"}),
    "static_qoperator_u8s8": ("encoder", {"method": "static", "format": "QOperator",
                                          "activation_type": "QUInt8"}),
    "static_qdq_per_channel": ("encoder", {"method": "static", "per_channel": True}),
    "dynamic_cnn": ("cnn", {"method": "dynamic"}),
    "static_qoperator_cnn": ("cnn", {"method": "static", "format": "QOperator"}),
}
# the integer op each way writes (ONNX Runtime's quantizer): dynamic MatMulInteger /
# ConvInteger after DynamicQuantizeLinear, QOperator QLinearMatMul / QLinearConv, QDQ
# QuantizeLinear and DequantizeLinear pairs around the float ops
INTEGER_OPS = {"dynamic": {"DynamicQuantizeLinear"}, "QOperator": {"QuantizeLinear"},
               "QDQ": {"QuantizeLinear", "DequantizeLinear"}}
EIGHT_BITS = {"QInt8": np.int8, "QUInt8": np.uint8}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quantization")
    onnx_transformer.write(folder / "encoder.onnx", folder / "encoder.npy", samples=6)
    onnx_cnn.write(folder / "cnn.onnx", folder / "cnn.npy", samples=6)
    return folder


def run_directly(path, inputs):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: inputs[start:start + BATCH]})[0]
                           for start in range(0, len(inputs), BATCH)])


def run_as_device(path, inputs_path, out):
    device = {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1,
              "batch_size": BATCH}
    config = validate_config({"models": {"q": {"file": str(path), "inputs": str(inputs_path)}},
                              "devices": {"ort": device}, "samples": SAMPLES})
    with open(out.with_suffix(".log"), "w") as log:
        infer(model_name="q", device_name="ort", device=config["devices"]["ort"],
              model_path=path, dataset_path=inputs_path, samples=SAMPLES, out=out,
              layers=True, kernels=False, log=log)
    with Record(out) as record:
        outputs = np.stack([record.deployed_output(sample).values[0] for sample in SAMPLES])
        return outputs, record.observer_check, [layer.name for layer in record.layers(0)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_quantized_file_runs_on_the_device_as_in_onnxruntime_directly(models, case):
    model, settings = CASES[case]
    source, inputs_path = models / f"{model}.onnx", models / f"{model}.npy"
    out = models / f"{case}.onnx"
    used = quantize_model(source, out, settings, inputs_path)
    assert used == checked_settings(settings)
    inputs = np.load(inputs_path)
    direct = run_directly(out, inputs)
    recorded, observed, layers = run_as_device(out, inputs_path, models / f"{case}.h5")
    assert recorded.dtype == direct.dtype == np.float32
    assert np.array_equal(recorded.view(np.uint32), direct.view(np.uint32))
    assert observed["equal"] and layers  # every layer recorded, the deployed file the same
    # it is quantized: the integer ops of its way, 8-bit constants of the types asked for
    quantized = onnx.load(str(out))
    ops = {node.op_type for node in quantized.graph.node}
    way = "dynamic" if used["method"] == "dynamic" else used["format"]
    assert INTEGER_OPS[way] <= ops, ops
    eight = {numpy_helper.to_array(t).dtype.type for t in quantized.graph.initializer
             if numpy_helper.to_array(t).dtype.itemsize == 1}
    wanted = {EIGHT_BITS[used["weight_type"]]}
    if used["method"] == "static":
        wanted.add(EIGHT_BITS[used["activation_type"]])
    assert eight == wanted, (eight, wanted)
    weights = [numpy_helper.to_array(t) for t in quantized.graph.initializer
               if numpy_helper.to_array(t).dtype == np.int8 and t.name.endswith("_quantized")]
    if used["reduce_range"]:  # 7-bit weights
        assert weights and all(np.abs(w.astype(int)).max() <= 64 for w in weights)
    if used["per_channel"]:  # a scale per output channel
        scales = [numpy_helper.to_array(t) for t in quantized.graph.initializer
                  if t.name.endswith("_scale")]
        assert any(scale.ndim == 1 and scale.size > 1 for scale in scales)
    # and not the float model: its outputs differ, near them
    floats = run_directly(source, inputs)
    assert not np.array_equal(floats, direct)
    assert np.corrcoef(floats.ravel(), direct.ravel())[0, 1] > 0.9


def test_a_calibration_set_of_the_wrong_shape_is_one_line_and_leaves_no_file(models):
    wrong = models / "wrong.npy"
    np.save(wrong, np.zeros((6, 8, 31), np.float32))  # the encoder takes (?, 8, 32)
    out = models / "wrong" / "static.onnx"
    with pytest.raises(ModelFormatError) as raised:
        quantize_model(models / "encoder.onnx", out, {"method": "static"}, wrong)
    message = str(raised.value)
    assert "\n" not in message and "encoder.onnx" in message and "calibration" in message
    assert "(samples, 8, 31)" in message and "(?, 8, 32)" in message
    assert not out.exists() and (not out.parent.exists() or not any(out.parent.iterdir()))


@pytest.mark.parametrize("settings,named", [
    ({"method": "static", "fromat": "QDQ"}, "quantization.fromat"),
    ({"weight_type": "QInt4"}, "quantization.weight_type"),
    ({"format": "QOperator"}, "quantization.format"),  # a static setting, given to dynamic
    ({"per_channel": "yes"}, "quantization.per_channel"),
])
def test_a_wrong_setting_is_named(models, settings, named, tmp_path):
    with pytest.raises(ConfigError, match=named):
        quantize_model(models / "encoder.onnx", tmp_path / "q.onnx", settings)
    assert not (tmp_path / "q.onnx").exists()


def test_static_quantization_without_inputs_is_refused(models, tmp_path):
    with pytest.raises(ConfigError, match="needs its inputs"):
        quantize_model(models / "encoder.onnx", tmp_path / "q.onnx", {"method": "static"})
    assert list(tmp_path.iterdir()) == []


def test_the_quantize_command(models, tmp_path, capsys):
    """`bitdrift quantize` writes what the library function writes, and names a wrong
    option or a calibration set that does not fit in one line with its exit status."""
    out = tmp_path / "u8.onnx"
    assert main(["quantize", "--model-file", str(models / "encoder.onnx"), "--out", str(out),
                 "--weight-type", "QUInt8", "--per-channel", "on"]) == 0
    assert "weight_type QUInt8" in capsys.readouterr().out
    library = tmp_path / "library.onnx"
    quantize_model(models / "encoder.onnx", library, {"weight_type": "QUInt8",
                                                      "per_channel": True})
    assert [numpy_helper.to_array(t).tobytes() for t in onnx.load(str(out)).graph.initializer] \
        == [numpy_helper.to_array(t).tobytes()
            for t in onnx.load(str(library)).graph.initializer]
    assert main(["quantize", "--model-file", str(models / "encoder.onnx"), "--out",
                 str(tmp_path / "x.onnx"), "--format", "QOperator"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("bitdrift: error: --format: a setting of static") and \
        "\n" not in error
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((4, 32, 8), np.float32))
    assert main(["quantize", "--model-file", str(models / "encoder.onnx"), "--out",
                 str(tmp_path / "y.onnx"), "--method", "static", "--inputs", str(wrong)]) == 3
    error = capsys.readouterr().err.strip()
    assert "encoder.onnx" in error and "calibration" in error and "\n" not in error
    assert not (tmp_path / "x.onnx").exists() and not (tmp_path / "y.onnx").exists()
