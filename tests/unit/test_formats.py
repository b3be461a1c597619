"""Model formats told by content (bitdrift.formats), a model's own inputs checked against
its signature, and a user's ONNX model run as it is on ONNX Runtime and OpenVINO with every
node's output recorded by its own name. The models are built here: Keras (.keras, .h5)
and LiteRT in a TensorFlow process, a torch.export program, ONNX graphs with onnx.helper."""

import json
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bitdrift import formats
from bitdrift.analysis.effective_precision import recheck_record
from bitdrift.config import validate_config
from bitdrift.errors import ConfigError, DatasetError, InferenceError, ModelFormatError
from bitdrift.inputs.examples import onnx_cnn
from bitdrift.record.reader import Record

KERAS_AND_LITERT = """
import sys, keras, tensorflow as tf
from pathlib import Path
out = Path(sys.argv[1])
keras.utils.set_random_seed(0)
inputs = keras.Input((4,), name="input")
model = keras.Model(inputs, keras.layers.Dense(3, name="dense")(inputs))
model.save(out / "model.keras")
model.save(out / "model.h5")
(out / "model.tflite").write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
"""


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """One model of each format: Keras' and LiteRT's saved by TensorFlow in a process of
    its own, a torch.export program, the example ONNX network."""
    import torch

    folder = tmp_path_factory.mktemp("formats")
    subprocess.run([sys.executable, "-c", KERAS_AND_LITERT, str(folder)], check=True,
                   capture_output=True)
    program = torch.export.export(torch.nn.Linear(4, 3).eval(), (torch.ones(2, 4),))
    torch.export.save(program, folder / "model.pt2")
    onnx.save(onnx_cnn.build_model(), folder / "model.onnx")
    return folder


@pytest.mark.parametrize("name, expected", [("model.keras", "keras"), ("model.h5", "keras"),
                                            ("model.onnx", "onnx"), ("model.pt2", "pt2"),
                                            ("model.tflite", "tflite")])
def test_each_format_is_told_by_its_content_not_its_name(model_files, tmp_path, name,
                                                        expected):
    assert formats.detect(model_files / name) == expected
    renamed = tmp_path / "model.bin"  # the extension says nothing
    renamed.write_bytes((model_files / name).read_bytes())
    assert formats.detect(renamed) == expected


def test_signatures_are_read_from_each_file(model_files):
    assert formats.signature(model_files / "model.onnx") == [
        formats.Input("input", (None, *onnx_cnn.INPUT_SHAPE), "float32")]
    assert formats.signature(model_files / "model.keras")[0].shape == (None, 4)
    assert formats.signature(model_files / "model.tflite")[0].shape == (None, 4)
    (pt2,) = formats.signature(model_files / "model.pt2")
    assert pt2.shape == (2, 4) and pt2.dtype == "float32"  # exported with a static batch


def test_a_file_of_no_format_is_one_line_naming_it(tmp_path):
    text = tmp_path / "model.onnx"
    text.write_text("a text file with an .onnx name\n")
    with pytest.raises(ModelFormatError) as error:
        formats.detect(text)
    message = str(error.value)
    assert message.startswith(f"{text}: not a model bitdrift reads") and "\n" not in message
    for what in ("Keras", "ONNX", "torch.export", "LiteRT"):
        assert what in message


@pytest.mark.parametrize("name, said", [("model.onnx", "damaged"),
                                        ("model.keras", "damaged Keras"),
                                        ("model.pt2", "damaged"),
                                        ("model.tflite", "damaged LiteRT")])
def test_a_damaged_file_is_one_line_saying_so(model_files, tmp_path, name, said):
    data = (model_files / name).read_bytes()
    broken = tmp_path / name
    if name == "model.keras":  # a member's bytes changed: its CRC fails
        with zipfile.ZipFile(model_files / name) as archive:
            offset = data.index(archive.read("config.json")[:40])
        broken.write_bytes(data[:offset] + b"X" + data[offset + 1:])
    elif name == "model.pt2":  # the program's description left out
        with zipfile.ZipFile(model_files / name) as source, \
                zipfile.ZipFile(broken, "w") as target:
            for member in source.namelist():
                if "/models/" not in member:
                    target.writestr(member, source.read(member))
    else:
        broken.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError) as error:
        formats.detect(broken)
    assert str(error.value).startswith(str(broken)) and said in str(error.value)
    assert "\n" not in str(error.value)


