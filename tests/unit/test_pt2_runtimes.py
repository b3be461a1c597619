"""The runtimes of a .pt2 program as devices (bitdrift.backends.torch_program): the device keys each
takes, and the sessions of the converted and lowered runtimes that
tests/workflow/test_pt2_model.py leaves out (OpenVINO's own conversion, ExecuTorch), each
checked against the program's module run by torch here."""

import numpy as np
import pytest
import torch

from bitdrift import backends
from bitdrift.backends.torch_program import eager as torch_export
from bitdrift.config import validate_config
from bitdrift.errors import ConfigError
from bitdrift.inputs.examples import torch_cnn


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pt2")
    torch_cnn.write(folder / "cnn.pt2", folder / "cnn.npy", samples=4)
    return folder / "cnn.pt2", np.load(folder / "cnn.npy")


def session(path, backend, **keys):
    device = {"backend": backend, "accelerator": "cpu", "threads": 1, "precision": "float32",
              "batch_size": 2, **keys}
    return backends.open_session({"device": device, "model_path": str(path), "layers": True,
                                  "model_format": "pt2"}, "d")


def config_with(device: dict) -> dict:
    return {"models": {"m": {"file": "later.pt2", "inputs": "inputs.npy"}}, "samples": [0],
            "devices": {"d": {"accelerator": "cpu", **device}}}


def test_inductor_options_belong_to_torch_inductor_alone():
    validate_config(config_with({"backend": "torch_inductor",
                                 "inductor_options": ["freezing", "max-autotune"]}))
    with pytest.raises(ConfigError, match="devices.d.inductor_options: not a setting of "
                                          "backend 'onnxruntime'"):
        validate_config(config_with({"backend": "onnxruntime", "inductor_options": ["default"]}))
    with pytest.raises(ConfigError, match="devices.d.inductor_options"):
        validate_config(config_with({"backend": "torch_inductor", "inductor_options": ["fast"]}))
    with pytest.raises(ConfigError, match="devices.d.deterministic: not a setting of backend "
                                          "'executorch'"):
        validate_config(config_with({"backend": "executorch", "deterministic": True}))


def test_an_isa_cap_the_library_would_ignore_is_refused():
    assert torch_export.environment({"env": {"ONEDNN_MAX_CPU_ISA": "avx2"}}) == {}
    with pytest.raises(ConfigError, match="ONEDNN_MAX_CPU_ISA 'AVX9'"):
        torch_export.environment({"env": {"ONEDNN_MAX_CPU_ISA": "AVX9"}})


def expected_outputs(inputs):
    module = torch_cnn.build_module()
    captured = {}
    for name in ("features.5", "pool", "classifier"):
        module.get_submodule(name).register_forward_hook(
            lambda _, __, output, name=name: captured.__setitem__(name, output.numpy()))
    with torch.no_grad():
        module(torch.from_numpy(inputs))
    return captured


def test_openvino_runs_its_own_conversion_under_the_module_paths(program):
    path, inputs = program
    opened = session(path, "openvino", inference_precision_hint="f32")
    names = [name for name, _ in opened.layers]
    assert names[-1] == "classifier" and {"features.5", "pool"} <= set(names)
    assert sorted(names + opened.unmapped) == sorted(
        name for name, _ in torch_export.program_layers(torch.export.load(str(path)))[0])
    assert opened.accelerator["converter"] == "openvino.convert_model"
    outputs = dict(zip(names, opened.run(inputs[:2]), strict=True))
    for name, value in expected_outputs(inputs[:2]).items():
        np.testing.assert_allclose(outputs[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_executorch_records_its_final_output_alone(program):
    path, inputs = program
    opened = session(path, "executorch")
    assert opened.layers == [] and "no per-layer outputs" in opened.accelerator["per_layer"]
    assert opened.accelerator["converter_versions"]["torch"] == torch.__version__
    (output,) = opened.run(inputs[:2])
    np.testing.assert_allclose(output, expected_outputs(inputs[:2])["classifier"], rtol=1e-4,
                               atol=1e-5)


def test_litert_runs_the_litert_torch_conversion_under_the_module_paths(program):
    """litert-torch folds each batch norm into its convolution and the ReLU after it: the
    .tflite keeps the ReLUs' values (channels-last, recorded channels-first), the pool's
    and the classifier's; each equals the module's output as forward hooks see it."""
    path, inputs = program
    np.save(path.parent / "inputs.npy", inputs)
    device = {"backend": "litert", "accelerator": "cpu", "threads": 1,
              "precision": "float32", "batch_size": 2}
    opened = backends.open_session({"device": device, "model_path": str(path), "layers": True,
                                    "model_format": "pt2",
                                    "dataset_path": str(path.parent / "inputs.npy")}, "d")
    names = [name for name, _ in opened.layers]
    assert names == ["features.2", "features.5", "pool", "classifier"]
    assert sorted(opened.unmapped) == ["features.0", "features.1", "features.3",
                                       "features.4"]
    assert opened.accelerator["converter"] == "litert_torch.convert"
    assert opened.accelerator["converter_versions"]["litert-torch"] == "0.10.0"
    assert opened.accelerator["model_format"] == "pt2"
    module = torch_cnn.build_module()
    captured = {}
    for name in names:
        module.get_submodule(name).register_forward_hook(
            lambda _, __, output, name=name: captured.__setitem__(name, output.numpy()))
    for start in (0, 2):
        batch = inputs[start:start + 2]
        with torch.no_grad():
            module(torch.from_numpy(batch))
        for name, value in zip(names, opened.run(batch), strict=True):
            np.testing.assert_allclose(value, captured[name], rtol=1e-4, atol=1e-5,
                                       err_msg=name)
        np.testing.assert_array_equal(opened.deployed(batch), opened.final(batch))


class Determinant(torch.nn.Module):
    """A projection, then the determinant of a 2x2 matrix: torch runs it, litert-torch
    has no lowering of aten._linalg_det."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.linalg.det(self.proj(x).reshape(-1, 2, 2))


def test_a_failed_litert_conversion_is_one_line_naming_the_op(tmp_path):
    from bitdrift.backends.torch_program.conversions import ConversionError

    torch.export.save(torch.export.export(Determinant().eval(), (torch.zeros(2, 4),)),
                      tmp_path / "det.pt2")
    np.save(tmp_path / "inputs.npy", np.ones((2, 4), np.float32))
    job = {"model_path": str(tmp_path / "det.pt2"), "layers": True, "model_format": "pt2",
           "dataset_path": str(tmp_path / "inputs.npy")}
    device = {"accelerator": "cpu", "threads": 1, "precision": "float32", "batch_size": 2}
    with pytest.raises(ConversionError) as error:
        backends.open_session({**job, "device": {**device, "backend": "litert"}}, "d")
    assert str(error.value) == (
        "litert_torch.convert (litert-torch 0.10.0, ai-edge-litert 2.3.0, torch "
        f"{torch.__version__}) cannot convert the program: Lowering not found: "
        "aten._linalg_det.default")
    # the program itself runs, on the runtime that needs no conversion
    (value,) = backends.open_session({**job, "device": {**device, "backend": "torch_export"}},
                                     "d").run(np.ones((2, 4), np.float32))[-1:]
    assert value.shape == (2,)
