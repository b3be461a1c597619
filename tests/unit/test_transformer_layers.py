"""Transformer blocks through the real runtimes: an attention encoder and a causal decoder
(bitdrift.inputs.examples.torch_transformer) exported to ONNX by torch.onnx.export (opset
17, the heads split by a reshape to a traced or a constant shape: MatMul nodes on 3-D
activations (batch, tokens, features), attention's Q @ K^T and softmax @ V as MatMul
nodes of two 4-D activations) and to .pt2 by torch.export (Linear calls on 3-D
activations), run on ONNX Runtime, OpenVINO and torch eager at batch sizes 1, 2 and 3. No
device fails; every summing layer is replayed bit for bit where its order is revealed,
or says why not; the replay's verdict is checked against the recorded output recomputed
here, in exact arithmetic, from the recorded operands in the revealed tree; and
`bitdrift repro` of a 3-D Linear writes scripts that give the records' bits."""

import json
from fractions import Fraction

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from bitdrift.config import validate_config
from bitdrift.inputs.examples import onnx_transformer, torch_transformer
from bitdrift.record.reader import Record
from bitdrift.run.inference import infer
from bitdrift.run.repro import check_repro, write_repro

# oneDNN and MKL capped below AVX (no FMA instructions) on every x86 CPU: this device's
# Linear layers sum rounded products, where the uncapped device fuses them (FMA, on every
# x86-64 CPU the sessions run on): their records part at the first Linear
CAPPED = {"ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
DEVICES = {
    "ort_all": {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1,
                "graph_optimization_level": "all", "batch_size": 2},
    "ort_no_optimizations": {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1,
                             "graph_optimization_level": "disable_all", "batch_size": 3},
    "openvino_f32": {"accelerator": "cpu", "backend": "openvino", "threads": 1,
                     "inference_precision_hint": "f32", "batch_size": 3},
    "openvino_f32_b1": {"accelerator": "cpu", "backend": "openvino", "threads": 1,
                        "inference_precision_hint": "f32", "batch_size": 1},
    "torch_eager": {"accelerator": "cpu", "backend": "torch_export", "threads": 1,
                    "batch_size": 2},
    "torch_eager_b3": {"accelerator": "cpu", "backend": "torch_export", "threads": 1,
                       "batch_size": 3},
    "torch_capped": {"accelerator": "cpu", "backend": "torch_export", "threads": 1,
                     "batch_size": 2, "env": CAPPED},
}
# (model file, device) of each record
RUNS = [("encoder.onnx", "ort_all"), ("encoder.onnx", "ort_no_optimizations"),
        ("encoder.onnx", "openvino_f32"),
        ("encoder.onnx", "torch_capped"), ("decoder.onnx", "ort_no_optimizations"),
        ("decoder.onnx", "openvino_f32_b1"), ("encoder.pt2", "torch_eager"),
        ("encoder.pt2", "torch_capped"), ("decoder.pt2", "torch_eager_b3"),
        ("dynamo.onnx", "ort_no_optimizations")]
SAMPLES = [0, 1, 2, 5]
ONNX_RUNTIMES = ("onnxruntime", "openvino")
# the ONNX export's MatMul nodes (by their output, as the orders and effective precision
# name them; the record's tensors by stored()): the Linear layers on (batch, tokens,
# features), and attention's two products of activations
LINEARS = [f"/block/attention/{name}/MatMul_output_0"
           for name in ("query", "key", "value", "out")] + \
    ["/block/expand/MatMul_output_0", "/block/contract/MatMul_output_0"]
ATTENTION = ["/block/attention/MatMul_output_0", "/block/attention/MatMul_1_output_0"]


def stored(name: str) -> str:
    """A value's name as the record's tensors have it (HDF5 takes "/" for a path)."""
    return name.replace("/", "__")
PT2_LINEARS = ["block.attention.query", "block.attention.key", "block.attention.value",
               "block.expand", "block.contract"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("transformer")
    # the encoder's heads split by the input's traced shape (Shape, Gather, Concat and
    # Reshape nodes: the shapes only ONNX's data propagation knows), the decoder's by
    # constants
    onnx_transformer.write(folder / "encoder.onnx", folder / "inputs.npy", samples=6,
                           traced_shapes=True)
    onnx_transformer.write(folder / "decoder.onnx", folder / "inputs.npy", samples=6,
                           causal=True)
    torch_transformer.write(folder / "encoder.pt2", folder / "inputs.npy", samples=6)
    # the encoder through torch.onnx.export's dynamo exporter too (constants folded into
    # initializers): on it the replay of a 3-D MatMul once failed the device ("operands
    # could not be broadcast together with shapes (3,256,1) (1,32,32)")
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch_transformer.build_module(0, traced_shapes=True),
                          (torch.zeros((2, *torch_transformer.INPUT_SHAPE)),), dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("batch", max=1024)},),
                          verbose=False).save(str(folder / "dynamo.onnx"))
    torch_transformer.write(folder / "decoder.pt2", folder / "inputs.npy", samples=6,
                            causal=True)
    records = {}
    with open(folder / "log", "w") as log:
        for model, device in RUNS:
            config = validate_config({"models": {"m": {"file": str(folder / model),
                                                       "inputs": str(folder / "inputs.npy")}},
                                      "devices": {device: dict(DEVICES[device])},
                                      "samples": SAMPLES})
            out = folder / f"{model}.{device}.h5"
            # kernels: the first repeat reveals the orders, the traced one logs kernels
            infer(model_name=model, device_name=device, device=config["devices"][device],
                  model_path=folder / model, dataset_path=folder / "inputs.npy",
                  samples=SAMPLES, out=out, layers=True, kernels=True, log=log)
            records[(model, device)] = out
    return folder, records