def write_inputs(path, values):
    np.save(path, values)
    return path


def test_inputs_that_fit_are_accepted_and_any_that_do_not_are_named(model_files, tmp_path):
    model = model_files / "model.onnx"
    good = write_inputs(tmp_path / "good.npy", onnx_cnn.make_inputs(4))
    assert formats.check_inputs(good, model)[0].name == "input"
    nhwc = write_inputs(tmp_path / "nhwc.npy", np.zeros((4, 16, 16, 3), np.float32))
    with pytest.raises(ModelFormatError) as error:
        formats.check_inputs(nhwc, model)
    assert str(error.value) == (f"{nhwc}: inputs of shape (samples, 16, 16, 3) float32, but "
                                f"model {model} takes input 'input' (?, 3, 16, 16) float32")
    doubles = write_inputs(tmp_path / "doubles.npy", np.zeros((4, 3, 16, 16)))
    with pytest.raises(ModelFormatError, match=r"\(samples, 3, 16, 16\) float64, but .* "
                                               r"float32$"):
        formats.check_inputs(doubles, model)
    with pytest.raises(DatasetError, match="samples \\[9\\] beyond"):
        formats.check_inputs(good, model, samples=[0, 9])
    archive = tmp_path / "two.npz"
    np.savez(archive, a=np.zeros((2, 3, 16, 16), np.float32), b=np.zeros(2))
    with pytest.raises(ModelFormatError, match="two.npz: no array for input 'input'; arrays "
                                               "'a', 'b' are no input's .* 'b' \\(samples\\) "
                                               "float64\\)$"):
        formats.check_inputs(archive, model)


def test_inputs_holding_nan_or_inf_are_refused_naming_the_first_sample(model_files, tmp_path):
    values = onnx_cnn.make_inputs(6)
    values[3, 1, 2, 2] = np.nan
    values[5, 0, 0, 0] = -np.inf
    path = write_inputs(tmp_path / "nan.npy", values)
    with pytest.raises(ModelFormatError) as error:
        formats.check_inputs(path, model_files / "model.onnx")
    assert str(error.value).startswith(f"{path}: 2 NaN or Inf values in 2 samples (the "
                                       "first: sample 3); refused")


def config_of(model: dict, samples=(0, 1)) -> dict:
    return {"models": {"mine": model}, "samples": list(samples),
            "devices": {"ort": {"accelerator": "cpu", "backend": "onnxruntime"}}}


