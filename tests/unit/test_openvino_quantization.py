"""NNCF's post-training quantization as a step (tool openvino,
bitdrift.backends.exported.openvino_quantization): the QDQ ONNX file it writes, run
through bitdrift's OpenVINO device (every layer recorded, fresh processes, the compiled
graph traced), gives the bits of the same file compiled directly in OpenVINO on the same
batches; OpenVINO's CPU plugin runs it in int8 (its runtime graph's u8/i8 nodes, also in
the record's kernels); a calibration set of the wrong shape, a model NNCF refuses (ONNX
opset below 10), a node to ignore that the model lacks and a wrong setting are one line
each, and leave no file; a mixed-preset CNN (asymmetric activations) on a device whose CPU
computes in bf16 is refused by OpenVINO's CPU plugin, in one line naming the model, the
device and why."""

import numpy as np
import onnx
import pytest

from bitdrift.backends.exported.openvino import compile_settings
from bitdrift.backends.exported.openvino_quantization import checked_settings, quantize_model
from bitdrift.cli import main
from bitdrift.config import validate_config
from bitdrift.errors import ConfigError, InferenceError, ModelFormatError
from bitdrift.inputs.examples import onnx_cnn, onnx_transformer
from bitdrift.record.reader import Record
from bitdrift.run.inference import infer

SAMPLES = list(range(6))
BATCH = 2
DEVICE = {"accelerator": "cpu", "backend": "openvino", "threads": 1, "batch_size": BATCH}
CASES = {
    "cnn_performance": ("cnn", {"target_device": "CPU"}),
    "cnn_full_bias_correction": ("cnn", {"fast_bias_correction": False, "subset_size": 4}),
    "encoder_transformer": ("encoder", {"model_type": "transformer", "target_device": "CPU"}),
}
INT8 = {"u8", "i8"}
PRODUCTS = {"Convolution", "FullyConnected", "MatMul"}  # OpenVINO's layer types


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as cpuinfo:
        return set(next((line for line in cpuinfo if line.startswith(("flags", "Features"))),
                        "").split())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nncf")
    onnx_transformer.write(folder / "encoder.onnx", folder / "encoder.npy", samples=6)
    onnx_cnn.write(folder / "cnn.onnx", folder / "cnn.npy", samples=6)
    return folder


def compiled_directly(path):
    import openvino as ov

    core = ov.Core()
    return core.compile_model(core.read_model(str(path)), "CPU", compile_settings(DEVICE))


def run_directly(path, inputs):
    compiled = compiled_directly(path)
    return np.concatenate([compiled(inputs[start:start + BATCH])[compiled.outputs[0]]
                           for start in range(0, len(inputs), BATCH)])


def run_as_device(path, inputs_path, out):
    config = validate_config({"models": {"q": {"file": str(path), "inputs": str(inputs_path)}},
                              "devices": {"ov": DEVICE}, "samples": SAMPLES})
    with open(out.with_suffix(".log"), "w") as log:
        infer(model_name="q", device_name="ov", device=config["devices"]["ov"],
              model_path=path, dataset_path=inputs_path, samples=SAMPLES, out=out,
              layers=True, kernels=True, log=log)
    with Record(out) as record:
        outputs = np.stack([record.deployed_output(sample).values[0] for sample in SAMPLES])
        return outputs, record.observer_check, record.kernels