def orders_of(path) -> dict:
    with Record(path) as record:
        return record.accumulation_orders


def test_no_device_fails_and_every_summing_layer_says_what_was_done(runs):
    """Every device's record is written (infer raised for none), and every summing layer
    has an order and a replay verdict: bit for bit where revealed, else the reason."""
    folder, records = runs
    assert sorted(records) == sorted(RUNS)
    for (model, device), path in records.items():
        orders = orders_of(path)
        assert orders, (model, device)
        for layer, entry in orders.items():
            said = entry.get("replay", "")
            if entry["order"] == "not revealed":
                assert said, (model, device, layer)  # the reason
            else:
                assert said.startswith(("bit-identical", "not replayed: ")), \
                    (model, device, layer, said)
        with Record(path) as record:
            effective = record.effective_precision
        for layer, result in effective.items():  # float32 devices (f32 hint on OpenVINO)
            assert result.get("format") == "float32", (model, device, layer, result)


@pytest.mark.parametrize("model,device", [("encoder.onnx", "ort_all"),
                                          ("encoder.onnx", "openvino_f32"),
                                          ("decoder.onnx", "ort_no_optimizations"),
                                          ("decoder.onnx", "openvino_f32_b1")])
def test_the_onnx_exports_3d_and_attention_matmuls_are_revealed_and_replayed(runs, model,
                                                                            device):
    """Through ONNX Runtime and OpenVINO: each MatMul on (batch, tokens, features) sums
    its features per token, a place per token (grid 1 x tokens); attention's Q @ K^T and
    softmax @ V per head and token (grid heads x tokens) of the features per head; each
    replayed from the record bit for bit."""
    _, records = runs
    orders = orders_of(records[(model, device)])
    with Record(records[(model, device)]) as record:
        # ONNX Runtime records the graph it deploys: at level "all" it fuses Q @ K^T with
        # its scaling into one node, whose MatMul output no longer exists (unmapped)
        unmapped = record.json_attr("unmapped_layers", list, [])
    assert not unmapped or device == "ort_all", unmapped
    tokens, features, heads = (torch_transformer.TOKENS, torch_transformer.FEATURES,
                               torch_transformer.HEADS)
    for layer in LINEARS + ATTENTION:
        if layer in unmapped:
            assert layer not in orders, (layer, orders[layer])
            continue
        entry = orders[layer]
        assert entry["order"] != "not revealed", (layer, entry)
        assert entry["replay"].startswith("bit-identical"), (layer, entry)
        assert not entry["bias"]  # torch.onnx.export adds the bias in an Add node
    expand = orders["/block/expand/MatMul_output_0"]
    assert expand["terms"] == features and expand["places"]["grid"] == [1, tokens]
    contract = orders["/block/contract/MatMul_output_0"]
    assert contract["terms"] == torch_transformer.HIDDEN
    scores, attended = (orders.get(layer) for layer in ATTENTION)
    if scores is not None:
        assert scores["terms"] == features // heads  # Q @ K^T: the features of a head
        assert scores["places"]["grid"] == [heads, tokens]
    assert attended["terms"] == tokens  # softmax @ V: the tokens attended to
    assert attended["places"]["grid"] == [heads, tokens]
    # the classifier's Gemm over (batch, features) keeps its form: one place per row
    assert orders["logits"]["places"]["grid"] == [1, 1]