def test_the_config_check_reads_the_files_where_they_exist(model_files, tmp_path,
                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    onnx.save(onnx_cnn.build_model(), "cnn.onnx")
    write_inputs(tmp_path / "inputs.npy", onnx_cnn.make_inputs(4))
    write_inputs(tmp_path / "wrong.npy", np.zeros((4, 8), np.float32))
    (tmp_path / "text.onnx").write_text("not a model")
    (tmp_path / "program.pt2").write_bytes((model_files / "model.pt2").read_bytes())
    validate_config(config_of({"file": "cnn.onnx", "inputs": "inputs.npy"}))
    validate_config(config_of({"file": "later.onnx", "inputs": "inputs.npy"}))  # made later
    cases = {
        "models.mine.inputs: wrong.npy: inputs of shape (samples, 8) float32": {
            "file": "cnn.onnx", "inputs": "wrong.npy"},
        "models.mine.file: text.onnx: not a model bitdrift reads": {
            "file": "text.onnx", "inputs": "inputs.npy"},
        "models.mine: a model needs exactly one of 'dataset' or 'inputs'": {
            "file": "cnn.onnx"},
        "models.mine.dataset: cnn.onnx is an ONNX model; give its own `inputs`": {
            "file": "cnn.onnx", "dataset": "digits"},
        "models.mine.inputs: a trained architecture reads its dataset": {
            "architecture": "small_cnn", "inputs": "inputs.npy"},
    }
    for said, model in cases.items():
        config = config_of(model)
        if "dataset" in model:
            config["datasets"] = {"digits": {"source": "digits"}}
        with pytest.raises(ConfigError) as error:
            validate_config(config)
        assert str(error.value).startswith(f"config key {said}"), str(error.value)
    # a .pt2 program with devices of Keras runtimes only
    config = config_of({"file": "program.pt2", "inputs": "inputs.npy"})
    config["devices"] = {"tf": {"accelerator": "cpu", "backend": "tensorflow"}}
    with pytest.raises(ConfigError) as error:
        validate_config(config)
    assert str(error.value).startswith(
        "config key models.mine.file: program.pt2 is a PyTorch torch.export .pt2 archive, "
        "and no device runs it (runtimes that can: torch_export, torch_inductor, "
        "executorch, onnxruntime, openvino, litert)"), str(error.value)
    with pytest.raises(ConfigError, match="samples \\[7\\] beyond"):
        validate_config(config_of({"file": "cnn.onnx", "inputs": "inputs.npy"}, [0, 7]))


DEVICES = {"ort_all": {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1,
                       "graph_optimization_level": "all", "repeats": 2, "batch_size": 4},
           "ort_no_optimizations": {"accelerator": "cpu", "backend": "onnxruntime",
                                    "threads": 1, "graph_optimization_level": "disable_all",
                                    "repeats": 2, "batch_size": 4},
           "openvino_f32": {"accelerator": "cpu", "backend": "openvino", "threads": 1,
                            "inference_precision_hint": "f32", "repeats": 2,
                            "batch_size": 4},
           "torch_eager": {"accelerator": "cpu", "backend": "torch_export", "threads": 1,
                           "repeats": 2, "batch_size": 4},
           "litert_xnnpack": {"accelerator": "cpu", "backend": "litert", "threads": 1,
                              "op_resolver": "xnnpack", "repeats": 1, "batch_size": 4}}


def run_device(folder, device, model="cnn.onnx", inputs="inputs.npy", samples=(0, 1, 5),
               kernels=False):
    from bitdrift.run.inference import infer

    config = validate_config({"models": {"cnn": {"file": str(folder / model),
                                                 "inputs": str(folder / inputs)}},
                              "devices": {device: dict(DEVICES[device])},
                              "samples": list(samples)})
    out = folder / f"{device}.h5"
    infer(model_name="cnn", device_name=device, device=config["devices"][device],
          model_path=folder / model, dataset_path=folder / inputs, samples=list(samples),
          out=out, layers=True, kernels=kernels)
    return out


@pytest.fixture(scope="module")
def onnx_records(tmp_path_factory):
    folder = tmp_path_factory.mktemp("onnx_records")
    onnx_cnn.write(folder / "cnn.onnx", folder / "inputs.npy", samples=8)
    return folder, {device: run_device(folder, device) for device in ONNX_RUNTIME_DEVICES}


ONNX_RUNTIME_DEVICES = ("ort_all", "ort_no_optimizations", "openvino_f32")


def numpy_forward(inputs: np.ndarray) -> dict:
    """The example network in float64 numpy, from its weights: every node's output."""
    weights = {tensor.name: numpy_helper.to_array(tensor).astype(np.float64)
               for tensor in onnx_cnn.build_model().graph.initializer}
    x = inputs.astype(np.float64)
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    patches = np.stack([padded[:, :, i:i + 16, j:j + 16] for i in range(3) for j in range(3)],
                       axis=-1)  # (n, c, 16, 16, 9)
    kernel = weights["conv.weight"].reshape(8, 3, 9)
    conv = np.einsum("nchwk,ock->nohw", patches, kernel) + weights["conv.bias"][:, None, None]
    relu = np.maximum(conv, 0)
    pool = relu.reshape(len(x), 8, 8, 2, 8, 2).max(axis=(3, 5))
    flat = pool.reshape(len(x), -1)
    fc1 = flat @ weights["fc1.weight"].T + weights["fc1.bias"]
    fc1_relu = np.maximum(fc1, 0)
    matmul = fc1_relu @ weights["fc2.weight"]
    return {"conv": conv, "conv_relu": relu, "pool": pool, "flatten": flat, "fc1": fc1,
            "fc1_relu": fc1_relu, "fc2_matmul": matmul, "logits": matmul + weights["fc2.bias"]}


def test_every_node_output_is_recorded_by_its_name_and_computes_the_model(onnx_records):
    """Each device records the model's node outputs by their names, each within float32
    of numpy's; ONNX Runtime with its optimisations records those of the graph it
    deploys (its Gemm+Relu and MatMul+Add fusions leave ``fc1`` and ``fc2_matmul``
    unmapped), and every device's final output is its deployed model's."""
    folder, records = onnx_records
    inputs = np.load(folder / "inputs.npy")
    truth = numpy_forward(inputs[[0, 1, 5]])
    classes = dict(zip(truth, ["Conv", "Relu", "MaxPool", "Flatten", "Gemm", "Relu",
                               "MatMul", "Add"], strict=True))
    for device, path in records.items():
        with Record(path) as record:
            layers = [info for info in record.layers(0) if not info.final]
            unmapped = record.json_attr("unmapped_layers", list, [])
            assert [info.name for info in layers] == \
                [name for name in truth if name not in unmapped], device
            assert set(unmapped) <= set(truth)
            if device == "ort_all":
                assert {"fc1", "fc2_matmul"} <= set(unmapped)
            else:
                assert unmapped == [], device
            assert [info.class_name for info in layers] == \
                [classes[info.name] for info in layers]
            for row, sample in enumerate((0, 1, 5)):
                for name, values in truth.items():
                    if name in unmapped:
                        continue
                    recorded = record.tensor(sample, name).values
                    assert recorded.shape[0] == 2  # repeats
                    np.testing.assert_allclose(recorded[0], values[row], rtol=1e-4,
                                               atol=1e-5, err_msg=f"{device} {name}")
                assert np.array_equal(record.tensor(sample, "output").values[0],
                                      record.tensor(sample, "logits").values[0])
            assert record.observer_check["equal"]
            assert record.attr("input_sha256")


def test_the_effective_precision_recheck_reads_gemm_matmul_and_conv_nodes(onnx_records):
    folder, records = onnx_records
    with Record(records["ort_no_optimizations"]) as record:
        found = recheck_record(record, folder / "cnn.onnx", folder / "inputs.npy")
        assert found is None  # the record had no check of its own to disagree with
        effective = record.effective_precision
        # the same Gemm recomputed here: relative error within float32's
        fc1_input = record.tensor(0, "flatten").values[0].astype(np.float64)
        fc1 = record.tensor(0, "fc1").values[0].astype(np.float64)
    weights = {tensor.name: numpy_helper.to_array(tensor).astype(np.float64)
               for tensor in onnx_cnn.build_model().graph.initializer}
    exact = fc1_input @ weights["fc1.weight"].T + weights["fc1.bias"]
    scale = np.abs(fc1_input) @ np.abs(weights["fc1.weight"].T) + np.abs(weights["fc1.bias"])
    assert np.max(np.abs(fc1 - exact) / scale) <= effective["fc1"]["relative_error"] * 1.000001
    assert set(effective) == {"conv", "fc1", "fc2_matmul"}
    assert all(entry["format"] == "float32" for entry in effective.values())


def test_a_runtime_that_lacks_an_op_fails_naming_it_and_another_runs_it(tmp_path):
    """Det: ONNX Runtime has a kernel, OpenVINO's ONNX frontend has no conversion."""
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((4, 16)).astype(np.float32)
    kernel = numpy_helper.from_array(weights, "kernel")
    shape = numpy_helper.from_array(np.array([-1, 4, 4], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "kernel"], ["square"]),
             helper.make_node("Reshape", ["square", "shape"], ["matrix"]),
             helper.make_node("Det", ["matrix"], ["det"])]
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 4])], [helper.make_tensor_value_info(
            "det", TensorProto.FLOAT, ["batch"])], [kernel, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "det.onnx")
    values = rng.standard_normal((4, 4)).astype(np.float32)
    np.save(tmp_path / "det.npy", values)
    with pytest.raises(InferenceError) as error:
        run_device(tmp_path, "openvino_f32", "det.onnx", "det.npy", samples=(0, 1))
    assert "openvino cannot run det.onnx" in str(error.value) and "Det" in str(error.value)
    assert not (tmp_path / "openvino_f32.h5").exists()
    with Record(run_device(tmp_path, "ort_all", "det.onnx", "det.npy",
                           samples=(0, 1))) as record:
        # numpy's determinant of the same 4x4 matrices
        expected = np.linalg.det((values.astype(np.float64) @ weights).reshape(-1, 4, 4))
        assert abs(expected[1]) > 1e-3
        np.testing.assert_allclose(record.tensor(1, "output").values[0], expected[1],
                                   rtol=1e-4)
        assert [info.name for info in record.layers(1)][:2] == ["square", "matrix"]