def runtime_nodes(path):
    """(layer type, primitive, runtime precision) of each node OpenVINO's CPU plugin
    compiled the file into, read here from its runtime graph."""
    nodes = []
    for op in compiled_directly(path).get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        nodes.append(tuple(info[key].astype(str) if key in info else ""
                           for key in ("layerType", "primitiveType", "runtimePrecision")))
    return nodes


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_quantized_file_runs_on_the_device_as_in_openvino_directly(models, case):
    model, settings = CASES[case]
    source, inputs_path = models / f"{model}.onnx", models / f"{model}.npy"
    out = models / f"{case}.onnx"
    used = quantize_model(source, out, settings, inputs_path)
    assert used == checked_settings(settings)
    assert used["preset"] == settings.get(
        "preset", "mixed" if model == "encoder" else "performance")  # NNCF's default
    inputs = np.load(inputs_path)
    direct = run_directly(out, inputs)
    recorded, observed, kernels = run_as_device(out, inputs_path, models / f"{case}.h5")
    assert recorded.dtype == direct.dtype == np.float32
    assert np.array_equal(recorded.view(np.uint32), direct.view(np.uint32))
    # the observer check, recorded: marking every node's output may undo OpenVINO's int8
    # fusions, so the instrumented graph's output may differ from the deployed file's
    assert observed["equal"] == all(observed["samples"].values())
    # a QDQ file: 8-bit weights and QuantizeLinear/DequantizeLinear pairs
    quantized = onnx.load(str(out))
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in quantized.graph.node}
    assert any(t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8)
               for t in quantized.graph.initializer)
    # the CPU plugin's products run in int8 (x86 since AVX2 has int8 kernels)
    nodes = runtime_nodes(out)
    int8 = [node for node in nodes if node[0] in PRODUCTS and node[2] in INT8]
    flags = cpu_flags()
    if "avx2" in flags:
        assert int8, nodes
        if "amx_int8" in flags and model == "cnn":  # oneDNN's AMX int8 convolution
            assert any(kind == "Convolution" and "amx" in primitive
                       for kind, primitive, _ in int8), int8
    # the record's kernels say so, per layer (of the graph with every output marked):
    # products of runtime precision u8/i8
    calls = [part for layer in kernels["layers"].values()
             for part in layer["signature"].split("+")]
    recorded_int8 = [call for call in calls if call.split(":")[0][len("ov "):] in PRODUCTS
                     and call.rsplit(" ", 1)[-1] in INT8]
    if "avx2" in flags:
        assert recorded_int8, calls
    # and not the float model: its outputs differ, near them
    floats = run_directly(source, inputs)
    assert not np.array_equal(floats, direct)
    assert np.corrcoef(floats.ravel(), direct.ravel())[0, 1] > 0.9


def test_a_calibration_set_of_the_wrong_shape_is_one_line_and_leaves_no_file(models):
    wrong = models / "wrong.npy"
    np.save(wrong, np.zeros((6, 8, 31), np.float32))  # the encoder takes (?, 8, 32)
    out = models / "wrong" / "nncf.onnx"
    with pytest.raises(ModelFormatError) as raised:
        quantize_model(models / "encoder.onnx", out, {}, wrong)
    message = str(raised.value)
    assert "\n" not in message and "encoder.onnx" in message and "calibration" in message
    assert "(samples, 8, 31)" in message and "(?, 8, 32)" in message
    assert not out.exists() and (not out.parent.exists() or not any(out.parent.iterdir()))


def test_a_model_nncf_refuses_is_one_line_and_leaves_no_file(models, tmp_path):
    """NNCF's ONNX backend quantizes opset 10 and later: the CNN declared opset 9."""
    model = onnx.load(str(models / "cnn.onnx"))
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = 9
    old = tmp_path / "old_opset.onnx"
    onnx.save(model, str(old))
    out = tmp_path / "q.onnx"
    with pytest.raises(ModelFormatError) as raised:
        quantize_model(old, out, {}, models / "cnn.npy")
    message = str(raised.value)
    assert "\n" not in message and "old_opset.onnx" in message and "opset 9" in message
    assert not out.exists()


def test_an_ignored_node_the_model_lacks_is_one_line(models, tmp_path):
    out = tmp_path / "q.onnx"
    with pytest.raises(ModelFormatError) as raised:
        quantize_model(models / "cnn.onnx", out, {"ignored_scope": {"names": ["no_such"]}},
                       models / "cnn.npy")
    message = str(raised.value)
    assert "\n" not in message and "cnn.onnx" in message and "no_such" in message
    assert not out.exists()


