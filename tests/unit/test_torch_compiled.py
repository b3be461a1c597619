"""A torch.export program compiled by Inductor, converted to ONNX (run on ONNX Runtime),
to OpenVINO and to ExecuTorch (XNNPACK): the models of test_torch_program, each run checked
against the eager program's outputs, and a model with an op no converter has failing each
conversion with the converter and the op named."""

import numpy as np
import onnx
import onnxruntime
import openvino
import pytest
import torch
from torch import nn

from bitdrift.backends.torch_program import conversions as torch_conversions
from bitdrift.backends.torch_program import inductor as torch_inductor
from bitdrift.backends.torch_program import program as torch_program
from bitdrift.backends.torch_program.conversions import ConversionError
from bitdrift.backends.torch_program.program import EagerRunner, load_program
from tests.unit.test_torch_program import cnn, encoder  # noqa: F401 (fixtures)

# float32 kernels summing in another order: the same values to a few ulps of the outputs
CLOSE = {"rtol": 1e-5, "atol": 1e-5}


class Eigenvalues(nn.Module):
    """torch.linalg.eigh: an op in torch.export's ATen that neither the ONNX exporter,
    OpenVINO's frontend nor ExecuTorch's core opset has."""

    def forward(self, x):
        return torch.linalg.eigh(x @ x.transpose(-1, -2))[0]


@pytest.fixture(scope="module")
def eigenvalues():
    return torch.export.export(Eigenvalues(), (torch.randn(2, 4, 4),))


@pytest.mark.parametrize("options, kernel", [(("default",), "extern_kernels.convolution"),
                                             (("freezing",), "mkldnn._convolution_pointwise")])
def test_inductor_records_the_final_output_and_its_kernels_not_layers(cnn, options,  # noqa: F811
                                                                      kernel):
    model, x, path = cnn
    program = load_program(path)
    eager = EagerRunner(program)([x.numpy()])
    run = torch_inductor.CompiledRunner(program, options=options)([x.numpy()])
    np.testing.assert_allclose(run.outputs[0], eager.outputs[0], **CLOSE)
    assert run.per_layer is False and run.layers == {} and "no per-layer outputs" in run.note
    # Inductor's own C++ kernels, and the convolution it calls: a library call by default,
    # oneDNN's pre-packed convolution once the weights are frozen into constants
    assert any(name.startswith("cpp_fused_") for name in run.kernels)
    assert any(kernel in name for name in run.kernels), run.kernels


def test_inductor_kernel_names_come_from_the_generated_code():
    code = ("cpp_fused_relu_0 = async_compile.cpp_pybinding(['float*'], '''...''')\n"
            "        extern_kernels.addmm(arg1_1, buf0, arg2_1, alpha=1, beta=1, out=buf1)\n"
            "        cpp_fused_relu_0(buf1)\n"
            "        buf2 = torch.ops.mkldnn._convolution_pointwise.default(buf1, w, b)\n"
            "aten = torch.ops.aten\n")
    assert torch_inductor.kernel_names(code) == [
        "extern_kernels.addmm", "cpp_fused_relu_0",
        "torch.ops.mkldnn._convolution_pointwise.default"]
    with pytest.raises(torch_program.ProgramError, match="max-autotune"):
        torch_inductor.inductor_options(["fastest"])
    assert torch_inductor.inductor_options(["max-autotune", "freezing"]) == {
        "max_autotune": True, "freezing": True}


def onnx_run(conversion, layers, inputs):
    """The converted model on ONNX Runtime: its outputs, and {layer: value} for the layers
    whose ONNX values onnx_module_outputs finds."""
    mapping = torch_conversions.onnx_module_outputs(conversion.model, layers)
    model = torch_conversions.with_outputs(conversion.model, list(mapping.values()))
    session = onnxruntime.InferenceSession(model.SerializeToString())
    names = [output.name for output in session.get_outputs()]
    values = dict(zip(names, session.run(None, dict(zip(
        [i.name for i in session.get_inputs()], inputs, strict=True))), strict=True))
    outputs = [values[output.name] for output in conversion.model.graph.output]
    return outputs, {layer: values[value] for layer, value in mapping.items()}


