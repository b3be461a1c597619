"""Models of several inputs (bitdrift.inputs.datasets.NamedInputs): a .npz of one array per input,
matched to the model's inputs by name, checked when the config is read, and fed by name
to ONNX Runtime, OpenVINO and torch eager through onnx2torch (an ONNX model) and torch
eager (a .pt2 program); each recorded output checked against numpy or torch computing
the model from the inputs."""

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from bitdrift import backends, formats
from bitdrift.config import validate_config
from bitdrift.errors import ConfigError, DatasetError, ModelFormatError
from bitdrift.record.reader import Record

WEIGHTS = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
SAMPLES = [0, 1, 3]  # batches of 2: the last one filled with sample 2


def two_input_onnx():
    """y = MatMul(a, w) + b: input a (batch, 3), input b (batch, 4), both float32."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["projected"]),
         helper.make_node("Add", ["projected", "b"], ["y"])], "two_inputs",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(WEIGHTS, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


class Masked(torch.nn.Module):
    """forward(x, mask): a linear layer's output where mask is 1, zero elsewhere."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(3, 4)

    def forward(self, x, mask):
        return self.linear(x).masked_fill(mask == 0, 0.0)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("several_inputs")
    onnx.save(two_input_onnx(), folder / "two.onnx")
    rng = np.random.default_rng(5)
    np.savez(folder / "two.npz", a=rng.standard_normal((5, 3)).astype(np.float32),
             b=rng.standard_normal((5, 4)).astype(np.float32))
    x = rng.standard_normal((5, 3)).astype(np.float32)
    mask = rng.integers(0, 2, (5, 4)).astype(np.int64)
    np.savez(folder / "masked.npz", mask=mask, x=x)  # not in the signature's order
    module = Masked().eval()
    torch.export.save(torch.export.export(module, (torch.from_numpy(x[:2]),
                                                   torch.from_numpy(mask[:2]))),
                      folder / "masked.pt2")
    return folder, module


def config_of(model: str, inputs: str, backend: str = "onnxruntime") -> dict:
    return {"models": {"mine": {"file": model, "inputs": inputs}}, "samples": SAMPLES,
            "devices": {"d": {"accelerator": "cpu", "backend": backend, "threads": 1,
                              "repeats": 1, "batch_size": 2}}}


def run_device(folder, model: str, inputs: str, backend: str, **keys):
    from bitdrift.run.inference import infer

    config = config_of(str(folder / model), str(folder / inputs), backend)
    config["devices"]["d"].update(keys)
    config = validate_config(config)
    out = folder / f"{model}.{backend}.h5"
    infer(model_name="mine", device_name="d", device=config["devices"]["d"],
          model_path=folder / model, dataset_path=folder / inputs, samples=SAMPLES,
          out=out, layers=True)
    return out


def final_values(path) -> dict:
    with Record(path) as record:
        final = next(info.name for info in record.layers(SAMPLES[0]) if info.final)
        return {sample: record.tensor(sample, final).values[0] for sample in SAMPLES}


# ONNX Runtime without graph optimisations: it records the graph it deploys, and at its
# default level that graph fuses the MatMul and its Add (no `projected` value is deployed)
@pytest.mark.parametrize("backend, keys", [("onnxruntime",
                                            {"graph_optimization_level": "disable_all"}),
                                           ("openvino", {"inference_precision_hint": "f32"}),
                                           ("torch_export", {})])  # through onnx2torch
def test_an_onnx_model_of_two_inputs_is_fed_each_by_its_name(files, backend, keys):
    """The final output against numpy's float64 from both inputs, within float32's
    rounding of three terms and an addition; and the Add node's output is exactly the
    recorded MatMul output plus b in float32 (one correctly rounded addition)."""
    folder, _ = files
    arrays = np.load(folder / "two.npz")
    path = run_device(folder, "two.onnx", "two.npz", backend, **keys)
    finals = final_values(path)
    with Record(path) as record:
        for sample in SAMPLES:
            a, b = arrays["a"][sample].astype(np.float64), arrays["b"][sample]
            exact = a @ WEIGHTS.astype(np.float64) + b
            scale = np.abs(a) @ np.abs(WEIGHTS.astype(np.float64)) + np.abs(b)
            assert np.all(np.abs(finals[sample] - exact) <= 5 * 2.0**-24 * scale), sample
            projected = record.tensor(sample, "projected").values[0]
            assert np.array_equal(finals[sample], projected + b), sample


def test_a_program_of_two_inputs_runs_on_torch_export_as_the_module_does(files):
    folder, module = files
    arrays = np.load(folder / "masked.npz")
    finals = final_values(run_device(folder, "masked.pt2", "masked.npz", "torch_export"))
    with torch.no_grad():
        truth = module(torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["mask"])).numpy()
    for sample in SAMPLES:
        assert np.all(finals[sample][arrays["mask"][sample] == 0] == 0)
        np.testing.assert_allclose(finals[sample], truth[sample], rtol=1e-6, atol=1e-7)


def refusal(tmp_path, folder, model: str, backend: str = "onnxruntime", **arrays) -> str:
    inputs = tmp_path / "inputs.npz" if len(arrays) != 1 or "single" not in arrays \
        else tmp_path / "inputs.npy"
    if inputs.suffix == ".npy":
        np.save(inputs, arrays["single"])
    else:
        np.savez(inputs, **arrays)
    with pytest.raises(ConfigError) as error:
        validate_config(config_of(str(folder / model), str(inputs), backend))
    said = str(error.value)
    assert "\n" not in said
    return said.replace(str(inputs), "INPUTS").replace(str(folder / model), model)