@pytest.mark.parametrize("settings,named", [
    ({"preset": "fast"}, "quantize.preset"),
    ({"subset_size": 0}, "quantize.subset_size"),
    ({"fast_bias_correction": "yes"}, "quantize.fast_bias_correction"),
    ({"method": "static"}, "quantize.method"),  # ONNX Runtime's, not NNCF's
    ({"ignored_scope": {"layers": ["x"]}}, "quantize.ignored_scope.layers"),
])
def test_a_wrong_setting_is_named(models, settings, named, tmp_path):
    with pytest.raises(ConfigError, match=named):
        quantize_model(models / "cnn.onnx", tmp_path / "q.onnx", settings, models / "cnn.npy")
    assert not (tmp_path / "q.onnx").exists()


def test_the_quantize_command(models, tmp_path, capsys):
    """`bitdrift quantize --tool openvino` writes what the library function writes; an ONNX
    Runtime option given to NNCF is named in one line."""
    out = tmp_path / "cli.onnx"
    assert main(["quantize", "--tool", "openvino", "--model-file", str(models / "cnn.onnx"),
                 "--out", str(out), "--inputs", str(models / "cnn.npy"), "--preset", "mixed",
                 "--subset-size", "4", "--fast-bias-correction", "off"]) == 0
    assert "preset mixed" in capsys.readouterr().out
    library = tmp_path / "library.onnx"
    quantize_model(models / "cnn.onnx", library, {"preset": "mixed", "subset_size": 4,
                                                  "fast_bias_correction": False},
                   models / "cnn.npy")
    assert out.read_bytes() == library.read_bytes()
    assert main(["quantize", "--tool", "openvino", "--model-file", str(models / "cnn.onnx"),
                 "--out", str(tmp_path / "x.onnx"), "--inputs", str(models / "cnn.npy"),
                 "--method", "static"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("bitdrift: error: --method: unknown setting") and "\n" not in error
    assert not (tmp_path / "x.onnx").exists()


def test_a_mixed_preset_cnn_on_a_bf16_cpu_is_one_line_naming_model_device_and_why(models):
    """OpenVINO 2026.4's CPU plugin finds no kernel for the CNN with asymmetric (mixed)
    activations where it computes in bf16 (a CPU with AMX-BF16: the hint is honoured);
    a CPU without bf16 ignores the hint, computes in f32 and runs it. ONNX Runtime runs
    the same file either way."""
    import onnxruntime as ort

    out = models / "cnn_mixed.onnx"
    quantize_model(models / "cnn.onnx", out, {"preset": "mixed"}, models / "cnn.npy")
    inputs = np.load(models / "cnn.npy")
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert session.run(None, {"input": inputs[:BATCH]})[0].shape == (BATCH, 10)
    device = {**DEVICE, "inference_precision_hint": "bf16"}
    config = validate_config({"models": {"cnn_mixed": {"file": str(out),
                                                       "inputs": str(models / "cnn.npy")}},
                              "devices": {"ov_bf16": device}, "samples": SAMPLES})
    record = models / "cnn_mixed.h5"

    def run():
        with open(record.with_suffix(".log"), "w") as log:
            infer(model_name="cnn_mixed", device_name="ov_bf16",
                  device=config["devices"]["ov_bf16"], model_path=out,
                  dataset_path=models / "cnn.npy", samples=SAMPLES, out=record,
                  layers=True, kernels=False, log=log)

    flags = cpu_flags()
    if "amx_bf16" in flags:
        with pytest.raises(InferenceError) as raised:
            run()
        message = str(raised.value)
        assert "\n" not in message and "'cnn_mixed'" in message and "'ov_bf16'" in message
        assert "cnn_mixed.onnx" in message and "no suitable implementations" in message.lower()
        assert not record.exists()
    elif not flags & {"avx512_bf16", "avx_ne_convert"}:
        run()  # f32: it runs
        with Record(record) as made:
            assert made.deployed_output(0).values[0].shape == (10,)
