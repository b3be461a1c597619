"""torch.export programs (.pt2): real models built here (a CNN with batch norm and a
depthwise convolution, a small attention encoder), exported and saved by torch itself,
loaded back and run eagerly; every recorded module output checked against the original
nn.Module's own, taken by forward hooks."""

import json
import os
import subprocess
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

from bitdrift.backends.torch_program import program as torch_program
from bitdrift.backends.torch_program.program import EagerRunner, ProgramError, load_program


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        # ReLU(inplace=True) exports as aten.relu_, which overwrites the batch norm's output
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
            nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def small_cnn():
    torch.manual_seed(0)
    model = SmallCNN()
    with torch.no_grad():  # batch norm statistics that are not the identity
        for norm in (model.features[1], model.features[4]):
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
    return model.eval()


def small_encoder():
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad():  # layer norms that are not the identity: a converter keeps them
        for name, parameter in model.named_parameters():
            if ".norm" in name:
                parameter.uniform_(0.5, 1.5) if name.endswith("weight") else parameter.uniform_()
    return model


def hooked_outputs(model, x):
    """{module path: output tensor} of the original module, copied as each module returns
    (an in-place ReLU after it would change it; a tuple output's first tensor), and its
    final output."""
    outputs, handles = {}, []
    for name, module in model.named_modules():
        if name:
            def hook(module, args, output, name=name):
                output = output[0] if isinstance(output, tuple) else output
                outputs[name] = output.detach().clone()
            handles.append(module.register_forward_hook(hook))
    try:
        final = model(x).detach()
    finally:
        for handle in handles:
            handle.remove()
    return outputs, final


def same_bits(array: np.ndarray, tensor: torch.Tensor) -> bool:
    """An array equal to a tensor bit for bit, in the tensor's dtype (bfloat16 by its
    bits: numpy has no bfloat16)."""
    if tensor.dtype == torch.bfloat16:
        return (array.dtype == ml_dtypes.bfloat16
                and np.array_equal(array.view(np.int16), tensor.view(torch.int16).numpy()))
    return array.dtype == tensor.numpy().dtype and np.array_equal(array, tensor.numpy())


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    model = small_cnn()
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((3, 3, 8, 8)).astype("f4"))
    path = tmp_path_factory.mktemp("pt2") / "cnn.pt2"
    batch = torch.export.Dim("batch", max=64)
    torch.export.save(torch.export.export(model, (x,), dynamic_shapes=({0: batch},)), path)
    return model, x, path


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    model = small_encoder()
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((2, 5, 16)).astype("f4"))
    path = tmp_path_factory.mktemp("pt2") / "encoder.pt2"
    torch.export.save(torch.export.export(model, (x,)), path)
    return model, x, path


def test_signature_names_shapes_dtypes_and_dynamic_dimensions(cnn, encoder):
    signature = torch_program.input_signature(load_program(cnn[2]))
    assert [(s.name, s.shape, s.dtype) for s in signature] == [("x", (None, 3, 8, 8), "float32")]
    assert signature[0].dynamic[0][1] == 64  # Dim("batch", max=64)
    unbounded = torch.export.export(nn.Linear(3, 2), (torch.randn(4, 3),),
                                    dynamic_shapes=({0: torch.export.Dim("rows")},))
    signature = torch_program.input_signature(unbounded)
    assert signature[0].shape == (None, 3) and signature[0].dynamic[0][1] is None
    signature = torch_program.input_signature(load_program(encoder[2]))
    assert [(s.shape, s.dtype, s.dynamic) for s in signature] == [((2, 5, 16), "float32", {})]


def test_inputs_that_do_not_fit_get_one_line_naming_both(cnn):
    signature = torch_program.input_signature(load_program(cnn[2]))
    torch_program.check_inputs(signature, [np.zeros((5, 3, 8, 8), "f4")], "in.npy")  # fits
    for arrays, expected in [
            ([np.zeros((2, 3, 9, 8), "f4")], "(2, 3, 9, 8) float32 but the model takes "
                                             "(?, 3, 8, 8) float32"),
            ([np.zeros((2, 3, 8, 8), "f8")], "(2, 3, 8, 8) float64 but"),
            ([np.zeros((65, 3, 8, 8), "f4")], "dimension 0 takes"),
            ([], "0 input array(s) but the model takes 1")]:
        with pytest.raises(ProgramError) as error:
            torch_program.check_inputs(signature, arrays, "in.npy")
        assert str(error.value).startswith("in.npy: ") and expected in str(error.value)
        assert "\n" not in str(error.value)