def test_a_model_with_a_fixed_batch_refuses_another_batch_size(tmp_path):
    model = onnx_cnn.build_model()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(model, tmp_path / "fixed.onnx")
    np.save(tmp_path / "inputs.npy", onnx_cnn.make_inputs(4))
    with pytest.raises(InferenceError, match="batch_size 4, but model .*fixed.onnx takes "
                                             "batches of exactly 1"):
        run_device(tmp_path, "ort_all", "fixed.onnx", samples=(0,))


def test_a_dimension_the_model_leaves_free_takes_the_inputs_size(tmp_path):
    """Height and width named, not fixed: the inputs' 16x16 fits, and the run records it."""
    model = onnx_cnn.build_model()
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"
    onnx.save(model, tmp_path / "cnn.onnx")
    np.save(tmp_path / "inputs.npy", onnx_cnn.make_inputs(4))
    (signature,) = formats.check_inputs(tmp_path / "inputs.npy", tmp_path / "cnn.onnx")
    assert signature.shape == (None, 3, None, None)
    with Record(run_device(tmp_path, "ort_all", samples=(0,))) as record:
        # conv_relu: ONNX Runtime fuses the Conv into its Relu, and records the fused value
        assert record.tensor(0, "conv_relu").values.shape == (2, 8, 16, 16)
    np.save(tmp_path / "flat.npy", np.zeros((4, 3, 16), np.float32))
    with pytest.raises(ModelFormatError, match=r"\(samples, 3, 16\) float32, but .* takes "
                                               r"input 'input' \(\?, 3, \?, \?\) float32"):
        formats.check_inputs(tmp_path / "flat.npy", tmp_path / "cnn.onnx")


