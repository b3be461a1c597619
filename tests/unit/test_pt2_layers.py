"""A torch.export program's Linear and Conv2d calls read as layers (bitdrift.formats.pt2
.file_layers) and what runs on them: effective precision, the accumulation orders the
torch_export device reveals by running each call's ATen op alone, and their replay in
numpy against the record. A tiny CNN (Conv2d, BatchNorm2d, ReLU, pooling, Flatten,
Linear, ReLU, Linear) built and exported here; truth from the module itself."""

import numpy as np
import pytest
import torch
from torch import nn

from bitdrift.formats import pt2
from bitdrift.record.orders import place_trees
from bitdrift.record.reader import Record
from bitdrift.run.inference import infer

# oneDNN and MKL capped below AVX (no FMA instructions) on every x86 CPU, so the replay
# below sums as numpy does here (rounded products), whatever CPU runs the test
CAPPED = {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
DEVICE = {"accelerator": "cpu", "backend": "torch_export", "threads": 1, "batch_size": 2,
          "precision": "float32", "env": CAPPED, "repeats": 1, "external": False}
SAMPLES = [0, 1, 2]


def tiny_cnn():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(16, 24), nn.ReLU(),
                          nn.Linear(24, 3))
    with torch.no_grad():
        model[1].running_mean.copy_(torch.randn(4) * 0.1)
        model[1].running_var.copy_(torch.rand(4) + 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pt2_layers")
    model = tiny_cnn()
    exported = torch.export.export(model, (torch.zeros(2, 3, 6, 6),), dynamic_shapes=(
        {0: torch.export.Dim("batch", max=64)},))
    torch.export.save(exported, folder / "tiny.pt2")
    np.save(folder / "inputs.npy", np.random.default_rng(4).standard_normal((4, 3, 6, 6))
            .astype(np.float32))
    return folder, model


@pytest.fixture(scope="module")
def record(program):
    folder, _ = program
    out = folder / "eager.h5"
    with open(folder / "log", "w") as log:
        infer(model_name="tiny", device_name="eager", device=DEVICE,
              model_path=folder / "tiny.pt2", dataset_path=folder / "inputs.npy",
              samples=SAMPLES, out=out, log=log)
    return out


def test_file_layers_are_the_modules_weights_and_settings(program):
    folder, model = program
    state = {name: value.numpy() for name, value in model.state_dict().items()}
    layers = {layer["name"]: layer for layer in pt2.file_layers(folder / "tiny.pt2")}
    (input_name,) = [name for name, layer in layers.items()
                     if layer["class_name"] == "InputLayer"]
    conv = layers["0"]
    assert conv["class_name"] == "Conv2D" and conv["inbound"] == [input_name]
    assert conv["config"]["data_format"] == "channels_first"
    assert conv["config"]["padding"] == "same" and conv["config"]["strides"] == [1, 1]
    np.testing.assert_array_equal(conv["weights"][0], state["0.weight"].transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(conv["weights"][1], state["0.bias"])
    for name, inbound in (("5", "4"), ("7", "6")):
        dense = layers[name]
        assert dense["class_name"] == "Dense" and dense["inbound"] == [inbound]
        np.testing.assert_array_equal(dense["weights"][0], state[f"{name}.weight"].T)
        np.testing.assert_array_equal(dense["weights"][1], state[f"{name}.bias"])
    assert layers["1"]["class_name"] == "aten.batch_norm.default" and not layers["1"]["weights"]


def tree_sum(nodes: list[list[int]], terms: np.ndarray) -> np.ndarray:
    """The float32 sums of ``terms`` (terms, units) added as the record's flat tree says:
    node k's children are terms (< n) or earlier nodes (n + index), added in index order,
    every addition rounded to float32."""
    values = list(terms)
    for children in nodes:
        total = values[min(children)]
        for child in sorted(children)[1:]:
            total = (total + values[child]).astype(np.float32)
        values.append(total)
    return values[-1]


def test_a_revealed_linear_order_replays_bit_for_bit_in_numpy(record, program):
    """The record's revealed order of Linear ``5``, replayed here (float32 products, each
    addition rounded in the tree's order, the bias its last term) from the record's own
    input of that layer and the module's weights, gives the recorded output exactly."""
    _, model = program
    with Record(record) as found:
        orders = found.accumulation_orders
        x = np.stack([found.tensor(sample, "4").values[0] for sample in SAMPLES])
        y = np.stack([found.tensor(sample, "5").values[0] for sample in SAMPLES])
    entry = orders["5"]
    assert entry["replay"] == "bit-identical without FMA", entry
    assert entry["terms"] == 16 + 1 and entry["bias"]
    # One tree for every batch row, or (MKL's row blocking on some CPUs) a tree per row,
    # the entry's map naming each row's
    batch = DEVICE["batch_size"]
    trees = entry["trees"]
    row_tree = [0] * batch if len(trees) == 1 else \
        list(place_trees(entry["places"], batch)[:, 0])
    assert all(0 <= index < len(trees) for index in row_tree), entry
    kernel = model[5].weight.detach().numpy().T
    bias = model[5].bias.detach().numpy()
    for position, sample in enumerate(SAMPLES):  # sample i sits in row i % batch
        tree = trees[row_tree[position % batch]]
        terms = np.vstack([x[position][:, None] * kernel, bias[None]]).astype(np.float32)
        np.testing.assert_array_equal(tree_sum(tree, terms).view(np.uint32),
                                      y[position].view(np.uint32), err_msg=f"sample {sample}")
    # the Conv2d's order (channels-first, probed through aten.conv2d) replays as well
    assert orders["0"]["replay"].startswith("bit-identical"), orders["0"]


def test_effective_precision_of_a_float32_device_is_float32(record, program):
    """At inference and recomputed from the record's activations and the file's weights
    (effective_precision.recheck), the Conv2d and both Linear calls are float32-like."""
    from bitdrift.analysis.effective_precision import recheck

    folder, _ = program
    with Record(record) as found:
        effective = found.effective_precision
        rechecked = recheck(found, folder / "tiny.pt2", folder / "inputs.npy")
    for results in (effective, rechecked):
        assert set(results) == {"0", "5", "7"}
        for layer, result in results.items():
            assert result["format"] == "float32" and not result["reduced"], (layer, result)
            assert result["effective_bits"] > 20, (layer, result)


def test_compiled_runtimes_record_each_call_as_not_revealed(program):
    from bitdrift.backends.torch_program.eager import compiled_unrevealed
    from bitdrift.backends.torch_program.program import load_program

    folder, _ = program
    found = compiled_unrevealed(load_program(folder / "tiny.pt2"), "torch.compile (Inductor)")
    assert found == {"0": "torch.compile (Inductor) compiles the program whole; its Conv2d "
                          "call is not probed alone",
                     "5": "torch.compile (Inductor) compiles the program whole; its Linear "
                          "call is not probed alone",
                     "7": "torch.compile (Inductor) compiles the program whole; its Linear "
                          "call is not probed alone"}


def test_the_traced_repeat_names_each_module_calls_kernels(record, program):
    """oneDNN's and MKL's verbose lines of the traced repeat fall to the module call that
    ran them: the Conv2d's convolution is oneDNN's at its own shape (batch 2, 3 -> 4
    channels, 6x6, the module's kernel and padding), each Linear's GEMM MKL's at (units,
    batch, terms); the batch norm, ReLU, pooling and flatten call neither library."""
    _, model = program
    with Record(record) as found:
        layers = found.kernels["layers"]
    conv = model[0]
    convolutions = [call for call in layers["0"]["calls"]
                    if call["library"] == "onednn" and call["primitive"] == "convolution"]
    assert convolutions and all(
        f"ic{conv.in_channels}oc{conv.out_channels}_ih6oh6kh{conv.kernel_size[0]}" in call["shape"]
        and f"ph{conv.padding[0]}" in call["shape"] for call in convolutions), layers["0"]
    for name in ("5", "7"):
        linear = model[int(name)]
        assert [(call["library"], call["primitive"], call["shape"]) for call in
                layers[name]["calls"]] == [("mkl", "sgemm", f"{linear.out_features}x"
                                            f"{DEVICE['batch_size']}x{linear.in_features}")] * 2
    assert all(not layers[name]["calls"] for name in ("1", "2", "3", "4", "6"))


def test_repro_runs_the_first_parted_call_alone_as_each_device_ran_it(record, program,
                                                                     tmp_path):
    """A second device uncapped (batch 1) parts from the SSE4.1-capped first at the
    Conv2d: `bitdrift repro` writes a torch script per device running aten.conv2d alone
    with the device's settings, and each prints the SHA-256 of the values its record holds
    (the record's own bytes, hashed here)."""
    import hashlib

    from bitdrift.run.repro import check_repro, write_repro

    folder, _ = program
    other = tmp_path / "native.h5"
    with open(tmp_path / "log", "w") as log:
        infer(model_name="tiny", device_name="native",
              device={**DEVICE, "batch_size": 1, "env": {}},
              model_path=folder / "tiny.pt2", dataset_path=folder / "inputs.npy",
              samples=SAMPLES, out=other, log=log, kernels=False)
    summary = write_repro(record, other, folder / "tiny.pt2", tmp_path / "repro",
                          dataset_path=folder / "inputs.npy")
    assert summary["layer"] == "0" and summary["class_name"] == "Conv2D"
    for path, name in ((record, "eager"), (other, "native")):
        with Record(path) as found:
            values = np.stack([found.tensor(sample, "0").values[0] for sample in SAMPLES])
        assert summary["devices"][name]["expected"] == hashlib.sha256(values.tobytes()) \
            .hexdigest()
    results = check_repro(tmp_path / "repro")
    assert all(result["reproduced"] for result in results.values()), results
    assert results["eager"]["printed"] != results["native"]["printed"]


def test_grouped_and_depthwise_conv2d_orders_are_revealed_and_replayed(tmp_path):
    """A Conv2d of 2 groups and a depthwise one (groups = channels) on torch eager: each
    output channel sums kh * kw * (channels / groups) products of its group's channels
    and its bias; each call probed alone through aten.conv2d with its groups, and numpy
    summing the recorded input per group in the revealed order gives the record's bits.
    The depthwise output is also numpy's float64 convolution within float32's rounding."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1, groups=2), nn.ReLU(),
                          nn.Conv2d(6, 6, 3, padding=1, groups=6)).eval()
    exported = torch.export.export(model, (torch.zeros(2, 4, 5, 5),), dynamic_shapes=(
        {0: torch.export.Dim("batch", max=64)},))
    torch.export.save(exported, tmp_path / "grouped.pt2")
    inputs = np.random.default_rng(6).standard_normal((4, 4, 5, 5)).astype(np.float32)
    np.save(tmp_path / "inputs.npy", inputs)
    out = tmp_path / "eager.h5"
    with open(tmp_path / "log", "w") as log:
        infer(model_name="grouped", device_name="eager", device=DEVICE,
              model_path=tmp_path / "grouped.pt2", dataset_path=tmp_path / "inputs.npy",
              samples=SAMPLES, out=out, log=log)
    with Record(out) as record:
        orders = record.accumulation_orders
        relu = record.tensor(SAMPLES[0], "1").values[0].astype(np.float64)
        depthwise = record.tensor(SAMPLES[0], "2").values[0]
    assert orders["0"]["terms"] == 3 * 3 * 2 + 1 and orders["2"]["terms"] == 3 * 3 + 1
    for layer in ("0", "2"):
        assert orders[layer]["order"] != "not revealed", orders[layer]
        assert orders[layer]["replay"].startswith("bit-identical"), orders[layer]
    weight = model[2].weight.detach().numpy().astype(np.float64)[:, 0]  # (6, 3, 3)
    padded = np.pad(relu, ((0, 0), (1, 1), (1, 1)))
    exact = np.stack([sum(padded[c, i:i + 5, j:j + 5] * weight[c, i, j] for i in range(3)
                          for j in range(3)) for c in range(6)]) + \
        model[2].bias.detach().numpy()[:, None, None]
    np.testing.assert_allclose(depthwise, exact, rtol=1e-5, atol=1e-5)