def test_inputs_that_do_not_fit_a_model_of_two_are_one_line_naming_them(files, tmp_path):
    folder, _ = files
    a, b = np.zeros((5, 3), np.float32), np.zeros((5, 4), np.float32)
    assert refusal(tmp_path, folder, "two.onnx", a=a) == (
        "config key models.mine.inputs: INPUTS: inputs of shape (samples, 3) float32, but "
        "model two.onnx takes 2 inputs ('a' (?, 3) float32; 'b' (?, 4) float32): give a "
        ".npz of one array per input, named as the input")
    assert refusal(tmp_path, folder, "two.onnx", a=a, c=b) == (
        "config key models.mine.inputs: INPUTS: no array for input 'b'; array 'c' is no "
        "input's (model two.onnx takes 'a' (?, 3) float32; 'b' (?, 4) float32; the file "
        "holds 'a' (samples, 3) float32; 'c' (samples, 4) float32)")
    assert refusal(tmp_path, folder, "two.onnx", a=a, b=np.zeros((5, 5), np.float32)) == (
        "config key models.mine.inputs: INPUTS: array 'b' of shape (samples, 5) float32, but "
        "model two.onnx takes input 'b' (?, 4) float32")
    assert refusal(tmp_path, folder, "two.onnx", a=a, b=b.astype(np.float64)).endswith(
        "array 'b' of shape (samples, 4) float64, but model two.onnx takes input 'b' (?, 4) "
        "float32")
    assert refusal(tmp_path, folder, "two.onnx", a=a, b=b[:4]) == (
        "config key models.mine.inputs: INPUTS: arrays of different sample counts ('a': 5, "
        "'b': 4); the first axis of each is the sample")
    nan = b.copy()
    nan[2, 1] = np.nan
    assert refusal(tmp_path, folder, "two.onnx", a=a, b=nan).startswith(
        "config key models.mine.inputs: INPUTS: 1 NaN or Inf values in 1 samples (the "
        "first: sample 2)")
    with pytest.raises(DatasetError, match="samples \\[7\\] beyond the test set"):
        np.savez(tmp_path / "fits.npz", a=a, b=b)
        formats.check_inputs(tmp_path / "fits.npz", folder / "two.onnx", samples=[0, 7])


def test_a_runtime_that_feeds_one_input_refuses_a_model_of_two_at_the_config_check(files):
    folder, _ = files
    for model, inputs, backend, several in (
            ("masked.pt2", "masked.npz", "torch_inductor", "torch_export"),
            ("masked.pt2", "masked.npz", "executorch", "torch_export"),
            ("masked.pt2", "masked.npz", "onnxruntime", "torch_export")):
        with pytest.raises(ConfigError) as error:
            validate_config(config_of(str(folder / model), str(folder / inputs), backend))
        assert str(error.value) == (
            f"config key devices.d.backend: backend {backend!r} feeds models of one input; "
            f"{folder / model} takes 2 (x, mask): runtimes that feed several: {several}")


def test_a_runtime_that_feeds_one_input_refuses_it_at_its_session_too(files):
    """A model file a rule makes later is checked by its job: one line, no traceback."""
    from bitdrift.errors import InferenceError

    folder, _ = files
    device = {"backend": "torch_inductor", "accelerator": "cpu", "threads": 1,
              "precision": "float32", "batch_size": 2}
    with pytest.raises(InferenceError, match="^device 'd': backend 'torch_inductor' feeds "
                                             "models of one input; .*masked.pt2 takes 2"):
        backends.open_session({"device": device, "model_path": str(folder / "masked.pt2"),
                               "layers": True, "model_format": "pt2"}, "d")


def test_a_single_array_npz_still_feeds_a_model_of_one_input_whatever_its_name(tmp_path):
    """The single-input case as before: one array, its name not the input's."""
    model = two_input_onnx()
    del model.graph.input[1]
    model.graph.node[1].input[1] = "projected"
    onnx.save(model, tmp_path / "one.onnx")
    np.savez(tmp_path / "one.npz", anything=np.ones((3, 3), np.float32))
    assert [i.name for i in formats.check_inputs(tmp_path / "one.npz",
                                                 tmp_path / "one.onnx")] == ["a"]
    np.save(tmp_path / "one.npy", np.ones((3, 2), np.float32))
    with pytest.raises(ModelFormatError, match="takes input 'a' \\(\\?, 3\\) float32$"):
        formats.check_inputs(tmp_path / "one.npy", tmp_path / "one.onnx")


def test_repro_refuses_a_node_fed_by_one_of_several_inputs_in_one_line(files, tmp_path):
    """Two records parting at the MatMul fed by input a (hand-built: one bit of its output
    flipped in a copy): the repro says it cannot cut that node alone."""
    import shutil

    import h5py

    from bitdrift.run.repro import NotReproducible, write_repro

    folder, _ = files
    path = folder / "two.onnx.onnxruntime.h5"
    if not path.is_file():  # the graph as given: `projected` recorded (see above)
        run_device(folder, "two.onnx", "two.npz", "onnxruntime",
                   graph_optimization_level="disable_all")
    shutil.copy(path, tmp_path / "a.h5")
    shutil.copy(path, tmp_path / "b.h5")
    with h5py.File(tmp_path / "b.h5", "r+") as record:
        values = record["samples/0/layers/projected"][()]
        values.view(np.uint32)[0, 0] ^= 1
        record["samples/0/layers/projected"][...] = values
    with pytest.raises(NotReproducible) as error:
        write_repro(tmp_path / "a.h5", tmp_path / "b.h5", folder / "two.onnx",
                    tmp_path / "repro", folder / "two.npz")
    assert str(error.value) == ("layer 'projected' reads the model input 'a', one of several; "
                                "a repro runs a layer fed by a recorded layer or by a model's "
                                "one input")