def test_repro_cuts_the_first_parting_node_from_the_users_file(onnx_records, tmp_path):
    """Two devices that part (on x86 at the Conv: ONNX Runtime's NCHWc kernel against its
    plain one, or OpenVINO's): the node alone, with the file's own attributes and weights,
    reproduces each record."""
    from itertools import combinations

    from bitdrift.run.repro import check_repro, write_repro

    folder, records = onnx_records

    def first_parting(a, b):
        with Record(records[a]) as one, Record(records[b]) as other:
            return next((info.name for info in one.layers(0) if not np.array_equal(
                one.tensor(0, info).values[0], other.tensor(0, info).values[0])), None)

    def every_node(device):  # ONNX Runtime's optimised graph fuses the Conv away
        with Record(records[device]) as record:
            return not record.json_attr("unmapped_layers", list, [])

    parting = [(a, b, first_parting(a, b)) for a, b in combinations(
        [device for device in ONNX_RUNTIME_DEVICES if every_node(device)], 2)]
    a, b, first = next(pair for pair in parting if pair[2] is not None)
    summary = write_repro(records[a], records[b], folder / "cnn.onnx", tmp_path / "repro",
                          folder / "inputs.npy")
    assert summary["layer"] == first
    node = onnx.load(tmp_path / "repro/layer.onnx").graph
    original = next(n for n in onnx_cnn.build_model().graph.node if n.output[0] == first)
    assert [n.op_type for n in node.node] == [original.op_type] == [summary["class_name"]]
    assert list(node.node[0].attribute) == list(original.attribute)
    results = check_repro(tmp_path / "repro")
    assert all(result["reproduced"] for result in results.values()), results
    assert results[a]["printed"] != results[b]["printed"]


def test_a_device_whose_runtime_cannot_run_the_format_is_refused_before_any_repeat(
        tmp_path):
    from bitdrift.run.inference import infer

    onnx_cnn.write(tmp_path / "cnn.onnx", tmp_path / "inputs.npy", samples=4)
    device = validate_config({"models": {"cnn": {"file": str(tmp_path / "cnn.onnx"),
                                                 "inputs": str(tmp_path / "inputs.npy")}},
                              "devices": {"tf": {"accelerator": "cpu",
                                                 "backend": "tensorflow"},
                                          "ort": {"accelerator": "cpu",
                                                  "backend": "onnxruntime"}},
                              "samples": [0]})["devices"]["tf"]
    with pytest.raises(InferenceError) as error:
        infer(model_name="cnn", device_name="tf", device=device,
              model_path=tmp_path / "cnn.onnx", dataset_path=tmp_path / "inputs.npy",
              samples=[0], out=tmp_path / "tf.h5")
    assert str(error.value) == (f"device 'tf': backend 'tensorflow' cannot run "
                                f"{tmp_path / 'cnn.onnx'} (an ONNX model; runtimes that can: "
                                "onnxruntime, openvino, torch_export, litert)")


