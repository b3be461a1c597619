"""PyTorch's PT2E quantizer with X86InductorQuantizer as a step
(bitdrift.backends.torch_program.pt2e_quantization): the quantized .pt2, run through
bitdrift's torch eager device (every module recorded) and its torch.compile device with
freezing (fresh processes), gives the bits of the same file loaded and run directly in
torch on the same batches; the compiled one runs oneDNN's int8 kernels, the eager one
the quantize/dequantize pairs in float; the file loads in a fresh process without the
quantizer imported (bitdrift reads it weights only). A calibration set of the wrong
shape, a wrong setting, a model with nothing to quantize and ExecuTorch, which cannot run
the quantized program, are one line each."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from bitdrift.analysis.quantization_error import tensor_scales
from bitdrift.backends.torch_program.pt2e_quantization import checked_settings, quantize_model
from bitdrift.cli import main
from bitdrift.config import validate_config
from bitdrift.errors import BitdriftError, ConfigError, ModelFormatError
from bitdrift.inputs.examples import torch_cnn, torch_transformer
from bitdrift.record.reader import Record
from bitdrift.run.inference import infer

SAMPLES = list(range(4))
BATCH = 2  # dynamic quantization's activation scale is the batch's: both runs cut the same
CASES = {
    "cnn_static": ("cnn", {}),
    "encoder_dynamic_reduced": ("encoder", {"method": "dynamic", "reduce_range": True}),
}
DEVICES = {
    "eager": {"accelerator": "cpu", "backend": "torch_export", "threads": 1},
    "inductor_freezing": {"accelerator": "cpu", "backend": "torch_inductor", "threads": 1,
                          "inductor_options": ["freezing"]},
}
# the int8 kernels Inductor's freezing passes lower a quantized Conv2d / Linear to
INT8_KERNELS = {"cnn": ("onednn.qconv_pointwise", "onednn.qlinear_pointwise"),
                "encoder": ("onednn.qlinear_pointwise",)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pt2e")
    torch_transformer.write(folder / "encoder.pt2", folder / "encoder.npy", samples=6)
    torch_cnn.write(folder / "cnn.pt2", folder / "cnn.npy", samples=6)
    return folder


@pytest.fixture(scope="module")
def quantized(models):
    made = {}
    for case, (model, settings) in CASES.items():
        out = models / f"{case}.pt2"
        used = quantize_model(models / f"{model}.pt2", out, settings, models / f"{model}.npy")
        assert used == checked_settings(settings)
        made[case] = out
    return made


@pytest.fixture(scope="module")
def float_outputs(models):
    """{model: the float model's outputs on SAMPLES, run eagerly}: what every case's
    quantized outputs are compared with, run once per model."""
    return {model: run_directly(models / f"{model}.pt2",
                                np.load(models / f"{model}.npy")[SAMPLES], compiled=False)
            for model in {model for model, _ in CASES.values()}}


def run_directly(path, inputs, compiled: bool):
    """The file as a user runs it: torch.export.load, the module called per batch; or
    torch.compile'd with Inductor's freezing."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (the quantized ops)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        module = torch.export.load(str(path)).module()
        with torch.no_grad(), torch._inductor.config.patch({"freezing": compiled}):
            if compiled:
                torch._dynamo.reset()
                module = torch.compile(module, backend="inductor")
            return np.concatenate([module(torch.from_numpy(inputs[start:start + BATCH])).numpy()
                                   for start in range(0, len(inputs), BATCH)])
    finally:
        torch.set_num_threads(threads)


def run_as_device(path, inputs_path, device_name, out):
    device = {**DEVICES[device_name], "batch_size": BATCH}
    config = validate_config({"models": {"q": {"file": str(path), "inputs": str(inputs_path)}},
                              "devices": {device_name: device}, "samples": SAMPLES})
    with open(out.with_suffix(".log"), "w") as log:
        infer(model_name="q", device_name=device_name, device=config["devices"][device_name],
              model_path=path, dataset_path=inputs_path, samples=SAMPLES, out=out,
              layers=True, kernels=False, log=log)
    with Record(out) as record:
        outputs = np.stack([record.tensor(sample, "output").values[0] for sample in SAMPLES])
        return outputs, record.fingerprint["accelerator"], \
            [layer.name for layer in record.layers(0) if not layer.final]


@pytest.mark.parametrize("device_name", sorted(DEVICES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_quantized_file_runs_on_the_device_as_in_torch_directly(models, quantized, case,
                                                                     device_name, float_outputs):
    model = CASES[case][0]
    path, inputs_path = quantized[case], models / f"{model}.npy"
    inputs = np.load(inputs_path)[SAMPLES]
    compiled = device_name != "eager"
    direct = run_directly(path, inputs, compiled)
    recorded, accelerator, layers = run_as_device(path, inputs_path, device_name,
                                                  models / f"{case}_{device_name}.h5")
    assert recorded.dtype == direct.dtype == np.float32
    assert np.array_equal(recorded.view(np.uint32), direct.view(np.uint32))
    if compiled:  # int8 oneDNN kernels ran, no float convolution or matmul
        kernels = accelerator["compiled_kernels"]
        for wanted in INT8_KERNELS[model]:
            assert any(wanted in name for name in kernels), kernels
        assert not any(name in ("extern_kernels.convolution", "extern_kernels.addmm",
                                "extern_kernels.mm") for name in kernels), kernels
    else:  # every module recorded, under the float model's module paths; the scales the
        # table quantization_error reads are those of recorded layers
        assert "classifier" in layers and len(layers) >= 4
        scales = tensor_scales(path)
        if CASES[case][1].get("method") == "dynamic":  # computed per batch: no constant
            assert scales == {}
        else:
            assert scales and set(scales) <= set(layers) and min(scales.values()) > 0
    # and not the float model: its outputs differ, near them
    floats = float_outputs[model]
    assert not np.array_equal(floats, direct)
    assert np.corrcoef(floats.ravel(), direct.ravel())[0, 1] > 0.9


def op(node) -> str:
    """A quantized_decomposed node's op (``quantize_per_tensor``); '' for any other."""
    name = str(node.target).split(".")
    return name[1] if name[0] == "quantized_decomposed" else ""


def test_the_quantized_program_holds_int8_weights_per_channel(quantized):
    """Its Linear weights int8 per output channel; 7-bit activations with reduce_range."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401

    program = torch.export.load(str(quantized["cnn_static"]))
    ops = [node for node in program.graph.nodes if node.op == "call_function"]
    per_channel = [node for node in ops if op(node) == "dequantize_per_channel"]
    assert per_channel and all(node.args[-1] == torch.int8 for node in per_channel)
    activations = [node for node in ops if op(node) == "quantize_per_tensor"]
    assert activations and all(node.args[3:5] == (0, 255) for node in activations)
    dynamic = torch.export.load(str(quantized["encoder_dynamic_reduced"]))
    chosen = [node for node in dynamic.graph.nodes if node.op == "call_function"
              and op(node) == "choose_qparams"]
    assert chosen and all(node.args[1:3] == (0, 127) for node in chosen)  # 7 bits


def test_the_quantized_file_loads_in_a_fresh_process_weights_only(quantized):
    """bitdrift's loader reads it without torchao (or the quantizer) imported."""
    code = ("import sys; from bitdrift.formats.pt2 import load_program; "
            "load_program(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.startswith('torchao')))")
    done = subprocess.run([sys.executable, "-c", code, str(quantized["cnn_static"])],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_calibration_set_of_the_wrong_shape_is_one_line_and_leaves_no_file(models):
    wrong = models / "wrong.npy"
    np.save(wrong, np.zeros((6, 8, 31), np.float32))  # the encoder takes (?, 8, 32)
    out = models / "wrong" / "static.pt2"
    with pytest.raises(ModelFormatError) as raised:
        quantize_model(models / "encoder.pt2", out, {}, wrong)
    message = str(raised.value)
    assert "\n" not in message and "encoder.pt2" in message and "calibration" in message
    assert "(samples, 8, 31)" in message and "(?, 8, 32)" in message
    assert not out.exists() and (not out.parent.exists() or not any(out.parent.iterdir()))


def test_a_model_with_nothing_to_quantize_is_one_line(tmp_path):
    """No Conv2d or Linear: the quantizer annotates nothing, and saying so beats writing
    the float model under a quantized model's name."""
    class Elementwise(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x) * 2

    path = tmp_path / "tanh.pt2"
    torch.export.save(torch.export.export(Elementwise(), (torch.zeros(2, 5),)), str(path))
    np.save(tmp_path / "tanh.npy", np.ones((2, 5), np.float32))
    with pytest.raises(ModelFormatError) as raised:
        quantize_model(path, tmp_path / "q.pt2", {}, tmp_path / "tanh.npy")
    message = str(raised.value)
    assert "\n" not in message and "tanh.pt2" in message and "quantized nothing" in message
    assert not (tmp_path / "q.pt2").exists()


@pytest.mark.parametrize("settings,named", [
    ({"fromat": "QDQ"}, "quantize.fromat"),
    ({"method": "qat"}, "quantize.method"),
    ({"reduce_range": "yes"}, "quantize.reduce_range"),
    ({"weight_type": "QInt8"}, "quantize.weight_type"),  # ONNX Runtime's, not torch's
])
def test_a_wrong_setting_is_named(models, settings, named, tmp_path):
    with pytest.raises(ConfigError, match=named):
        quantize_model(models / "cnn.pt2", tmp_path / "q.pt2", settings, models / "cnn.npy")
    assert not (tmp_path / "q.pt2").exists()


def test_executorch_cannot_run_it_in_one_line(models, quantized):
    """ExecuTorch's lowering has no out variants of the quantized_decomposed ops (its
    quantized kernels are a library of their own): the device fails, naming itself, the
    model and why."""
    path = quantized["cnn_static"]
    device = {"accelerator": "cpu", "backend": "executorch", "threads": 1}
    config = validate_config({"models": {"q": {"file": str(path),
                                               "inputs": str(models / "cnn.npy")}},
                              "devices": {"et": device}, "samples": SAMPLES})
    out = models / "executorch.h5"
    with open(out.with_suffix(".log"), "w") as log, pytest.raises(BitdriftError) as raised:
        infer(model_name="q", device_name="et", device=config["devices"]["et"],
              model_path=path, dataset_path=models / "cnn.npy", samples=SAMPLES, out=out,
              layers=True, kernels=False, log=log)
    message = str(raised.value)
    assert "\n" not in message, message
    assert "'et'" in message and "model 'q'" in message, message
    assert "quantized_decomposed" in message, message


def test_the_quantize_command(models, tmp_path, capsys):
    out = tmp_path / "q.pt2"
    assert main(["quantize", "--tool", "torch", "--model-file", str(models / "cnn.pt2"),
                 "--out", str(out), "--inputs", str(models / "cnn.npy"),
                 "--reduce-range", "on"]) == 0
    assert "reduce_range True" in capsys.readouterr().out and out.is_file()
    assert main(["quantize", "--tool", "torch", "--model-file", str(models / "cnn.pt2"),
                 "--out", str(tmp_path / "x.pt2"), "--inputs", str(models / "cnn.npy"),
                 "--format", "QDQ"]) == 2
    error = capsys.readouterr().err.strip()
    assert "--format" in error and "\n" not in error and not (tmp_path / "x.pt2").exists()
