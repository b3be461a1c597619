"""A user's ONNX models with their own .npy inputs through the workflow: no training or
Keras export rule, one record per device whose runtime runs ONNX (ONNX Runtime with and
without its graph optimisations, OpenVINO at float32, torch eager through onnx2torch),
the TensorFlow device left out; an op OpenVINO and onnx2torch lack fails those devices
alone, named, and the rest is written."""

import json

import numpy as np
import onnx
import pandas as pd
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from bitdrift.inputs.examples import onnx_cnn
from bitdrift.record.reader import Record
from tests.utils import snakemake

pytestmark = pytest.mark.workflow
DEVICES = {
    "ort_all": {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1,
                "graph_optimization_level": "all", "repeats": 2},
    "ort_no_optimizations": {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1,
                             "graph_optimization_level": "disable_all", "repeats": 2},
    "openvino_f32": {"accelerator": "cpu", "backend": "openvino", "threads": 1,
                     "inference_precision_hint": "f32", "repeats": 2},
    "torch_eager": {"accelerator": "cpu", "backend": "torch_export", "threads": 1,
                    "repeats": 2},
    "tf_1thread": {"accelerator": "cpu", "backend": "tensorflow", "threads": 1},
}
ONNX_DEVICES = ["ort_all", "ort_no_optimizations", "openvino_f32"]
TORCH_DEVICE = "torch_eager"  # the model converted by onnx2torch
SAMPLES = [0, 1, 5]