def test_onnx_export_runs_on_onnxruntime_with_the_layers_it_keeps(cnn, encoder,  # noqa: F811
                                                                  tmp_path):
    for (_, x, path), kept, absent in [
            (cnn, {f"features.{i}" for i in (1, 2, 4, 5, 6)} | {"head"}, {"features.0"}),
            (encoder, {f"layers.{i}.{name}" for i in (0, 1) for name in
                       ("self_attn", "norm1", "linear1", "linear2", "norm2")},
             {"layers.0.dropout1"})]:
        program = load_program(path)
        runner = EagerRunner(program)
        eager = runner([x.numpy()])
        conversion = torch_conversions.to_onnx(program, tmp_path / f"{path.stem}.onnx")
        assert conversion.path.is_file() and isinstance(conversion.model, onnx.ModelProto)
        assert conversion.fingerprint()["converter_versions"]["onnxscript"]
        outputs, layers = onnx_run(conversion, runner.layers, [x.numpy()])
        np.testing.assert_allclose(outputs[0], eager.outputs[0], **CLOSE)
        # the exporter's optimiser folds each batch norm into its convolution, and drops
        # dropout in eval mode: those modules have no value of their own
        assert set(layers) == kept and not absent & set(layers)
        for name, value in layers.items():
            np.testing.assert_allclose(value, eager.layers[name], err_msg=name, **CLOSE)


def test_openvino_converts_the_program_with_the_layers_it_keeps(cnn, encoder):  # noqa: F811
    for (_, x, path), kept in [
            (cnn, {f"features.{i}" for i in (1, 2, 4, 5, 6)} | {"head"}),
            (encoder, {f"layers.{i}.{name}" for i in (0, 1) for name in
                       ("self_attn", "norm1", "linear1", "linear2", "norm2")})]:
        program = load_program(path)
        eager = EagerRunner(program)([x.numpy()])
        conversion = torch_conversions.to_openvino(program)
        assert conversion.fingerprint()["converter"] == "openvino.convert_model"
        # OpenVINO folds each batch norm into its convolution too: features.0 is absent
        assert set(conversion.layers) == kept
        positions = torch_conversions.openvino_with_outputs(conversion)
        # float32 as the program is: the CPU plugin computes in bfloat16 by default where
        # the CPU has it (this one does)
        compiled = openvino.compile_model(conversion.model, "CPU",
                                          {"INFERENCE_PRECISION_HINT": "f32"})
        results = compiled(x.numpy())
        np.testing.assert_allclose(results[0], eager.outputs[0], **CLOSE)
        for name, position in positions.items():
            np.testing.assert_allclose(results[position], eager.layers[name], err_msg=name,
                                       **CLOSE)


def test_executorch_xnnpack_runs_the_program(cnn, tmp_path):  # noqa: F811
    from bitdrift.backends.torch_program.executorch_runner import ExecuTorchRunner

    model, x, path = cnn
    program = load_program(path)
    eager = EagerRunner(program)([x.numpy()])
    conversion = torch_conversions.to_executorch(program, tmp_path / "cnn.pte")
    runner = ExecuTorchRunner(conversion.path, torch_program.input_signature(program),
                              threads=1)
    assert "XnnpackBackend" in runner.backends and runner.threads == 1
    run = runner([x.numpy()])
    np.testing.assert_allclose(run.outputs[0], eager.outputs[0], **CLOSE)
    assert run.per_layer is False and "no per-layer outputs" in run.note
    damaged = tmp_path / "damaged.pte"
    damaged.write_bytes(conversion.path.read_bytes()[:200])
    with pytest.raises(torch_program.ProgramError, match="cannot load") as error:
        ExecuTorchRunner(damaged, torch_program.input_signature(program))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("convert, converter, reason", [
    (lambda program, out: torch_conversions.to_onnx(program, out / "m.onnx"),
     "torch.onnx.export(dynamo=True) (torch 2", "No ONNX function found for"),
    (lambda program, out: torch_conversions.to_openvino(program),
     "openvino.convert_model (openvino 20", "No conversion rule found for operations"),
    (lambda program, out: torch_conversions.to_executorch(program, out / "m.pte"),
     "executorch.exir.to_edge_transform_and_lower", "not in Core ATen opset")])
def test_a_conversion_that_fails_names_the_converter_and_the_op(eigenvalues, tmp_path,
                                                               convert, converter, reason):
    with pytest.raises(ConversionError) as error:
        convert(eigenvalues, tmp_path)
    message = str(error.value)
    assert message.startswith(converter) and reason in message, message
    assert "linalg_eigh" in message and "\n" not in message
    assert not list(tmp_path.iterdir())  # nothing half-written left