def test_a_study_that_needs_a_dataset_refuses_a_model_with_its_own_inputs(tmp_path,
                                                                        monkeypatch):
    monkeypatch.chdir(tmp_path)
    onnx_cnn.write("cnn.onnx", "inputs.npy", samples=4)
    config = config_of({"file": "cnn.onnx", "inputs": "inputs.npy"})
    config["devices"]["ort_2"] = {"accelerator": "cpu", "backend": "onnxruntime"}
    config["probes"] = {"model": "mine", "search_devices": ["ort", "ort_2"]}
    with pytest.raises(ConfigError, match="^config key probes.model: model 'mine' brings its "
                                          "own inputs; the probe search runs a model on a "
                                          "dataset's images$"):
        validate_config(config)


def three_convs_model():
    """Conv 3x3 stride 2 (valid, bias) on the input, Relu, a depthwise Conv (4 groups, same
    padding), a Conv 2x2 without bias on that, Flatten, Gemm: NCHW, seeded weights."""
    rng = np.random.default_rng(3)

    def constant(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    constants = [constant("w1", 4, 3, 3, 3), constant("b1", 4), constant("wd", 4, 1, 3, 3),
                 constant("w3", 5, 4, 2, 2), constant("fc", 5 * 3 * 3, 2)]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["conv1"], kernel_shape=[3, 3],
                              strides=[2, 2], auto_pad="VALID"),
             helper.make_node("Relu", ["conv1"], ["relu"]),
             helper.make_node("Conv", ["relu", "wd"], ["depthwise"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], group=4),
             helper.make_node("Conv", ["depthwise", "w3"], ["conv3"], kernel_shape=[2, 2]),
             helper.make_node("Flatten", ["conv3"], ["flat"]),
             helper.make_node("Gemm", ["flat", "fc"], ["logits"])]
    graph = helper.make_graph(nodes, "three_convs", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 3, 9, 9])], [helper.make_tensor_value_info(
            "logits", TensorProto.FLOAT, ["batch", 2])], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("device", ["ort_all", "openvino_f32"])
def test_an_onnx_conv_nodes_order_is_revealed_and_replays_the_record(tmp_path, device):
    """Each Conv node alone, cut from the file, through the device's runtime: the first
    one's sum has kh * kw * cin products and its bias, the depthwise one's kh * kw
    products of its own channel, and numpy summing the recorded input in the revealed
    order (each group's channels apart) gives the record's bits."""
    model = three_convs_model()
    onnx.save(model, tmp_path / "cnn.onnx")
    inputs = np.random.default_rng(4).standard_normal((8, 3, 9, 9)).astype(np.float32)
    np.save(tmp_path / "inputs.npy", inputs)
    with Record(run_device(tmp_path, device, kernels=True)) as record:
        orders = record.accumulation_orders
        unmapped = record.json_attr("unmapped_layers", list, [])
        # ONNX Runtime's optimised graph fuses conv1 into its Relu (an NCHWc or a fused
        # Conv): no value of conv1 is deployed, so none is recorded and none replayed
        conv1 = record.tensor(5, "conv1").values[0] if "conv1" not in unmapped else None
        conv3 = record.tensor(5, "conv3").values[0]
    assert ("conv1" in unmapped) == (device == "ort_all") and "conv3" not in unmapped
    assert "conv1" not in orders if conv1 is None else \
        orders["conv1"]["terms"] == 3 * 3 * 3 + 1 and orders["conv1"]["bias"]
    assert orders["conv3"]["terms"] == 2 * 2 * 4 and not orders["conv3"]["bias"]
    # the depthwise Conv reads relu, which ONNX Runtime's optimised graph fuses into conv1:
    # with its input not recorded it is not revealed, and says so
    if "relu" in unmapped:
        assert orders["depthwise"] == {"order": "not revealed",
                                       "replay": "its input relu is not recorded"}
    else:
        assert orders["depthwise"]["terms"] == 3 * 3 and not orders["depthwise"]["bias"]
    for layer in ("conv1", "depthwise", "conv3"):
        if layer in unmapped or (layer == "depthwise" and "relu" in unmapped):
            continue
        assert orders[layer]["order"] != "not revealed", orders[layer]
        assert orders[layer]["replay"].startswith("bit-identical"), orders[layer]
    # the record's conv1 is the file's convolution: numpy from the initializers
    weights = {tensor.name: numpy_helper.to_array(tensor).astype(np.float64)
               for tensor in model.graph.initializer}
    patches = np.stack([inputs[5, :, i:i + 7:2, j:j + 7:2] for i in range(3)
                        for j in range(3)], axis=-1).astype(np.float64)  # (c, 4, 4, 9)
    exact = np.einsum("chwk,ock->ohw", patches, weights["w1"].reshape(4, 3, 9)) + \
        weights["b1"][:, None, None]
    if conv1 is not None:
        np.testing.assert_allclose(conv1, exact, rtol=1e-5, atol=1e-5)
    assert conv3.shape == (5, 3, 3)