def test_the_dynamo_exports_matmuls_are_each_revealed_and_replayed(runs):
    """The encoder exported by the dynamo exporter (its own node names; its Linear layers
    MatMul nodes on 3-D activations, and the classifier's): every MatMul and Gemm node,
    the two attention products among them, revealed and replayed bit for bit."""
    _, records = runs
    orders = orders_of(records[("dynamo.onnx", "ort_no_optimizations")])
    assert len(orders) == len(LINEARS) + len(ATTENTION) + 1  # and the classifier
    for layer, entry in orders.items():
        assert entry["order"] != "not revealed", (layer, entry)
        assert entry["replay"].startswith("bit-identical"), (layer, entry)
    grids = sorted(tuple(entry["places"]["grid"]) for entry in orders.values())
    tokens, heads = torch_transformer.TOKENS, torch_transformer.HEADS
    assert grids == sorted([(1, 1)] + [(1, tokens)] * len(LINEARS) + [(heads, tokens)] * 2)


def nearest_float32(value: Fraction) -> np.float32:
    """The float32 nearest to an exact value, ties to even."""
    guess = np.float32(float(value))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess,
                  np.nextafter(guess, np.float32(np.inf))]
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - value),
                                          int(np.asarray(c).view(np.uint32)) & 1))


def tree_sum(nodes: list, left: np.ndarray, right: np.ndarray, fma: bool) -> np.float32:
    """One dot product of float32 vectors summed in a flat tree (a child below
    len(left) a product, else an earlier node), in exact arithmetic rounded to float32
    at each step: without FMA every product rounded, every addition rounded; with FMA a
    product meeting one operand is added to it exactly and rounded once (two products:
    the later-indexed one fused onto the other, rounded alone). A node of more operands
    adds them in the order of their first term, each addition rounded."""
    terms = len(left)
    exact = [Fraction(float(a)) * Fraction(float(b)) for a, b in zip(left, right, strict=True)]
    values, first = [], []
    for node in nodes:
        children = sorted(node, key=lambda c: c if c < terms else first[c - terms])
        first.append(min(c if c < terms else first[c - terms] for c in node))
        products = [k for k, c in enumerate(children) if c < terms]
        if fma and len(children) == 2 and products:
            fused = products[-1]
            other = children[1 - fused]
            base = nearest_float32(exact[other]) if other < terms else values[other - terms]
            values.append(nearest_float32(Fraction(float(base)) + exact[children[fused]]))
            continue
        total = None
        for child in children:
            value = nearest_float32(exact[child]) if child < terms else values[child - terms]
            total = value if total is None else nearest_float32(
                Fraction(float(total)) + Fraction(float(value)))
        values.append(total)
    return values[-1]


def check_against_exact(record, entry, layer, operands, count=40):
    """``count`` recorded values of ``layer`` (spread over samples and places whose tree
    is known) against tree_sum of its operands (``operands(sample, place, unit)`` ->
    (left, right) float32 vectors) in the replay's FMA reading; returns the values
    checked."""
    fma = "with FMA" in entry["replay"]
    order = json.loads(record.attr("samples_order"))
    maps = ["".join(lines) for lines in entry["places"]["maps"]]
    symbols = "0123456789abcdefghijklmnopqrstuvwxyz"
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(count):
        run = int(rng.integers(len(order)))
        output = record.tensor(order[run], stored(layer)).values[0]
        places = output.reshape(-1, output.shape[-1])
        place, unit = int(rng.integers(len(places))), int(rng.integers(output.shape[-1]))
        symbol = maps[run % len(maps)][place]
        if symbol not in symbols:
            continue
        tree = entry["trees"][symbols.index(symbol)]
        left, right = operands(order[run], place, unit)
        expected = tree_sum(tree, left, right, fma)
        assert places[place, unit].view(np.uint32) == np.float32(expected).view(np.uint32), \
            (layer, order[run], place, unit)
        checked += 1
    return checked


def test_a_3d_matmuls_replay_is_the_record_recomputed_exactly(runs):
    """ONNX Runtime's 3-D MatMul (the feed-forward's expansion: the recorded LayerNorm
    output times the file's weight) and attention's Q @ K^T (the two recorded 4-D
    operands): the recorded values are the revealed tree summed in exact arithmetic,
    rounded as the replay's verdict says (with or without FMA), computed here. Without
    graph optimisations, so that ONNX Runtime deploys Q @ K^T as its own MatMul."""
    folder, records = runs
    path = records[("encoder.onnx", "ort_no_optimizations")]
    graph = onnx.load(folder / "encoder.onnx").graph
    initializers = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    node = next(node for node in graph.node
                if node.output[0] == "/block/expand/MatMul_output_0")
    weight = initializers[node.input[1]].astype(np.float32)
    orders = orders_of(path)
    with Record(path) as record:
        norm = stored(node.input[0])

        def expand_operands(sample, place, unit):
            return record.tensor(sample, norm).values[0][place], weight[:, unit]

        assert check_against_exact(record, orders[LINEARS[4]], LINEARS[4],
                                   expand_operands) > 20
        queries, keys = (stored(name) for name in next(
            node for node in graph.node
            if node.output[0] == "/block/attention/MatMul_output_0").input)

        def score_operands(sample, place, unit):
            tokens = torch_transformer.TOKENS
            head, token = divmod(place, tokens)
            return (record.tensor(sample, queries).values[0][head, token],
                    record.tensor(sample, keys).values[0][head, :, unit])

        assert check_against_exact(record, orders[ATTENTION[0]], ATTENTION[0],
                                   score_operands) > 20
        # and Q @ K^T is what numpy's float64 product of the recorded operands is
        sample = SAMPLES[0]
        q, k = (record.tensor(sample, name).values[0].astype(np.float64)
                for name in (queries, keys))
        np.testing.assert_allclose(record.tensor(sample, stored(ATTENTION[0])).values[0], q @ k,
                                   rtol=1e-5, atol=1e-5)