def determinant_model():
    """MatMul, Reshape to 4x4, Det: ONNX Runtime has a Det kernel, OpenVINO none."""
    rng = np.random.default_rng(0)
    kernel = numpy_helper.from_array(rng.standard_normal((4, 16)).astype(np.float32),
                                     "kernel")
    shape = numpy_helper.from_array(np.array([-1, 4, 4], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "kernel"], ["square"]),
             helper.make_node("Reshape", ["square", "shape"], ["matrix"]),
             helper.make_node("Det", ["matrix"], ["det"])]
    graph = helper.make_graph(nodes, "det", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["batch", 4])], [helper.make_tensor_value_info(
            "det", TensorProto.FLOAT, ["batch"])], [kernel, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, rng.standard_normal((8, 4)).astype(np.float32)


def two_input_model():
    """Gemm of input a, Relu, MatMul, Add of input b: a model of two inputs (a .npz of one
    array per input, named as it), its inputs in the file in another order."""
    rng = np.random.default_rng(2)
    weights = {"w1": rng.standard_normal((8, 16)), "b1": rng.standard_normal(16),
               "w2": rng.standard_normal((16, 4))}
    nodes = [helper.make_node("Gemm", ["a", "w1", "b1"], ["hidden"]),
             helper.make_node("Relu", ["hidden"], ["hidden_relu"]),
             helper.make_node("MatMul", ["hidden_relu", "w2"], ["projected"]),
             helper.make_node("Add", ["projected", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 8]),
                       helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(value.astype(np.float32), name)
         for name, value in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    inputs = {"b": rng.standard_normal((8, 4)).astype(np.float32),
              "a": rng.standard_normal((8, 8)).astype(np.float32)}
    return model, inputs


@pytest.fixture(scope="module")
def onnx_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("onnx_workflow")
    onnx_cnn.write(workdir / "cnn.onnx", workdir / "inputs.npy", samples=8)
    model, inputs = determinant_model()
    onnx.save(model, workdir / "det.onnx")
    np.save(workdir / "det.npy", inputs)
    model, inputs = two_input_model()
    onnx.save(model, workdir / "two.onnx")
    np.savez(workdir / "two.npz", **inputs)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump({
        "samples": SAMPLES, "analysis": {"precision": "float32"}, "devices": DEVICES,
        "models": {"cnn": {"file": "cnn.onnx", "inputs": "inputs.npy"},
                   "det": {"file": "det.onnx", "inputs": "det.npy"},
                   "two": {"file": "two.onnx", "inputs": "two.npz"}}}))
    result = snakemake(workdir, "all", configfile=config, check=False)
    return workdir, result.returncode, result.stdout + result.stderr


def test_only_the_onnx_runtimes_run_and_no_keras_rule(onnx_run):
    workdir, returncode, said = onnx_run
    assert returncode != 0  # one device failed, and the run says so at its end
    assert "2 device(s) failed" in said
    for rule in ("train_model", "export_model", "export_reference", "prepare_dataset"):
        assert f"rule {rule}:" not in said
    records = sorted(path.relative_to(workdir / "results/inference").as_posix()
                     for path in (workdir / "results/inference").rglob("*.h5"))
    # the failed device's failure record is cleared at the end of the run, so the next
    # run tries it again (bitdrift.record.failures); its reason stays in device_failures.csv
    assert records == sorted([f"{model}/{device}.h5" for model in ("cnn", "two")
                              for device in [*ONNX_DEVICES, TORCH_DEVICE]]
                             + ["det/ort_all.h5", "det/ort_no_optimizations.h5"])


def test_an_op_a_runtime_lacks_fails_that_device_alone_naming_the_op(onnx_run):
    workdir, _, _ = onnx_run
    failures = pd.read_csv(workdir / "results/tables/device_failures.csv")
    assert sorted(failures[["model", "device"]].values.tolist()) == [
        ["det", "openvino_f32"], ["det", TORCH_DEVICE]]
    reasons = failures.set_index("device")["reason"]
    assert "openvino cannot run det.onnx (No conversion rule found for operations: Det" \
        in reasons["openvino_f32"]
    assert "cannot convert det.onnx: Converter is not implemented" in reasons[TORCH_DEVICE]
    assert "operation_type='Det'" in reasons[TORCH_DEVICE]
    det = np.load(workdir / "det.npy").astype(np.float64)
    kernel = numpy_helper.to_array(onnx.load(workdir / "det.onnx").graph.initializer[0])
    expected = np.linalg.det((det @ kernel.astype(np.float64)).reshape(-1, 4, 4))
    for device in ("ort_all", "ort_no_optimizations"):
        with Record(workdir / f"results/inference/det/{device}.h5") as record:
            for sample in SAMPLES:
                np.testing.assert_allclose(record.tensor(sample, "output").values[0],
                                           expected[sample], rtol=1e-4)
    assert (workdir / "results/report.html").is_file()
    assert "openvino_f32" in (workdir / "results/findings.md").read_text()


def test_the_tables_name_the_models_own_nodes(onnx_run):
    workdir, _, _ = onnx_run
    eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
    cnn = eqc[eqc["model"] == "cnn"]
    assert sorted(set(cnn["device"])) == sorted([*ONNX_DEVICES, TORCH_DEVICE])
    # the classes are the records' final outputs grouped bit for bit, recounted here
    for sample, rows in cnn.groupby("sample"):
        outputs = {}
        for device in [*ONNX_DEVICES, TORCH_DEVICE]:
            with Record(workdir / f"results/inference/cnn/{device}.h5") as record:
                outputs[device] = record.tensor(sample, "output").values[0].tobytes()
        assert rows["eqc"].nunique() == len(set(outputs.values()))
    # the first layer in the graph's order, of those every device records, where two
    # classes part, found here by numpy (ONNX Runtime's optimised graph fuses conv, fc1
    # and fc2_matmul away: ort_all records the values of the graph it deploys)
    divergence = pd.read_csv(workdir / "results/tables/divergence.csv")
    order = ["conv", "conv_relu", "pool", "flatten", "fc1", "fc1_relu", "fc2_matmul", "logits"]
    held = {}
    for device in [*ONNX_DEVICES, TORCH_DEVICE]:
        with Record(workdir / f"results/inference/cnn/{device}.h5") as record:
            held[device] = {info.name for info in record.layers(SAMPLES[0])}
            unmapped = record.json_attr("unmapped_layers", list, [])
        assert set(order) == held[device] - {"output"} | set(unmapped), device
    assert {"fc1", "fc2_matmul"} <= set(order) - held["ort_all"]
    common = [name for name in order if all(name in names for names in held.values())]
    for row in divergence[divergence["model"] == "cnn"].itertuples():
        with Record(workdir / f"results/inference/cnn/{row.device_a}.h5") as a, \
                Record(workdir / f"results/inference/cnn/{row.device_b}.h5") as b:
            first = next((name for name in common if not np.array_equal(
                a.tensor(row.sample, name).values[0], b.tensor(row.sample, name).values[0])),
                "output")
        assert row.first_layer == first
    # exposing the deployed graph's values changed no final output of ort_all's
    observed = pd.read_csv(workdir / "results/tables/observer_check.csv").set_index(
        ["model", "device"])
    assert observed.loc[("cnn", "ort_all"), "observer_equal"] == "yes"
    assert "optimised graph" in observed.loc[("cnn", "ort_all"), "instrumented"]
    effective = pd.read_csv(workdir / "results/tables/effective_precision.csv")
    checked = effective[effective["model"] == "cnn"]
    assert set(checked["layer"]) == {"conv", "fc1", "fc2_matmul"}
    assert (checked["format"] == "float32").all()
    # the Conv, MatMul and Gemm nodes' orders revealed through each runtime, the node alone
    # cut from the file, and numpy summing in that order gives each record's bits
    orders = pd.read_csv(workdir / "results/tables/accumulation_orders.csv")
    cnn_orders = orders[orders["model"] == "cnn"].set_index(["device", "layer"])
    for device in ONNX_DEVICES:
        for layer in ("conv", "fc1", "fc2_matmul"):
            if layer in held[device]:  # a node the deployed graph keeps
                assert cnn_orders.loc[(device, layer), "replay"].startswith("bit-identical")
            else:
                assert (device, layer) not in cnn_orders.index
    assert cnn_orders.loc[("ort_no_optimizations", "fc1"), "terms"] == 8 * 8 * 8 + 1
    assert cnn_orders.loc[("ort_no_optimizations", "conv"), "terms"] == 3 * 3 * 3 + 1
    assert cnn_orders.loc[(TORCH_DEVICE, "conv"), "order"] == "not revealed"
    kernels = pd.read_csv(workdir / "results/tables/kernels.csv")
    assert {"conv", "fc1"} <= set(kernels[kernels["model"] == "cnn"]["layer"])
    with Record(workdir / "results/inference/cnn/ort_all.h5") as record:
        assert json.loads(record.attr("device_config"))["graph_optimization_level"] == "all"


def test_a_model_of_two_inputs_is_fed_each_by_its_name(onnx_run):
    """Every device's final output within float32's rounding of numpy's float64 from both
    inputs; the classes of the final outputs, recounted here, are eqc.csv's; the Gemm fed
    by an input is not recomputed as "the model's input" (one of several), the MatMul
    fed by a recorded layer is."""
    workdir, _, _ = onnx_run
    inputs = np.load(workdir / "two.npz")
    weights = {tensor.name: numpy_helper.to_array(tensor).astype(np.float64)
               for tensor in onnx.load(workdir / "two.onnx").graph.initializer}
    eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
    for sample in SAMPLES:
        a, b = inputs["a"][sample].astype(np.float64), inputs["b"][sample]
        hidden = np.maximum(a @ weights["w1"] + weights["b1"], 0)
        exact = hidden @ weights["w2"] + b
        outputs = {}
        for device in [*ONNX_DEVICES, TORCH_DEVICE]:
            with Record(workdir / f"results/inference/two/{device}.h5") as record:
                outputs[device] = record.tensor(sample, "output").values[0]
            np.testing.assert_allclose(outputs[device], exact, rtol=1e-4, atol=1e-5)
        rows = eqc[(eqc["model"] == "two") & (eqc["sample"] == sample)]
        assert rows["eqc"].nunique() == len({value.tobytes() for value in outputs.values()})
    effective = pd.read_csv(workdir / "results/tables/effective_precision.csv")
    assert set(effective[effective["model"] == "two"]["layer"]) == {"projected"}