def conv_relu_gemm_model():
    """Conv 3x3 (same padding, bias), Relu, Flatten, Gemm (transB, bias): NCHW, seeded."""
    rng = np.random.default_rng(5)

    def constant(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["features"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["features"], ["activated"], name="relu"),
             helper.make_node("Flatten", ["activated"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "fc", "fc_bias"], ["scores"], transB=1,
                              name="fc")]
    graph = helper.make_graph(nodes, "conv_relu_gemm", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 2, 6, 6])], [helper.make_tensor_value_info(
            "scores", TensorProto.FLOAT, ["batch", 4])],
        [constant("w", 3, 2, 3, 3), constant("b", 3), constant("fc", 4, 3 * 6 * 6),
         constant("fc_bias", 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def conv_relu_gemm_files(folder):
    """conv_relu_gemm_model and 8 seeded inputs written to ``folder`` (cnn.onnx,
    inputs.npy); (its initializers in float64, and numpy's float64 Conv of samples 0, 1, 5
    with the sum of its terms' magnitudes, which bounds float32's rounding)."""
    model = conv_relu_gemm_model()
    onnx.save(model, folder / "cnn.onnx")
    inputs = np.random.default_rng(6).standard_normal((8, 2, 6, 6)).astype(np.float32)
    np.save(folder / "inputs.npy", inputs)
    weights = {tensor.name: numpy_helper.to_array(tensor).astype(np.float64)
               for tensor in model.graph.initializer}
    padded = np.pad(inputs[[0, 1, 5]].astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    patches = np.stack([padded[:, :, i:i + 6, j:j + 6] for i in range(3) for j in range(3)],
                       axis=-1)  # (n, c, 6, 6, 9)
    kernel = weights["w"].reshape(3, 2, 9)
    conv = np.einsum("nchwk,ock->nohw", patches, kernel) + weights["b"][:, None, None]
    conv_scale = np.einsum("nchwk,ock->nohw", np.abs(patches), np.abs(kernel)) + \
        np.abs(weights["b"])[:, None, None]
    return weights, conv, conv_scale


def test_an_onnx_model_runs_on_torch_converted_by_onnx2torch_named_by_its_outputs(tmp_path):
    """torch eager on the model onnx2torch converts, beside ONNX Runtime on the file: each
    records every node output under its ONNX name, within float32's rounding of numpy's
    float64 from the initializers (n terms: at most n * 2^-24 of the terms' magnitudes
    each sum); the converter and its version are in the fingerprint."""
    import importlib.metadata

    weights, conv, conv_scale = conv_relu_gemm_files(tmp_path)
    names = ["features", "activated", "flat", "scores"]
    for device in ("torch_eager", "ort_all"):
        with Record(run_device(tmp_path, device)) as record:
            # ONNX Runtime's optimised graph fuses the Conv into its Relu: no features
            fused = ["features"] if device == "ort_all" else []
            assert record.json_attr("unmapped_layers", list, []) == fused
            assert [info.name for info in record.layers(0)] == \
                [name for name in names if name not in fused] + ["output"], device
            fingerprint = json.loads(record.attr("fingerprint"))
            for row, sample in enumerate((0, 1, 5)):
                activated = record.tensor(sample, "activated").values[0]
                if not fused:
                    features = record.tensor(sample, "features").values[0]
                    assert np.all(np.abs(features.astype(np.float64) - conv[row])
                                  <= 19 * 2.0**-24 * conv_scale[row])
                    assert np.array_equal(activated, np.maximum(features, np.float32(0)))
                else:  # the fused Conv and Relu: within the Conv's rounding, then Relu
                    assert np.all(np.abs(activated.astype(np.float64) - np.maximum(
                        conv[row], 0)) <= 19 * 2.0**-24 * conv_scale[row])
                flat = activated.reshape(-1).astype(np.float64)
                assert np.array_equal(record.tensor(sample, "flat").values[0], flat)
                exact = flat @ weights["fc"].T + weights["fc_bias"]
                scale = np.abs(flat) @ np.abs(weights["fc"].T) + np.abs(weights["fc_bias"])
                scores = record.tensor(sample, "scores").values[0].astype(np.float64)
                assert np.all(np.abs(scores - exact) <= 109 * 2.0**-24 * scale), device
        if device == "torch_eager":
            accelerator = fingerprint["accelerator"]
            assert accelerator["converter"] == "onnx2torch.convert"
            assert accelerator["converter_versions"]["onnx2torch"] == \
                importlib.metadata.version("onnx2torch")
            assert accelerator["model_format"] == "onnx"


def det_files(folder):
    """An ONNX model of one Det node (no torch converter has it) and 4 identity matrices,
    written to ``folder`` as det.onnx and det.npy."""
    nodes = [helper.make_node("Det", ["x"], ["det"])]
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 3, 3])], [helper.make_tensor_value_info(
            "det", TensorProto.FLOAT, ["batch"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "det.onnx")
    np.save(folder / "det.npy", np.eye(3, dtype=np.float32)[None].repeat(4, axis=0))


def test_an_onnx_model_runs_on_litert_through_onnx2torch_and_litert_torch(tmp_path):
    """LiteRT on the model converted by onnx2torch, then litert-torch: the nodes whose
    tensor the .tflite keeps are recorded under their ONNX names (the convolution fused
    into its Relu is not one of them: absent, not guessed), every recorded value within
    float32's rounding of numpy's float64 from the initializers, both converters and their
    versions in the fingerprint; an op onnx2torch lacks fails the device, named."""
    import importlib.metadata

    weights, conv, conv_scale = conv_relu_gemm_files(tmp_path)
    activated = np.maximum(conv, 0)
    bound = 19 * 2.0**-24 * conv_scale
    with Record(run_device(tmp_path, "litert_xnnpack")) as record:
        recorded = [info.name for info in record.layers(0)]
        assert set(recorded) <= {"features", "activated", "flat", "scores", "output"}
        assert recorded[-1] == "output" and "activated" in recorded, recorded
        for row, sample in enumerate((0, 1, 5)):
            if "features" in recorded:
                features = record.tensor(sample, "features").values[0].astype(np.float64)
                assert np.all(np.abs(features - conv[row]) <= bound[row])
            found = record.tensor(sample, "activated").values[0].astype(np.float64)
            assert np.all(np.abs(found - activated[row]) <= bound[row])
            flat = activated[row].reshape(-1)
            exact = flat @ weights["fc"].T + weights["fc_bias"]
            scale = (np.abs(flat) + bound[row].reshape(-1)) @ np.abs(weights["fc"].T) + \
                np.abs(weights["fc_bias"])
            output = record.tensor(sample, "output").values[0].astype(np.float64)
            assert np.all(np.abs(output - exact) <= 109 * 2.0**-24 * scale + np.abs(
                weights["fc"]) @ bound[row].reshape(-1))
        accelerator = json.loads(record.attr("fingerprint"))["accelerator"]
    assert accelerator["converter"] == "onnx2torch.convert, then litert_torch.convert"
    for package in ("onnx2torch", "litert-torch"):
        assert accelerator["converter_versions"][package] == \
            importlib.metadata.version(package)
    assert accelerator["model_format"] == "onnx"
    det_files(tmp_path)
    with pytest.raises(InferenceError, match="onnx2torch.convert .* cannot convert det.onnx"):
        run_device(tmp_path, "litert_xnnpack", "det.onnx", "det.npy", samples=(0, 1))


def test_an_op_onnx2torch_lacks_fails_the_torch_device_naming_it(tmp_path):
    """Det: ONNX Runtime runs it (test_a_runtime_that_lacks_an_op_...), onnx2torch has no
    converter for it: the torch device fails at the conversion, the op named."""
    det_files(tmp_path)
    with pytest.raises(InferenceError) as error:
        run_device(tmp_path, "torch_eager", "det.onnx", "det.npy", samples=(0, 1))
    said = str(error.value)
    assert "onnx2torch.convert (onnx2torch 1.5.15" in said and "cannot convert det.onnx" in said
    assert "operation_type='Det'" in said
    assert "\n" not in said
    assert not (tmp_path / "torch_eager.h5").exists()