def test_the_attention_matmuls_effective_precision_is_checked_from_their_operands(runs):
    """Q @ K^T and softmax @ V, with no weights in the file, are checked from the record's
    two operands: each a fan-in of the features per head, or of the tokens."""
    _, records = runs
    with Record(records[("encoder.onnx", "openvino_f32")]) as record:
        effective = record.effective_precision
    tokens, features, heads = (torch_transformer.TOKENS, torch_transformer.FEATURES,
                               torch_transformer.HEADS)
    assert effective[ATTENTION[0]]["fan_in"] == features // heads
    assert effective[ATTENTION[1]]["fan_in"] == tokens
    for layer in LINEARS + ATTENTION:
        assert effective[layer]["class_name"] in ("Dense", "MatMul")
        assert not effective[layer]["reduced"], (layer, effective[layer])


@pytest.mark.parametrize("model,device", [("encoder.pt2", "torch_eager"),
                                          ("encoder.pt2", "torch_capped"),
                                          ("decoder.pt2", "torch_eager_b3")])
def test_a_programs_3d_linears_are_revealed_and_replayed_on_torch(runs, model, device):
    """torch eager's Linear calls on (batch, tokens, features), each probed as its own
    ATen op at its input's shape: revealed per token and replayed bit for bit; the output
    projection, fed by a reshape inside the attention module (no module's output: not
    recorded), says so."""
    _, records = runs
    orders = orders_of(records[(model, device)])
    for layer in PT2_LINEARS:
        assert orders[layer]["order"] != "not revealed", (layer, orders[layer])
        assert orders[layer]["places"]["grid"] == [1, torch_transformer.TOKENS]
        assert orders[layer]["replay"].startswith("bit-identical"), (layer, orders[layer])
    assert orders["block.attention.out"]["replay"] == \
        "not replayed: its input is not recorded"
    if device == "torch_capped":  # no FMA instruction below AVX: rounded products
        assert "without FMA" in orders["block.expand"]["replay"]


def test_a_repro_of_a_3d_linear_runs_on_each_device(runs, tmp_path):
    """The program on torch eager with and without FMA parts at its first Linear on
    (batch, tokens, features); the repro's scripts run that Linear alone and print each
    record's bits."""
    folder, records = runs
    summary = write_repro(records[("encoder.pt2", "torch_eager")],
                          records[("encoder.pt2", "torch_capped")], folder / "encoder.pt2",
                          tmp_path / "repro", folder / "inputs.npy")
    assert summary["layer"] == "block.attention.query"
    assert np.load(tmp_path / "repro" / "input.npy").shape == (
        len(SAMPLES), *torch_transformer.INPUT_SHAPE)
    results = check_repro(tmp_path / "repro")
    assert set(results) == {"torch_eager", "torch_capped"}
    for device, result in results.items():
        assert result["reproduced"], (device, result)


def test_a_repro_of_an_onnx_3d_matmul_runs_or_says_why(runs, tmp_path):
    """ONNX Runtime (FMA) against torch eager capped below FMA on onnx2torch's conversion:
    they part at the first MatMul on (batch, tokens, features); ONNX Runtime's script runs
    that node cut from the file and prints its record's bits; torch eager's is refused in
    one line naming why."""
    folder, records = runs
    summary = write_repro(records[("encoder.onnx", "ort_all")],
                          records[("encoder.onnx", "torch_capped")], folder / "encoder.onnx",
                          tmp_path / "repro", folder / "inputs.npy")
    assert summary["layer"] == stored(LINEARS[0]) and summary["class_name"] == "MatMul"
    results = check_repro(tmp_path / "repro")
    assert results["ort_all"]["reproduced"], results
    assert results["torch_capped"]["why"].startswith("torch_export: "), results