def test_damaged_or_foreign_files_get_one_line(cnn, tmp_path, capfd):
    whole = cnn[2].read_bytes()
    truncated = tmp_path / "truncated.pt2"
    truncated.write_bytes(whole[: len(whole) // 2])
    foreign = tmp_path / "foreign.pt2"
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("model/weights.bin", b"\0" * 16)
    damaged = tmp_path / "damaged.pt2"  # every entry there, the program's JSON cut short
    with zipfile.ZipFile(cnn[2]) as source, zipfile.ZipFile(damaged, "w") as archive:
        for name in source.namelist():
            data = source.read(name)
            archive.writestr(name, data[: len(data) // 2] if name.endswith("model.json")
                             else data)
    capfd.readouterr()
    for path, reason in [(truncated, "not a zip archive"), (foreign, "archive_format"),
                         (damaged, ""), (tmp_path / "missing.pt2", "no such file")]:
        with pytest.raises(ProgramError) as error:
            load_program(path)
        message = str(error.value)
        assert message.startswith(f"{path}: ") and reason in message and "\n" not in message
    assert "Traceback" not in capfd.readouterr().err  # torch's own logged traceback muted


def test_cnn_layers_are_module_paths_with_the_modules_own_outputs(cnn):
    model, x, path = cnn
    runner = EagerRunner(load_program(path))
    assert runner.layers == [f"features.{index}" for index in range(7)] + ["head"]
    assert runner.aliases == {"features": "features.6"}  # the Sequential's output is its last
    assert runner.types["features.3"] == "torch.nn.modules.conv.Conv2d"
    run = runner([x.numpy()])
    expected, final = hooked_outputs(model, x)
    assert list(run.layers) == runner.layers and run.per_layer
    for name, value in run.layers.items():
        assert same_bits(value, expected[name]), name
    # the batch norm's output as it was before the in-place ReLU: it has negative values
    assert (run.layers["features.1"] < 0).any() and (run.layers["features.2"] >= 0).all()
    assert same_bits(run.outputs[0], final)
    plain = runner([x.numpy()], record_layers=False)
    assert plain.layers == {} and same_bits(plain.outputs[0], final)


def test_encoder_layers_are_module_paths_with_the_modules_own_outputs(encoder):
    model, x, path = encoder
    runner = EagerRunner(load_program(path))
    for index in (0, 1):
        assert {f"layers.{index}.{name}" for name in
                ("self_attn", "norm1", "linear1", "linear2", "norm2")} <= set(runner.layers)
    assert runner.aliases == {"layers.0": "layers.0.norm2", "layers.1": "layers.1.norm2"}
    # topological order: the first layer's modules before the second's
    assert runner.layers.index("layers.0.norm2") < runner.layers.index("layers.1.self_attn")
    run = runner([x.numpy()])
    # with gradients on, as export traced it: under no_grad nn.TransformerEncoderLayer takes
    # its fused fast path, which torch.export does not record
    expected, final = hooked_outputs(model, x)
    for name, value in run.layers.items():
        assert same_bits(value, expected[name]), name
    assert same_bits(run.outputs[0], final)
    # the attention's output computed alone from the recorded input to it
    attention = model.layers[1].self_attn
    source = torch.from_numpy(run.layers["layers.0.norm2"])
    alone = attention(source, source, source, need_weights=False)[0].detach().numpy()
    assert np.array_equal(run.layers["layers.1.self_attn"], alone)


def test_a_module_called_twice_is_two_calls():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.act = nn.Linear(4, 4), nn.ReLU(inplace=True)

        def forward(self, x):
            return self.act(self.lin(self.act(self.lin(x))))

    torch.manual_seed(2)
    model = Twice().eval()
    x = torch.randn(3, 4)
    runner = EagerRunner(torch.export.export(model, (x,)))
    assert runner.layers == ["lin", "act", "lin@1", "act@1"]
    run = runner([x.numpy()])
    weight, bias = model.lin.weight.detach().numpy(), model.lin.bias.detach().numpy()
    first = x.numpy() @ weight.T + bias  # numpy's own sums: close, not bit for bit
    np.testing.assert_allclose(run.layers["lin"], first, rtol=1e-6, atol=1e-6)
    assert np.array_equal(run.layers["act"], np.maximum(run.layers["lin"], 0))
    np.testing.assert_allclose(run.layers["lin@1"], run.layers["act"] @ weight.T + bias,
                               rtol=1e-6, atol=1e-6)
    assert np.array_equal(run.layers["act@1"], np.maximum(run.layers["lin@1"], 0))


@pytest.mark.parametrize("precision", ["float64", "bfloat16", "float16"])
def test_precision_casts_parameters_buffers_and_inputs(cnn, precision):
    model, x, path = cnn
    run = EagerRunner(load_program(path), precision=precision)([x.numpy()])
    dtype = getattr(torch, precision)
    expected, final = hooked_outputs(small_cnn().to(dtype), x.to(dtype))  # torch's own cast
    assert same_bits(run.outputs[0], final)
    for name, value in run.layers.items():
        assert same_bits(value, expected[name]), name


def test_precision_casts_the_programs_constants_too():
    class Offset(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.offset = nn.Linear(4, 4), torch.randn(4)  # a constant, no buffer

        def forward(self, x):
            return self.lin(x) + self.offset

    torch.manual_seed(3)
    model, x = Offset().eval(), torch.randn(2, 4)
    program = torch.export.export(model, (x,))
    run = EagerRunner(program, precision="float16")([x.numpy()])
    model.offset = model.offset.half()
    assert same_bits(run.outputs[0], model.half()(x.half()).detach())  # float16, not float32


def test_threads_and_determinism_are_set_and_reported(cnn):
    before = torch.get_num_threads()
    try:
        EagerRunner(load_program(cnn[2]), threads=1, deterministic=True)
        settings = torch_program.settings()
        assert settings["threads"] == 1 == torch.get_num_threads()
        assert settings["deterministic"] is torch.are_deterministic_algorithms_enabled() is True
    finally:
        torch.set_num_threads(before)
        torch.use_deterministic_algorithms(False)


def test_process_environment_caps_onednn_mkl_and_aten_in_a_fresh_process(cnn):
    environment = torch_program.process_environment(
        onednn_max_cpu_isa="avx2", mkl_cbwr="compatible", aten_cpu_capability="AVX2")
    assert environment == {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE",
                           "ATEN_CPU_CAPABILITY": "avx2"}
    code = ("import sys, json, numpy as np\n"
            "from bitdrift.backends.torch_program import program as tp\n"
            "tp.EagerRunner(tp.load_program(sys.argv[1]))([np.ones((2, 3, 8, 8), 'f4')])\n"
            "print('SETTINGS', json.dumps(tp.settings()))\n")
    done = subprocess.run(
        [sys.executable, "-c", code, str(cnn[2])], capture_output=True, text=True, check=True,
        env={**os.environ, **environment, "ONEDNN_VERBOSE": "1", "MKL_VERBOSE": "1"})
    # each library says what it runs: oneDNN's ISA, MKL's reproducibility branch
    assert "isa:Intel AVX2" in done.stdout and "AVX-512" not in done.stdout
    assert "CNR:COMPATIBLE" in done.stdout
    settings = json.loads(done.stdout.split("SETTINGS ", 1)[1])
    assert settings["aten_cpu_capability"].lower() == "avx2"
    assert settings["onednn_max_cpu_isa"] == "AVX2" and settings["mkl_cbwr"] == "COMPATIBLE"
    for wrong in ({"onednn_max_cpu_isa": "AVX3"}, {"mkl_cbwr": "AVX2,LOOSE"},
                  {"aten_cpu_capability": "sse"}):
        with pytest.raises(ProgramError, match="is not one of"):
            torch_program.process_environment(**wrong)
