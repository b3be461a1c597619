"""Revealing a kernel's summation order (FPRev's method): on sums whose order is built by
hand, the revealed tree is the one built; a wider accumulator is refused."""

import numpy as np
import pytest

from bitdrift.analysis.accumulation.names import describe
from bitdrift.analysis.accumulation.reveal import build_tree, meeting_sizes
from bitdrift.analysis.accumulation.trees import OrderError

F32 = np.float32


def sequential(rows):
    total = rows[0].copy()
    for row in rows[1:]:
        total = (total + row).astype(F32)
    return total


def pairwise(rows):
    if len(rows) == 1:
        return rows[0]
    half = len(rows) // 2
    return (pairwise(rows[:half]) + pairwise(rows[half:])).astype(F32)


def lanes(count):
    """``count`` interleaved partial sums (term k in lane k mod count), then pairwise."""
    def summed(rows):
        return pairwise([sequential(rows[lane::count]) for lane in range(count)])
    return summed


def blocks(size):
    """Contiguous blocks summed in order, then the blocks' sums in order."""
    def summed(rows):
        return sequential([sequential(rows[first:first + size])
                           for first in range(0, len(rows), size)])
    return summed


def as_dense(order):
    """A Dense call of a row of ones: each output column sums its weights in ``order``."""
    return lambda weights: order(list(weights.astype(F32)))


def reveal(order, n):
    return build_tree(meeting_sizes(as_dense(order), n))


def test_sequential_and_pairwise_trees_are_the_ones_built():
    assert reveal(sequential, 4).as_list() == [[[0, 1], 2], 3]
    assert describe(reveal(sequential, 32)) == {"terms": 32, "height": 31, "widest": 2,
                                                "shape": "sequential"}
    assert reveal(pairwise, 4).as_list() == [[0, 1], [2, 3]]
    assert describe(reveal(pairwise, 64))["shape"] == "pairwise"
    assert describe(reveal(pairwise, 64))["height"] == 6


@pytest.mark.parametrize("count", [2, 4, 8])
def test_interleaved_lanes_are_found(count):
    found = describe(reveal(lanes(count), 64))
    assert found["shape"] == "lanes" and found["lanes"] == count


def test_blocks_are_found():
    found = describe(reveal(blocks(16), 64))
    assert found["shape"] == "blocks" and found["block"] == 16 and found["blocks"] == 4


def test_a_deep_tree_is_kept_flat_and_replayed_without_recursion():
    """A sequential sum of 3000 terms (3000 deep): kept as flat lists, read back the same,
    and replayed (equal to numpy's own sequential float32 sum)."""
    from bitdrift.analysis.accumulation.replay import replay
    from bitdrift.analysis.accumulation.reveal import reveal
    from bitdrift.analysis.accumulation.trees import from_flat, to_flat

    n = 3000
    tree = reveal(dense_in_order(sequential), terms=n, units=64, bias=False)
    flat = to_flat(tree)
    assert to_flat(from_flat(flat, n)) == flat and len(flat) == n - 1
    x = np.random.default_rng(1).standard_normal((2, n)).astype(F32)
    w = np.random.default_rng(2).standard_normal((n, 3)).astype(F32)
    products = [(x[:, k:k + 1] * w[k]).astype(F32) for k in range(n)]
    assert np.array_equal(replay(from_flat(flat, n), x, w, None, fma=False),
                          sequential(products))


def test_a_wider_accumulator_does_not_swamp_and_is_refused():
    def in_float64(weights):
        return weights.astype(np.float64).sum(axis=0)

    with pytest.raises(OrderError, match="does not swamp"):
        meeting_sizes(in_float64, 16)


def dense_in_order(order, bias_order="last"):
    """A Dense call (weights, bias) -> (2 rows, units) summing each column in ``order``,
    the bias added last."""
    def dense(weights, shift):
        sums = order(list(weights.astype(F32)))
        return np.stack([(sums + shift).astype(F32)] * 2)
    return dense


@pytest.mark.parametrize("order,expected", [(sequential, "sequential, bias last"),
                                            (pairwise, "pairwise, bias last"),
                                            (lanes(4), "4 interleaved lanes, bias last"),
                                            (blocks(8), "blocks of 8, bias last")])
def test_the_recursive_search_finds_the_tree_the_all_pairs_search_finds(order, expected):
    from bitdrift.analysis.accumulation.names import summary
    from bitdrift.analysis.accumulation.reveal import reveal

    tree = reveal(dense_in_order(order), terms=32, units=5)
    assert summary(tree) == expected
    products = next(child for child in tree.children if child != 32)
    assert products.as_list() == reveal_all_pairs(order, 32)


def reveal_all_pairs(order, n):
    return reveal(order, n).as_list()


def blocks_each(size, inner, mixed=False):
    """Contiguous blocks of ``size`` each summed by ``inner`` (a function of a list of
    rows), the blocks' sums in order; ``mixed``: the first block summed pairwise instead."""
    def summed(rows):
        parts = [rows[first:first + size] for first in range(0, len(rows), size)]
        return sequential([pairwise(part) if mixed and index == 0 else inner(part)
                           for index, part in enumerate(parts)])
    return summed


def lanes_of_lanes(outer, inner):
    """``outer`` interleaved partial sums, each itself ``inner`` interleaved partial sums
    of its terms (sequential), combined in order: term k in lane k mod (outer * inner)."""
    def summed(rows):
        return sequential([sequential([sequential(lane[k::inner]) for k in range(inner)])
                           for lane in (rows[j::outer] for j in range(outer))])
    return summed


@pytest.mark.parametrize("order,terms,expected,phrase", [
    # each block of 8 pairwise: 3 additions deep, not 7 as a sequential block
    (blocks_each(8, pairwise), 32, "blocks of 8, each pairwise",
     "in blocks of 8 terms, each summed pairwise (balanced halves), then the blocks' sums"),
    # MKL's row blocking as on torch: two blocks of 160, each in two lanes: 80 deep
    (blocks_each(160, lanes(2)), 320, "blocks of 160, each 2 interleaved lanes",
     "in blocks of 160 terms, each summed in 2 interleaved partial sums, then the blocks' "
     "sums"),
    (blocks_each(8, sequential, mixed=True), 32, "blocks of 8, of mixed orders (height 7)",
     "in blocks of 8 terms, each in an order of its own, the deepest 7 additions deep, then "
     "the blocks' sums"),
    # 2 lanes of 2 lanes each: 4 sequential lanes (LiteRT's built-in FULLY_CONNECTED)
    (lanes_of_lanes(2, 2), 64, "4 interleaved lanes", "in 4 interleaved partial sums"),
    (blocks(16), 64, "blocks of 16", "in blocks of 16 terms, then the blocks' sums"),
])
def test_a_trees_name_says_how_its_blocks_and_lanes_sum(order, terms, expected, phrase):
    """Hand-built sums whose blocks or lanes are not sums in index order: the name says
    what each part is (its own name, or its height where the parts differ), and a tree
    named plainly ``blocks of B`` or ``L interleaved lanes`` has parts that are sequential
    sums (checked on the revealed tree itself: each part as deep as it has terms less
    one). The old names (``blocks of 8``, ``blocks of 160``, ``2 interleaved lanes``) gave
    sequential blocks or lanes where they were not."""
    from bitdrift.analysis.accumulation.names import describe, summary
    from bitdrift.analysis.accumulation.trees import Node, _post_order
    from bitdrift.report.findings.orders import order_phrase

    tree = reveal(order, terms)
    assert summary(tree, bias=False) == expected
    assert order_phrase(expected + ", bias last") == phrase + ", the bias added last"
    found = describe(tree)
    if ", " not in expected:  # parts named plainly: each a sequential sum
        count = found.get("lanes") or -(-terms // found["block"])
        parts = [node for node in _post_order(tree) if isinstance(node, Node) and
                 node.size == terms // count and (found["shape"] != "lanes" or node.terms ==
                                                   tuple(range(node.terms[0], terms, count)))]
        assert parts and all(describe(part)["height"] == part.size - 1 for part in parts)
    if expected == "blocks of 160, each 2 interleaved lanes":
        assert found["height"] == 81  # 79 in a lane of 80, 1 joining lanes, 1 the blocks


def test_an_accumulator_that_starts_from_the_bias_is_named_so():
    """XNNPACK's and ONNX Runtime's packed GEMMs load the bias into the accumulator, then
    add the products in order: the tree's first node adds the bias and product 0."""
    from bitdrift.analysis.accumulation.names import summary
    from bitdrift.analysis.accumulation.reveal import reveal
    from bitdrift.analysis.accumulation.trees import Node

    def bias_first(weights, shift):
        total = shift.astype(F32)
        for row in weights.astype(F32):
            total = (total + row).astype(F32)
        return np.stack([total] * 2)

    tree = reveal(bias_first, terms=24, units=5)
    assert summary(tree) == "sequential, bias first"
    node = tree  # down the chain to the first addition: the bias and product 0
    while any(isinstance(child, Node) for child in node.children):
        node = next(child for child in node.children if isinstance(child, Node))
    assert sorted(node.children) == [0, 24]
    # the products alone in order, bias last, is the other name
    assert summary(reveal(dense_in_order(sequential), terms=24, units=5)) == \
        "sequential, bias last"


def narrow_dense(order, precision):
    """A Dense call whose weights come in a narrower format (float16, bfloat16) and whose
    products with a row of ones are summed in float32 in ``order``, bias last."""
    from bitdrift.analysis.accumulation.probes import input_dtype

    def dense(weights, shift):
        assert weights.dtype == input_dtype(precision) and shift.dtype == weights.dtype
        sums = order(list(weights.astype(F32)))
        return np.stack([(sums + shift.astype(F32)).astype(F32)] * 2)
    return dense


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
@pytest.mark.parametrize("order,expected", [(sequential, "sequential, bias last"),
                                            (pairwise, "pairwise, bias last"),
                                            (lanes(4), "4 interleaved lanes, bias last"),
                                            (blocks(8), "blocks of 8, bias last")])
def test_narrow_inputs_summed_in_float32_reveal_the_tree_built(precision, order, expected):
    """float16 and bfloat16 inputs with float32 accumulation (FPRev's tensor-core case):
    the probe's values are the format's own (float16: 2**15 and 2**-24), and the tree is
    the one the float32 search of the same order finds."""
    from bitdrift.analysis.accumulation.names import summary
    from bitdrift.analysis.accumulation.reveal import reveal

    tree = reveal(narrow_dense(order, precision), terms=48, units=7, precision=precision)
    assert summary(tree) == expected
    products = next(child for child in tree.children if child != 48)
    assert products.as_list() == reveal_all_pairs(order, 48)


def test_a_replay_in_the_revealed_order_is_bit_identical_and_fma_matters():
    """A layer summed sequentially with a fused multiply-add (each product added to the
    running sum with one rounding, computed exactly with Python's fractions) and with
    rounded products: the replay in the revealed order reproduces each bit for bit with
    the right setting and not with the wrong one."""
    from fractions import Fraction

    from bitdrift.analysis.accumulation.replay import replay
    from bitdrift.analysis.accumulation.reveal import reveal

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 24)).astype(F32)
    w = rng.standard_normal((24, 4)).astype(F32)
    b = rng.standard_normal(4).astype(F32)

    def by_hand(fused):
        out = np.zeros((3, 4), dtype=F32)
        for row in range(3):
            for unit in range(4):
                total = F32(x[row, 0] * w[0, unit])
                for k in range(1, 24):
                    if fused:
                        exact = Fraction(float(total)) + Fraction(float(x[row, k])) * \
                            Fraction(float(w[k, unit]))
                        total = nearest_float32(exact)  # one rounding
                    else:
                        total = F32(total + F32(x[row, k] * w[k, unit]))
                out[row, unit] = F32(total + b[unit])
        return out

    tree = reveal(dense_in_order(sequential), terms=24, units=4)
    for fused in (True, False):
        truth = by_hand(fused)
        assert np.array_equal(replay(tree, x, w, b, fma=fused), truth)
    assert not np.array_equal(replay(tree, x, w, b, fma=True), by_hand(False))


def nearest_float32(value):
    """The float32 nearest to a Fraction (ties to even), by bisection on the neighbours."""
    from fractions import Fraction

    guess = F32(float(value))
    for candidate in (np.nextafter(guess, F32(-np.inf)), np.nextafter(guess, F32(np.inf))):
        here, there = abs(Fraction(float(guess)) - value), abs(Fraction(float(candidate)) - value)
        if there < here or (there == here and int(candidate.view(np.uint32)) % 2 == 0):
            guess = candidate
    return guess


@pytest.fixture(scope="module")
def small_model(small_model_copy, tmp_path_factory):
    return small_model_copy(tmp_path_factory.mktemp("orders"))


@pytest.mark.parametrize("padding,strides", [("same", (1, 1)), ("valid", (1, 1)),
                                             ("same", (2, 2)), ("valid", (2, 1))])
def test_a_conv_as_the_gemm_of_its_patches_is_the_convolution(padding, strides):
    """conv_patches @ kernel equals a convolution written out as loops over the output
    pixels (float64, Keras' zero padding for 'same': the extra row and column at the end)."""
    from bitdrift.analysis.accumulation.probes import conv_patches

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 6, 3))
    kernel = rng.standard_normal((3, 2, 3, 4))
    kh, kw, _, filters = kernel.shape
    sh, sw = strides
    if padding == "same":
        out_h, out_w = -(-7 // sh), -(-6 // sw)
        pad_h = max((out_h - 1) * sh + kh - 7, 0)
        pad_w = max((out_w - 1) * sw + kw - 6, 0)
    else:
        out_h, out_w, pad_h, pad_w = (7 - kh) // sh + 1, (6 - kw) // sw + 1, 0, 0
    expected = np.zeros((2, out_h, out_w, filters))
    for n in range(2):
        for i in range(out_h):
            for j in range(out_w):
                for a in range(kh):
                    for b in range(kw):
                        row, col = i * sh + a - pad_h // 2, j * sw + b - pad_w // 2
                        if 0 <= row < 7 and 0 <= col < 6:
                            expected[n, i, j] += x[n, row, col] @ kernel[a, b]
    spec = {"strides": list(strides), "dilation_rate": [1, 1], "padding": padding}
    got = conv_patches(x, spec, kernel.shape, expected.shape) @ kernel.reshape(-1, filters)
    assert np.allclose(got.reshape(expected.shape), expected, rtol=0, atol=1e-12)


def conv_kernel_size(model_path, layer: str) -> list[int]:
    """A Conv2D layer's kernel_size, read from the .keras file's config.json."""
    import json
    import zipfile

    with zipfile.ZipFile(model_path) as archive:
        config = json.loads(archive.read("config.json"))
    stack = [config]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item.get("class_name") == "Conv2D" and item.get("config", {}).get("name") == layer:
                return list(item["config"]["kernel_size"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    raise AssertionError(f"no Conv2D {layer!r} in {model_path}")


@pytest.fixture(scope="module")
def small_export(small_export_copy, tmp_path_factory):
    """The small model's exports (of the same model file as small_model's copy)."""
    folder = tmp_path_factory.mktemp("orders_export")
    _, _, reference = small_export_copy(folder)
    return folder, reference


@pytest.mark.parametrize("backend,settings", [
    ("tensorflow", {}), ("torch", {}),
    # the exported runtimes: each Dense layer alone in the runtime's own format
    ("onnxruntime", {"graph_optimization_level": "all"}),
    ("openvino", {"inference_precision_hint": "f32"}),
    ("litert", {"op_resolver": "xnnpack"}), ("litert", {"op_resolver": "builtin"})],
    ids=["tensorflow", "torch", "onnxruntime", "openvino", "litert_xnnpack",
         "litert_builtin"])
def test_a_real_device_sums_each_dense_layer_in_the_revealed_order(
        small_model, small_export, tmp_path, backend, settings):
    """A real inference (fresh processes): every Dense layer's order is revealed through
    the runtime at the layer's shapes (its products and bias as terms), and numpy replaying
    the layer in that order, from the recorded input and the device's weights, gives the
    record's bits. The truth is the runtime's own output, not the code under test."""
    from bitdrift.analysis.accumulation.trees import from_flat
    from bitdrift.record.reader import Record
    from bitdrift.run.inference import infer
    from tests.utils import EXPORT_FILES

    dataset, model = small_model
    device = {"accelerator": "cpu", "threads": 1, "batch_size": 2, "precision": "float32",
              "env": {}, "repeats": 1, "external": False, "backend": backend, **settings}
    exported = backend in EXPORT_FILES
    out = tmp_path / f"{backend}.h5"
    with open(tmp_path / "log", "w") as log:
        infer(model_name="small", device_name=backend, device=device, model_path=model,
              dataset_path=dataset, samples=[0, 3, 6], out=out, log=log, kernels=True,
              reference=small_export[1] if exported else None,
              export=small_export[0] / EXPORT_FILES[backend] if exported else None)
    with Record(out) as record:
        orders = record.accumulation_orders
        reproduced = 0
        sums = [info.name for info in record.layers(0)
                if info.class_name in ("Dense", "Conv2D")]
        classes = {info.name: info.class_name for info in record.layers(0)}
        assert sorted(orders) == sorted(sums) and "Conv2D" in classes.values()
        # the first Conv2D's sum: kh * kw products per input channel (the fixture's images
        # have 3) and the bias; kh, kw from the saved model's own config
        conv = next(name for name in sums if classes[name] == "Conv2D")
        if "trees" in orders[conv]:
            assert orders[conv]["terms"] == \
                int(np.prod(conv_kernel_size(model, conv))) * 3 + 1
        else:  # a kernel whose sums are no tree says so
            assert orders[conv]["order"] == "not revealed" and orders[conv]["replay"]
        for layer, entry in orders.items():
            for flat in entry.get("trees", []):  # the distinct trees of its places
                tree = from_flat(flat, entry["terms"])
                # all terms; or, found at a pixel by the padding, that pixel's
                assert set(tree.terms) <= set(range(entry["terms"]))
                assert entry["bias"] and entry["terms"] - 1 in tree.terms  # the bias: a term
                if classes[layer] == "Dense":
                    assert tree.terms == tuple(range(entry["terms"]))
            if "trees" in entry:  # every batch row's map covers the layer's output grid
                grid = entry["places"]["grid"]
                assert all(len(lines) == grid[0] and {len(line) for line in lines} ==
                           {grid[1]} for lines in entry["places"]["maps"])
            reproduced += entry["replay"].startswith("bit-identical")
            # a layer not reproduced says why: no tree, or how many values differ
            assert entry["replay"].startswith(("bit-identical", "differs: ")) or \
                entry["order"] == "not revealed" and entry["replay"], (layer, entry)
    assert reproduced >= 1


def openblas_cores() -> list[str]:
    """The OpenBLAS kernels this CPU can run, from its flags (numpy's own BLAS)."""
    with open("/proc/cpuinfo") as cpuinfo:
        flags = set(next(line for line in cpuinfo if line.startswith("flags")).split())
    cores = ["Nehalem"]  # SSE4.2: every CPU numpy 2 runs on
    if {"avx2", "fma"} <= flags:
        cores.append("Haswell")
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        cores.append("SkylakeX")
    return cores


@pytest.mark.parametrize("core", openblas_cores())
def test_numpy_matmul_on_a_forced_openblas_kernel_replays_bit_for_bit(core):
    """numpy's matmul with OpenBLAS forced to one kernel (OPENBLAS_CORETYPE, in a fresh
    process): its order revealed at a row of 96 terms and 16 columns, then a random row
    through the same matmul; the replay in the revealed order equals numpy's own bits."""
    import json
    import os
    import subprocess
    import sys

    code = """
import json, numpy as np
from bitdrift.analysis.accumulation.replay import replay
from bitdrift.analysis.accumulation.reveal import reveal
from bitdrift.analysis.accumulation.trees import to_flat
terms, units = 96, 16
ones = np.ones((1, terms), np.float32)
tree = reveal(lambda w, b: ones @ w, terms, units, bias=False)
rng = np.random.default_rng(3)
x = rng.standard_normal((1, terms)).astype(np.float32)
w = rng.standard_normal((terms, units)).astype(np.float32)
truth = x @ w
found = {fma: bool(np.array_equal(replay(tree, x, w, None, fma), truth)) for fma in (0, 1)}
print(json.dumps({"found": found, "nodes": len(to_flat(tree))}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "OPENBLAS_CORETYPE": core}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["nodes"] == 95  # a binary tree over 96 terms
    assert any(result["found"].values()), (core, result)


def test_the_figure_draws_the_two_orders_of_a_pair_that_parts_at_a_dense_layer(
        make_record, tmp_path):
    """The two trees come from the records of the pair whose first divergent layer is a
    Dense layer with other revealed orders; restricted to a few terms, a sequential sum
    stays sequential and blocks keep their blocks. Without such a pair the commonest two
    orders of a layer are drawn, and without two orders the figure says so."""
    import json

    import pandas as pd

    from bitdrift.analysis.accumulation.names import summary
    from bitdrift.analysis.accumulation.reveal import reveal
    from bitdrift.analysis.accumulation.tables import contrasting_pair
    from bitdrift.analysis.accumulation.trees import Node, from_flat, restrict, to_flat
    from bitdrift.record.reader import open_records
    from bitdrift.report.figures.orders import plot_orders

    def bias_last(order):  # the products in ``order``, then the bias (the last term)
        return lambda rows: (order(rows[:-1]) + rows[-1]).astype(F32)

    def dense_of(order):
        return lambda kernel, bias: np.stack([
            order([*kernel.astype(F32)[:, None, :], bias.astype(F32)[None, :]])[0]] * 2)

    trees = {name: reveal(dense_of(bias_last(order)), 48, 64)
             for name, order in (("seq", sequential), ("blk", blocks(16)))}
    assert [summary(tree) for tree in trees.values()] == \
        ["sequential, bias last", "blocks of 16, bias last"]
    kept = restrict(trees["blk"], {0, 1, 2, 17, 18, 48})
    # blocks: 0-2 meet inside their block, 17-18 inside theirs, the bias last
    assert isinstance(kept, Node) and 48 in kept.children
    inner = next(child for child in kept.children if isinstance(child, Node))
    assert sorted(child.terms for child in inner.children) == [(0, 1, 2), (17, 18)]
    kept = restrict(trees["seq"], set(range(8)) | {48})
    products = next(child for child in kept.children if isinstance(child, Node))
    assert 48 in kept.children and describe(products)["shape"] == "sequential"

    def orders(tree):
        return json.dumps({"dense": {"trees": [to_flat(tree)], "terms": tree.size,
                                     "bias": True, "order": summary(tree)}})

    paths = [make_record(name, {0: np.ones((1, 3), dtype=np.float32)},
                         accumulation_orders=orders(tree))
             for name, tree in trees.items()]
    paths.append(make_record("same", {0: np.ones((1, 3), dtype=np.float32)},
                             accumulation_orders=orders(trees["seq"])))
    records = open_records(paths)
    parting = pd.DataFrame([{"model": "net", "precision": "float32", "layer_class": "Dense",
                             "device_a": "seq", "device_b": "blk", "first_layer": "dense"}])
    pair = contrasting_pair(parting, records)
    assert pair["devices"] == ["seq", "blk"] and pair["first_divergence"]
    assert [to_flat(tree) for tree in pair["trees"]] == \
        [to_flat(trees["seq"]), to_flat(trees["blk"])]
    elsewhere = parting.assign(layer_class="Conv2D", first_layer="conv2d")
    pair = contrasting_pair(elsewhere, records)
    assert pair["devices"] == ["seq", "blk"] and not pair["first_divergence"]  # 2 vs 1
    assert contrasting_pair(elsewhere, [records[0], records[2]]) is None
    for found, name in ((contrasting_pair(parting, records), "two"), (None, "none")):
        plot_orders(found, tmp_path / f"{name}.pdf")
        assert (tmp_path / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    assert from_flat(to_flat(trees["blk"]), 49).terms == tuple(range(49))
    # A second model whose devices part too: each model has its own pair, and the figure
    # draws both (one no longer hides the other)
    other = [make_record(name, {0: np.ones((1, 3), dtype=np.float32)}, model="net2",
                         accumulation_orders=orders(tree))
             for name, tree in (("blk", trees["blk"]), ("seq", trees["seq"]))]
    both = open_records(paths + other)
    second = parting.assign(model="net2", device_a="blk", device_b="seq")
    table = pd.concat([second, parting])  # the second model's row first
    assert contrasting_pair(table, both, "net")["devices"] == ["seq", "blk"]
    assert contrasting_pair(table, both, "net2")["devices"] == ["blk", "seq"]
    assert contrasting_pair(table, both, "net2")["model"] == "net2"
    plot_orders([(model, contrasting_pair(table, both, model)) for model in ("net", "net2")],
                tmp_path / "models.pdf")
    assert (tmp_path / "models.png").read_bytes().startswith(b"\x89PNG")


def test_the_rows_of_a_batch_are_named_in_runs():
    from bitdrift.analysis.accumulation.names import by_rows

    assert by_rows(["a", "a", "a", "b", "b", "a"]) == \
        "by batch row: rows 0-2: a; rows 3-4: b; row 5: a"
    assert by_rows(["x", "y"]) == "by batch row: row 0: x; row 1: y"


# -- the fused step where the bias or an accumulator meets a product ------------------------
def fraction(value):
    from fractions import Fraction

    return Fraction(float(value))


def test_one_rounding_of_a_sum_and_an_exact_product_is_the_nearest_float32():
    """_round_sum(partial, product) against the float32 nearest to the exact sum (Python
    fractions): random values, and a sum whose float64 value lands exactly halfway between
    two float32 numbers while the exact one lies above it, where rounding the float64 sum
    (a second rounding) gives the even neighbour below, the wrong one."""
    from bitdrift.analysis.accumulation.replay import _round_sum

    a, b = F32(8 + 2.0**-20), F32(-(8 - 2.0**-20))  # product -(64 - 2**-40), exact
    partial = F32(2.0**30 + 128)  # odd: halfway below it is 2**30 + 64
    assert fraction(a) * fraction(b) == fraction(float(a) * float(b))
    exact = fraction(partial) + fraction(a) * fraction(b)
    assert F32(float(partial) + float(a) * float(b)) == F32(2.0**30)  # the double rounding
    assert nearest_float32(exact) == partial
    got = _round_sum(np.array([float(partial)]), np.array([float(a) * float(b)]))
    assert got[0] == partial

    rng = np.random.default_rng(5)
    partials = (rng.standard_normal(2000) * 10.0 ** rng.integers(-3, 4, 2000)).astype(F32)
    x = rng.standard_normal(2000).astype(F32)
    w = rng.standard_normal(2000).astype(F32)
    products = x.astype(np.float64) * w.astype(np.float64)
    got = _round_sum(partials.astype(np.float64), products)
    truth = [nearest_float32(fraction(p) + fraction(u) * fraction(v))
             for p, u, v in zip(partials, x, w, strict=True)]
    assert np.array_equal(got.view(np.uint32), np.array(truth, dtype=F32).view(np.uint32))


def bias_first_fused(x, w, b):
    """The sum an accumulator loaded with the bias gives when each product is added to it
    with one rounding (an FMA), computed exactly with Python's fractions."""
    out = np.zeros((x.shape[0], w.shape[1]), dtype=F32)
    for row in range(x.shape[0]):
        for unit in range(w.shape[1]):
            total = b[unit]
            for k in range(x.shape[1]):
                total = nearest_float32(fraction(total) + fraction(x[row, k])
                                        * fraction(w[k, unit]))
            out[row, unit] = total
    return out


def test_a_sum_that_starts_from_the_bias_is_replayed_with_the_first_product_fused():
    """XNNPACK's accumulator starts from the bias and adds every product with an FMA, the
    first one too: round(bias + x0 * w0). The replay with FMA gives that sum's bits
    (computed apart with fractions); rounding the first product before adding the bias, as
    a plain addition does, gives other bits for some of these values."""
    from bitdrift.analysis.accumulation.names import summary
    from bitdrift.analysis.accumulation.replay import replay
    from bitdrift.analysis.accumulation.reveal import reveal

    def bias_first(weights, shift):
        total = shift.astype(F32)
        for row in weights.astype(F32):
            total = (total + row).astype(F32)
        return np.stack([total] * 2)

    tree = reveal(bias_first, terms=6, units=4)
    assert summary(tree) == "sequential, bias first"
    rng = np.random.default_rng(11)
    x = rng.standard_normal((8, 6)).astype(F32)
    w = rng.standard_normal((6, 4)).astype(F32)
    b = rng.standard_normal(4).astype(F32)
    truth = bias_first_fused(x, w, b)
    assert np.array_equal(replay(tree, x, w, b, fma=True).view(np.uint32),
                          truth.view(np.uint32))
    # the first product rounded on its own, then added to the bias, the rest fused
    rounded_first = np.zeros_like(truth)
    for row in range(8):
        for unit in range(4):
            total = F32(b[unit] + F32(x[row, 0] * w[0, unit]))
            for k in range(1, 6):
                total = nearest_float32(fraction(total) + fraction(x[row, k])
                                        * fraction(w[k, unit]))
            rounded_first[row, unit] = total
    assert not np.array_equal(rounded_first, truth)  # the fused first step matters here
    assert not np.array_equal(replay(tree, x, w, b, fma=False), truth)


# -- where two products meet: which one the FMA fuses ---------------------------------------
# a = 1 + 2^-12, c = 1 + 2^-11: a * a = 1 + 2^-11 + 2^-24 lies halfway between c and its
# float32 neighbour above, and rounds (to even) to c. So a * a - c is 2^-24 exactly when
# a * a is fused, 0 when it is rounded first: the two choices give other bits.
HALF_ULP_A, HALF_ULP_C = F32(1 + 2.0 ** -12), F32(1 + 2.0 ** -11)


FUSED_TERMS = 16


def two_products_meet_dense():
    """A Dense layer of FUSED_TERMS inputs and 2 units, its bias zero, whose first two
    products meet: row 0, unit 0 sums a * a and -1 * c (the lower-index product inexact),
    row 1, unit 1 sums -1 * c and a * a (the higher-index one inexact), the other inputs
    of these rows 0; 30 random rows below. Returns x, kernel, bias."""
    rng = np.random.default_rng(63)
    x = rng.standard_normal((32, FUSED_TERMS)).astype(F32)
    kernel = rng.standard_normal((FUSED_TERMS, 2)).astype(F32)
    x[:2] = 0
    x[0, :2], x[1, :2] = [HALF_ULP_A, -1], [-1, HALF_ULP_A]
    kernel[:2, 0], kernel[:2, 1] = [HALF_ULP_A, HALF_ULP_C], [HALF_ULP_C, HALF_ULP_A]
    return x, kernel, np.zeros(2, dtype=F32)


def sequential_fma_sum(x, kernel, bias, fused_product):
    """A kernel's sequential sum with FMA, computed exactly with fractions: the product
    of ``fused_product``'s index among the first two fused onto the other, rounded alone;
    each later product fused onto the running sum; the bias added last (one rounding of
    two float32 numbers)."""
    from bitdrift.record.orders import HIGHER_FUSED

    out = np.zeros((x.shape[0], kernel.shape[1]), dtype=F32)
    for row in range(x.shape[0]):
        for unit in range(kernel.shape[1]):
            products = [fraction(x[row, k]) * fraction(kernel[k, unit])
                        for k in range(x.shape[1])]
            rounded, fused = products[:2] if fused_product == HIGHER_FUSED \
                else products[1::-1]
            total = nearest_float32(fraction(nearest_float32(rounded)) + fused)
            for product in products[2:]:
                total = nearest_float32(fraction(total) + product)
            out[row, unit] = nearest_float32(fraction(total) + fraction(bias[unit]))
    return out


# ((0 + 1) + 2) + ... + 15, then the bias (term 16): nodes in post-order, node k being
# term 17 + k
SEQUENTIAL_WITH_BIAS = [[0, 1], *([FUSED_TERMS + k, k + 1] for k in range(1, FUSED_TERMS - 1)),
                        [2 * FUSED_TERMS - 1, FUSED_TERMS]]


def test_where_two_products_meet_the_replay_fuses_the_one_it_is_told():
    """The hand-made values: fusing the higher-index product gives 0 at (0, 0) and 2^-24 at
    (1, 1), fusing the lower-index one the other way round, as exact arithmetic
    (fractions) says; every value of each replay is the exact sum of its choice."""
    from bitdrift.analysis.accumulation.replay import replay
    from bitdrift.analysis.accumulation.trees import from_flat
    from bitdrift.record.orders import HIGHER_FUSED, LOWER_FUSED

    x, kernel, bias = two_products_meet_dense()
    tree = from_flat(SEQUENTIAL_WITH_BIAS, FUSED_TERMS + 1)
    assert tree.terms == tuple(range(FUSED_TERMS + 1))
    tiny = F32(2.0 ** -24)
    higher = replay(tree, x, kernel, bias, fma=True, fused_product=HIGHER_FUSED)
    lower = replay(tree, x, kernel, bias, fma=True, fused_product=LOWER_FUSED)
    assert (higher[0, 0], higher[1, 1]) == (0, tiny)
    assert (lower[0, 0], lower[1, 1]) == (tiny, 0)
    for product, values in ((HIGHER_FUSED, higher), (LOWER_FUSED, lower)):
        assert np.array_equal(values.view(np.uint32),
                              sequential_fma_sum(x, kernel, bias, product).view(np.uint32))
    # the default is the replay's rule before it tried both: the higher index fused
    assert np.array_equal(replay(tree, x, kernel, bias, fma=True), higher)


@pytest.mark.parametrize("kernel_fuses", ["higher index", "lower index"])
def test_the_replay_finds_and_records_the_product_the_kernel_fuses(kernel_fuses):
    """A kernel's output computed exactly (fractions) with each choice: replay_layers
    calls it bit-identical with FMA and records the choice made, the other one not
    reproducing it (it would be ``either``); one value off, it differs, naming the choice
    that came closest."""
    from bitdrift.analysis.accumulation.replay import replay_layers
    from bitdrift.record.orders import HIGHER_FUSED, LOWER_FUSED

    x, kernel, bias = two_products_meet_dense()
    other = LOWER_FUSED if kernel_fuses == HIGHER_FUSED else HIGHER_FUSED
    out = sequential_fma_sum(x, kernel, bias, kernel_fuses)
    assert not np.array_equal(out, sequential_fma_sum(x, kernel, bias, other))
    # without FMA (rounded products, numpy's float32 additions) the sums part at more
    # than one value: no arithmetic but the kernel's comes within one value of it
    rounded = [(x[:, k:k + 1] * kernel[k]).astype(F32) for k in range(FUSED_TERMS)]
    assert np.sum(sequential([*rounded, bias]) != out) > 1
    entry = {"trees": [SEQUENTIAL_WITH_BIAS], "terms": FUSED_TERMS + 1, "bias": True}
    checked = {"dense": {"class_name": "Dense", "inbound": "input", "activation": "linear"}}
    weights = {"weights/dense/0": kernel, "weights/dense/1": bias}

    def verdict(outputs):
        return replay_layers({"dense": entry}, checked, weights,
                             {"input": x, "dense": outputs}, "float32",
                             replay_samples=len(x))["dense"]

    found = verdict(out)
    assert found["replay"] == "bit-identical with FMA"
    assert found["fused_product"] == kernel_fuses
    wrong = out.copy()
    wrong[5, 1] = np.nextafter(wrong[5, 1], F32(np.inf))
    found = verdict(wrong)
    assert found["replay"] == ("differs: 63 of 64 values bit-identical at best (with FMA, "
                               f"the product of {kernel_fuses} fused where two meet)")
    assert "fused_product" not in found


def test_values_that_cannot_tell_the_fused_product_are_said_either():
    """Small integers: every product is exact, so both choices (and no FMA at all) give
    the same bits: the replay says so (``either``) rather than pick one; a sum that
    starts from the bias has no node where two products meet, and no fused product."""
    from bitdrift.analysis.accumulation.names import summary
    from bitdrift.analysis.accumulation.replay import replay_layers
    from bitdrift.analysis.accumulation.reveal import reveal
    from bitdrift.analysis.accumulation.trees import to_flat
    from bitdrift.record.orders import EITHER_FUSED

    rng = np.random.default_rng(5)
    x = rng.integers(-8, 8, (6, FUSED_TERMS)).astype(F32)
    kernel = rng.integers(-8, 8, (FUSED_TERMS, 3)).astype(F32)
    bias = rng.integers(-8, 8, 3).astype(F32)
    out = (x.astype(np.float64) @ kernel + bias).astype(F32)  # exact: small integers
    checked = {"dense": {"class_name": "Dense", "inbound": "input", "activation": "linear"}}
    weights = {"weights/dense/0": kernel, "weights/dense/1": bias}

    def verdict(trees):
        return replay_layers({"dense": {"trees": trees, "terms": FUSED_TERMS + 1,
                                        "bias": True}}, checked,
                             weights, {"input": x, "dense": out}, "float32",
                             replay_samples=len(x))["dense"]

    found = verdict([SEQUENTIAL_WITH_BIAS])
    assert found["replay"] == "bit-identical with FMA"
    assert found["fused_product"] == EITHER_FUSED

    def bias_first(weights, shift):
        total = shift.astype(F32)
        for row in weights.astype(F32):
            total = (total + row).astype(F32)
        return np.stack([total] * 2)

    starts_from_bias = reveal(bias_first, terms=FUSED_TERMS, units=3)
    assert summary(starts_from_bias) == "sequential, bias first"
    found = verdict([to_flat(starts_from_bias)])
    assert found["replay"] == "bit-identical with FMA" and "fused_product" not in found


def test_the_fused_product_is_read_checked_and_tabled(make_record):
    """A record's ``fused_product`` reads back into accumulation_orders.csv's last column
    (a record written before it: empty); another value is one line naming the layer."""
    import json

    import pandas as pd

    from bitdrift.analysis.accumulation.tables import TABLE_COLUMNS, orders_table
    from bitdrift.errors import RecordError
    from bitdrift.record.orders import checked_orders
    from bitdrift.record.reader import open_records

    assert TABLE_COLUMNS == ["model", "device", "backend", "layer", "terms", "order",
                             "replay", "fused_product"]  # the old columns' order kept
    entry = {"trees": [SEQUENTIAL_WITH_BIAS], "terms": FUSED_TERMS + 1, "bias": True,
             "order": "sequential, bias last", "replay": "bit-identical with FMA"}
    paths = [make_record(device, {0: np.ones((1, 3), dtype=F32)},
                         accumulation_orders=json.dumps({"dense": {**entry, **extra}}))
             for device, extra in (("old", {}), ("new", {"fused_product": "lower index"}))]
    table = pd.DataFrame(orders_table(open_records(paths)), columns=TABLE_COLUMNS)
    assert dict(zip(table["device"], table["fused_product"], strict=True)) == \
        {"old": "", "new": "lower index"}
    with pytest.raises(ValueError, match=r"^layer 'dense': 'fused_product' is not one of "
                       r"'higher index', 'lower index', 'either'$"):
        checked_orders({"dense": {**entry, "fused_product": "first"}}, ValueError)
    bad = make_record("bad", {0: np.ones((1, 3), dtype=F32)}, accumulation_orders=json.dumps(
        {"dense": {**entry, "fused_product": 1}}))
    with pytest.raises(RecordError, match=r"net_bad\.h5.*'fused_product' is not one of"):
        open_records([bad])[0].accumulation_orders  # noqa: B018


# -- orders that vary by place: batch rows, output pixels -----------------------------------
def evaluate(order, rows):
    """A nested list of term indices summed as it nests, children in the listed order,
    every addition rounded to float32 (a kernel's order written out)."""
    if isinstance(order, int):
        return rows[order]
    total = evaluate(order[0], rows)
    for child in order[1:]:
        total = (total + evaluate(child, rows)).astype(F32)
    return total


def canonical(order, keep=None):
    """A nested list restricted to the terms ``keep`` (all: None), one-child nodes
    replaced by their child, children sorted by their smallest term: equal for equal
    trees."""
    if isinstance(order, int):
        return order if keep is None or order in keep else None
    kids = [kid for kid in (canonical(child, keep) for child in order) if kid is not None]
    if not kids:
        return None
    if len(kids) == 1:
        return kids[0]

    def smallest(kid):
        return kid if isinstance(kid, int) else min(smallest(k) for k in kid)
    return sorted(kids, key=smallest)


def nested(tree):
    from bitdrift.analysis.accumulation.trees import Node

    return [nested(child) if isinstance(child, Node) else child for child in tree.children]


def conv_probe(orders, order_of_pixel, spec, batch=1):
    """A Conv2D probe (weights, bias) -> (batch, pixels, units) whose output pixel p sums
    its products with an input of ones (0 where the window meets the padding) and the
    bias in ``orders[order_of_pixel(p)]``."""
    from bitdrift.analysis.accumulation.probes import conv_grid

    (height, width), live = conv_grid(spec)

    def dense(weights, shift):
        out = np.zeros((batch, height * width, weights.shape[1]), dtype=F32)
        for pixel in range(height * width):
            terms = [(weights[t] * live[pixel, t]).astype(F32) for t in range(len(weights))]
            out[:, pixel] = evaluate(orders[order_of_pixel(pixel)], [*terms, shift.astype(F32)])
        return out
    return dense


def small_conv_spec(padding="same"):
    from bitdrift.analysis.accumulation.probes import probe_spec

    config = {"filters": 2, "kernel_size": [3, 3], "strides": [1, 1], "padding": padding,
              "dilation_rate": [1, 1], "data_format": "channels_last", "groups": 1}
    return probe_spec("Conv2D", config, (5, 6, 1), (3, 3, 1, 2))


# two orders of 9 products and the bias (term 9): in index order, bias last; and two
# interleaved lanes (even, odd terms), the bias first in the even lane
SEQUENTIAL = [[[[[[[[[0, 1], 2], 3], 4], 5], 6], 7], 8], 9]
LANES = [[[[[[9, 0], 2], 4], 6], 8], [[[1, 3], 5], 7]]


def test_a_conv_whose_order_alternates_by_column_is_revealed_pixel_by_pixel():
    """Even output columns sum in one order, odd ones in another (a vector loop starting
    each pixel at another offset); pixels at the border hold fewer terms (the padding's
    products are 0). Every pixel is given a tree whose restriction to its terms is the
    order built for it, the two trees are the two orders, the name says the order varies
    by position, and the search stays within its bound."""
    from bitdrift.analysis.accumulation.names import order_name
    from bitdrift.analysis.accumulation.probes import conv_grid
    from bitdrift.analysis.accumulation.reveal import PLACE_SEARCHES, reveal_places
    from bitdrift.analysis.accumulation.trees import from_flat

    spec = small_conv_spec()
    (height, width), live = conv_grid(spec)
    orders = [SEQUENTIAL, LANES]
    found = reveal_places(conv_probe(orders, lambda p: p % width % 2, spec), spec["terms"],
                          spec["units"], grid=(height, width), live=live)
    assert sorted(str(canonical(nested(tree))) for tree in found.trees) == \
        sorted(str(canonical(order)) for order in orders)
    assert len(found.searched) <= PLACE_SEARCHES and not found.errors
    for pixel in range(height * width):
        keep = set(np.flatnonzero(live[pixel]).tolist())
        index = found.tree_of[0, pixel]
        assert index >= 0, pixel
        assert canonical(nested(found.trees[index]), keep) == \
            canonical(orders[pixel % width % 2], keep), pixel
    entry = found.entry(10, True)
    assert entry["places"]["grid"] == [height, width] and len(entry["places"]["maps"]) == 1
    trees = [from_flat(flat, 10) for flat in entry["trees"]]
    assert [canonical(nested(tree)) for tree in trees] == \
        [canonical(nested(tree)) for tree in found.trees]
    assert order_name(trees, entry["places"], True).startswith("varies by position (2 trees")


def test_one_order_everywhere_is_one_tree_and_its_plain_name():
    from bitdrift.analysis.accumulation.names import order_name
    from bitdrift.analysis.accumulation.probes import conv_grid
    from bitdrift.analysis.accumulation.reveal import reveal_places
    from bitdrift.analysis.accumulation.trees import from_flat

    spec = small_conv_spec()
    (height, width), live = conv_grid(spec)
    found = reveal_places(conv_probe([SEQUENTIAL], lambda p: 0, spec), spec["terms"],
                          spec["units"], grid=(height, width), live=live)
    assert len(found.trees) == 1 and np.all(found.tree_of == 0)
    assert len(found.searched) == 2  # the two seeds, searched together
    entry = found.entry(10, True)
    assert order_name([from_flat(entry["trees"][0], 10)], entry["places"], True) == \
        "sequential, bias last"


def test_batch_rows_in_different_orders_are_named_by_row():
    """A Dense call whose second batch row sums in another order (MKL's row blocking):
    each row gets its own tree, and the name says which row sums how."""
    from bitdrift.analysis.accumulation.names import order_name
    from bitdrift.analysis.accumulation.reveal import reveal_places
    from bitdrift.analysis.accumulation.trees import from_flat

    def dense(weights, shift):
        rows = [*weights.astype(F32), shift.astype(F32)]
        return np.stack([evaluate(SEQUENTIAL, rows), evaluate(LANES, rows),
                         evaluate(SEQUENTIAL, rows)])

    found = reveal_places(dense, 9, 4, batch=3)
    assert list(found.tree_of[:, 0]) == [0, 1, 0]
    assert [canonical(nested(tree)) for tree in found.trees] == \
        [canonical(SEQUENTIAL), canonical(LANES)]
    entry = found.entry(10, True)
    trees = [from_flat(flat, 10) for flat in entry["trees"]]
    assert order_name(trees, entry["places"], True) == \
        "by batch row: row 0: sequential, bias last; row 1: 2 interleaved lanes, bias " \
        "inside; row 2: sequential, bias last"


def test_a_conv_is_replayed_pixel_by_pixel_in_its_own_order():
    """The layer computed by hand with each pixel's own order (columns alternating, as
    above) from random inputs and weights: replaying every pixel in the tree found for it
    gives those bits; one tree for all pixels (the centre's) does not."""
    from bitdrift.analysis.accumulation.probes import conv_grid, conv_patches
    from bitdrift.analysis.accumulation.replay import replay_layers
    from bitdrift.analysis.accumulation.reveal import reveal_places

    spec = small_conv_spec()
    (height, width), live = conv_grid(spec)
    orders = [SEQUENTIAL, LANES]
    found = reveal_places(conv_probe(orders, lambda p: p % width % 2, spec), spec["terms"],
                          spec["units"], grid=(height, width), live=live)
    entry = found.entry(10, True)
    rng = np.random.default_rng(2)
    images = rng.standard_normal((3, 5, 6, 1)).astype(F32)
    kernel = rng.standard_normal((3, 3, 1, 2)).astype(F32)
    bias = rng.standard_normal(2).astype(F32)
    config = {key: spec["config"][key] for key in ("strides", "dilation_rate", "padding")}
    patches = conv_patches(images, config, kernel.shape, (3, height, width))
    flat = kernel.reshape(9, 2)
    out = np.zeros((3 * height * width, 2), dtype=F32)
    for row, patch in enumerate(patches):
        terms = [(patch[t] * flat[t]).astype(F32) for t in range(9)]
        out[row] = evaluate(orders[row % (height * width) % width % 2], [*terms, bias])
    checked = {"conv": {"class_name": "Conv2D", "inbound": None, "activation": "linear",
                        **config}}
    weights = {"weights/conv/0": kernel, "weights/conv/1": bias}
    outputs = {"conv": out.reshape(3, height, width, 2)}
    result = replay_layers({"conv": entry}, checked, weights, outputs, "float32", images)
    assert result["conv"]["replay"] == "bit-identical without FMA"
    centre = dict(entry)
    del centre["places"]
    centre["trees"] = [entry["trees"][found.tree_of[0, (height // 2) * width + width // 2]]]
    one = replay_layers({"conv": centre}, checked, weights, outputs, "float32", images)
    assert one["conv"]["replay"].startswith("differs: ")
    # a pixel whose order is unknown ('.') is left out of the replay, and counted
    found.tree_of[0, 0] = -1
    unknown = found.entry(10, True)
    assert unknown["places"]["maps"][0][0].startswith(".")
    result = replay_layers({"conv": unknown}, checked, weights, outputs, "float32", images)
    assert result["conv"]["replay"] == "bit-identical without FMA; 6 of 180 values not " \
        "replayed (order unknown there)"  # 3 images x 2 filters at pixel (0, 0)
    assert result["conv"]["order"].endswith("; order unknown at 1 pixels")


def alternating_conv_layer(samples=3):
    """A Conv2D on a 5x6 grid whose columns alternate between two orders: its revealed
    entry, and its output computed by hand from random inputs in each pixel's order."""
    from bitdrift.analysis.accumulation.probes import conv_grid, conv_patches
    from bitdrift.analysis.accumulation.reveal import reveal_places

    spec = small_conv_spec()
    (height, width), live = conv_grid(spec)
    orders = [SEQUENTIAL, LANES]
    found = reveal_places(conv_probe(orders, lambda p: p % width % 2, spec), spec["terms"],
                          spec["units"], grid=(height, width), live=live)
    rng = np.random.default_rng(2)
    images = rng.standard_normal((samples, 5, 6, 1)).astype(F32)
    kernel = rng.standard_normal((3, 3, 1, 2)).astype(F32)
    bias = rng.standard_normal(2).astype(F32)
    config = {key: spec["config"][key] for key in ("strides", "dilation_rate", "padding")}
    patches = conv_patches(images, config, kernel.shape, (samples, height, width))
    flat = kernel.reshape(9, 2)
    out = np.zeros((samples * height * width, 2), dtype=F32)
    for row, patch in enumerate(patches):
        terms = [(patch[t] * flat[t]).astype(F32) for t in range(9)]
        out[row] = evaluate(orders[row % (height * width) % width % 2], [*terms, bias])
    checked = {"conv": {"class_name": "Conv2D", "inbound": None, "activation": "linear",
                        **config}}
    weights = {"weights/conv/0": kernel, "weights/conv/1": bias}
    return (found.entry(10, True), checked, weights,
            out.reshape(samples, height, width, 2), images)


def test_the_sampled_positions_hold_corners_edges_and_interior():
    """By hand: an axis of 20 at 8 indices with a border of 2 keeps 0, 1 and 18, 19 (the
    padding), the run 9, 10 at the centre, and 6 and 13 between; a grid of at most the
    positions asked is kept whole; the samples spread from the first to the last."""
    from bitdrift.analysis.accumulation.probes import sampled_axis, sampled_grid, sampled_samples

    assert sampled_axis(20, 8, 2) == [0, 1, 6, 9, 10, 13, 18, 19]
    assert sampled_axis(7, 8, 2) == list(range(7))
    assert sampled_grid((5, 6), 30) == ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5])
    ys, xs = sampled_grid((5, 6), 9)
    assert (ys, xs) == ([0, 2, 4], [0, 3, 5])
    positions = {(y, x) for y in ys for x in xs}
    assert {(0, 0), (0, 5), (4, 0), (4, 5)} <= positions  # the corners
    assert {(0, 3), (2, 0), (2, 5), (4, 3)} <= positions  # each edge
    assert (2, 3) in positions  # the interior
    # a 112x112 grid at 1024 positions: 32 x 32, both ends and both parities of the run
    ys, xs = sampled_grid((112, 112), 1024, (3, 3))
    assert len(ys) == len(xs) == 32 and ys[:3] == [0, 1, 2] and ys[-3:] == [109, 110, 111]
    assert {56 % 4, 57 % 4, 58 % 4, 59 % 4} <= {y % 4 for y in ys if 40 < y < 72}
    assert sampled_samples(3, 8) == [0, 1, 2] and sampled_samples(100, 3) == [0, 50, 99]


def test_a_sampled_replay_counts_the_sampled_values_and_names_them():
    """Two recorded values made wrong: one at a sampled position ((2, 3) of sample 0), one
    at a position left out ((1, 1) of sample 0). The sampled replay (9 of 30 positions,
    samples 0 and 2) finds the first alone among its 2 x 9 x 2 values, and the record
    names what it replayed; the full replay finds both among all 3 x 30 x 2."""
    from bitdrift.analysis.accumulation.replay import replay_layers
    from bitdrift.record.orders import checked_orders

    entry, checked, weights, out, images = alternating_conv_layer()
    for y, x in ((2, 3), (1, 1)):
        out[0, y, x, 0] = np.nextafter(out[0, y, x, 0], F32(np.inf))
    sampled = replay_layers({"conv": entry}, checked, weights, {"conv": out}, "float32",
                            images, replay_positions=9, replay_samples=2)["conv"]
    assert sampled["replay"] == (
        "differs: 35 of 36 values bit-identical at best (without FMA); replayed at 9 of 30 "
        "positions of 2 of 3 samples (analysis.replay_positions, analysis.replay_samples)")
    assert sampled["replayed"] == {"rows": [0, 2], "y": [0, 2, 4], "x": [0, 3, 5]}
    assert checked_orders({"conv": sampled}, ValueError) is not None
    with pytest.raises(ValueError, match="'replayed' is not"):
        checked_orders({"conv": {**sampled, "replayed": {"y": ["0"]}}}, ValueError)
    full = replay_layers({"conv": entry}, checked, weights, {"conv": out}, "float32",
                         images)["conv"]
    assert full["replay"] == "differs: 178 of 180 values bit-identical at best (without FMA)"
    assert "replayed" not in full  # every position and sample: the record as before
    out[0, 1, 1, 0] = np.nextafter(out[0, 1, 1, 0], F32(-np.inf))  # the one left out, mended
    again = replay_layers({"conv": entry}, checked, weights, {"conv": out}, "float32",
                          images, replay_positions=9, replay_samples=2)["conv"]
    assert again["replay"] == sampled["replay"]  # what was left out is not looked at


def test_a_sampled_dense_replay_reads_the_rows_it_names():
    """A Dense layer of 5 samples summed by hand in float32, products first, bias last:
    the replay at 2 samples reads rows 0 and 4 alone (a wrong value in row 2 is not seen,
    one in row 4 is)."""
    from bitdrift.analysis.accumulation.replay import replay_layers

    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 4)).astype(F32)
    kernel = rng.standard_normal((4, 3)).astype(F32)
    bias = rng.standard_normal(3).astype(F32)
    out = np.zeros((5, 3), dtype=F32)
    for k in range(4):
        out = (out + (x[:, k:k + 1] * kernel[k]).astype(F32)).astype(F32)
    out = (out + bias).astype(F32)
    # the sequential tree over 4 products and the bias (term 4): ((((0+1)+2)+3)+4)
    entry = {"trees": [[[0, 1], [5, 2], [6, 3], [7, 4]]], "terms": 5, "bias": True}
    checked = {"dense": {"class_name": "Dense", "inbound": "input", "activation": "linear"}}
    weights = {"weights/dense/0": kernel, "weights/dense/1": bias}

    def verdict(outputs):
        return replay_layers({"dense": entry}, checked, weights,
                             {"input": x, "dense": outputs}, "float32",
                             replay_samples=2)["dense"]

    assert verdict(out)["replayed"] == {"rows": [0, 4]}
    assert verdict(out)["replay"] == "bit-identical without FMA; replayed at 2 of 5 " \
        "samples (analysis.replay_samples)"
    wrong = out.copy()
    wrong[2, 1] = np.nextafter(wrong[2, 1], F32(np.inf))
    assert verdict(wrong)["replay"] == verdict(out)["replay"]
    wrong[4, 0] = np.nextafter(wrong[4, 0], F32(np.inf))
    assert verdict(wrong)["replay"].startswith("differs: 5 of 6 values bit-identical")


def sequential_sums(x: np.ndarray, kernel: np.ndarray, reverse: bool = False) -> np.ndarray:
    """x (..., n) @ kernel (n, units) summed by hand in float32: each product rounded, then
    added one at a time from term 0 (or from term n - 1), each addition rounded."""
    terms = range(kernel.shape[0] - 1, -1, -1) if reverse else range(kernel.shape[0])
    total = None
    for k in terms:
        product = (x[..., k:k + 1] * kernel[k]).astype(F32)
        total = product if total is None else (total + product).astype(F32)
    return total


def test_a_dense_layer_over_tokens_is_replayed_token_by_token_in_each_ones_tree():
    """A Dense layer over (samples, tokens, features), as a transformer's MatMul runs it:
    every token of every sample is a sum of its own (a place of the grid 1 x tokens);
    here token 1 sums from its last term, the others from the first, by hand. The replay
    gives the record's bits with each token's own tree, and says where one is wrong."""
    from bitdrift.analysis.accumulation.replay import replay_layers

    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 4, 5)).astype(F32)
    kernel = rng.standard_normal((5, 3)).astype(F32)
    out = sequential_sums(x, kernel)
    out[:, 1] = sequential_sums(x[:, 1], kernel, reverse=True)
    forward = [[0, 1], [5, 2], [6, 3], [7, 4]]
    backward = [[4, 3], [5, 2], [6, 1], [7, 0]]
    entry = {"trees": [forward, backward], "terms": 5, "bias": False,
             "places": {"grid": [1, 4], "maps": [["0100"]], "searched": [[0, 0, 2]]}}
    checked = {"dense": {"class_name": "Dense", "inbound": "input", "activation": "linear"}}
    weights = {"weights/dense/0": kernel}
    result = replay_layers({"dense": entry}, checked, weights, {"input": x, "dense": out},
                           "float32")["dense"]
    assert result["replay"] == "bit-identical without FMA"
    one_tree = {**entry, "places": {**entry["places"], "maps": [["0000"]]}}
    wrong = replay_layers({"dense": one_tree}, checked, weights, {"input": x, "dense": out},
                          "float32")["dense"]
    assert wrong["replay"].startswith("differs: ")


def test_a_matmul_of_two_activations_is_replayed_with_each_positions_own_operand():
    """Attention's Q @ K^T: (samples, heads, tokens, n) @ (samples, heads, n, tokens), by
    hand in float32 per sample and head; each place (head, token) of the grid sums the
    n products of its own row and its own head's operand, and the replay gives the bits."""
    from bitdrift.analysis.accumulation.replay import replay_layers

    rng = np.random.default_rng(8)
    queries = rng.standard_normal((2, 3, 4, 5)).astype(F32)
    keys = rng.standard_normal((2, 3, 5, 4)).astype(F32)
    out = np.stack([np.stack([sequential_sums(queries[s, h], keys[s, h]) for h in range(3)])
                    for s in range(2)])
    entry = {"trees": [[[0, 1], [5, 2], [6, 3], [7, 4]]], "terms": 5, "bias": False,
             "places": {"grid": [3, 4], "maps": [["0000"] * 3], "searched": [[0, 1, 2]]}}
    checked = {"scores": {"class_name": "MatMul", "inbound": "q", "operand": "k",
                          "activation": "linear", "use_bias": False}}
    result = replay_layers({"scores": entry}, checked, {},
                           {"q": queries, "k": keys, "scores": out}, "float32")["scores"]
    assert result["replay"] == "bit-identical without FMA"
    swapped = replay_layers({"scores": entry}, checked, {},
                            {"q": queries, "k": keys[::-1], "scores": out}, "float32")
    assert swapped["scores"]["replay"].startswith("differs: ")


def test_a_layer_the_replay_cannot_take_says_why_and_the_others_are_replayed():
    """A Dense layer whose recorded input does not fit its kernel (a shape the replay does
    not know) is "not replayed" with the reason; the next layer is still replayed."""
    from bitdrift.analysis.accumulation.replay import replay_layers

    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 4)).astype(F32)
    kernel = rng.standard_normal((4, 3)).astype(F32)
    entry = {"trees": [[[0, 1], [4, 2], [5, 3]]], "terms": 4, "bias": False}
    checked = {name: {"class_name": "Dense", "inbound": "input", "activation": "linear"}
               for name in ("odd", "dense")}
    weights = {"weights/odd/0": rng.standard_normal((6, 3)).astype(F32),
               "weights/dense/0": kernel}
    result = replay_layers({"odd": entry, "dense": entry}, checked, weights,
                           {"input": x, "odd": sequential_sums(x, kernel),
                            "dense": sequential_sums(x, kernel)}, "float32")
    assert result["odd"]["replay"].startswith("not replayed: ValueError: "), result["odd"]
    assert result["odd"]["order"] == result["dense"]["order"] == "sequential"
    assert result["dense"]["replay"] == "bit-identical without FMA"


def test_a_probe_that_fails_leaves_its_layer_unrevealed_with_the_reason():
    """reveal_orders over two Dense layers: one whose probe call raises (as a runtime that
    refuses a node run alone does) is that layer's error, named; the other's order is
    revealed (its probe sums each column in float32, term 0 first, by hand)."""
    import io

    from bitdrift.analysis.accumulation.probes import probe_spec
    from bitdrift.backends import Session
    from bitdrift.run.orders import reveal_orders

    def make(spec, batch):
        def call(kernel, bias):
            if spec["units"] == 2:
                raise RuntimeError("the runtime refuses this node alone\nsecond line")
            ones = np.ones((batch, spec["terms"]), dtype=F32)
            return (sequential_sums(ones, np.asarray(kernel, F32)) + np.asarray(bias, F32)
                    ).astype(F32)

        return call

    layers = {"refused": probe_spec("Dense", {"use_bias": True}, (4,), (4, 2)),
              "dense": probe_spec("Dense", {"use_bias": True}, (4,), (4, 3))}
    session = Session(layers=[], run=None, final=None, accelerator={},
                      order_layers=layers, order_probe=make)
    log = io.StringIO()
    found = reveal_orders(session, {"batch_size": 2, "precision": "float32"}, log=log,
                          what="m on d")
    assert found["refused"] == {"error": "the probe failed: RuntimeError: the runtime "
                                         "refuses this node alone"}
    assert found["dense"]["trees"] == [[[0, 1], [5, 2], [6, 3], [7, 4]]]
    assert "order of refused (1/2): not revealed (the probe failed: RuntimeError" \
        in log.getvalue()


def test_the_replay_switch_skips_the_replay_alone():
    from bitdrift.analysis.accumulation.replay import replay_layers

    entry, checked, weights, out, images = alternating_conv_layer()
    on = replay_layers({"conv": entry}, checked, weights, {"conv": out}, "float32", images)
    off = replay_layers({"conv": entry}, checked, weights, {"conv": out}, "float32", images,
                        replay=False)
    assert on["conv"]["replay"] == "bit-identical without FMA"
    assert off["conv"].pop("replay") == "not replayed: analysis.replay is false"
    assert off["conv"] == {key: value for key, value in on["conv"].items() if key != "replay"}
    assert off["conv"]["trees"] == entry["trees"] and off["conv"]["places"] == entry["places"]


def test_height_counts_the_products_additions_whatever_the_bias_does():
    """``other (height H)`` is the products' sum's height, the bias left out: the same
    products' tree gives the same height with the bias added last or inside."""
    from bitdrift.analysis.accumulation.names import describe, summary
    from bitdrift.analysis.accumulation.trees import Node, restrict

    def tree(order):
        def build(item):
            if isinstance(item, int):
                return item
            kids = [build(child) for child in item]
            terms = tuple(sorted(t for kid in kids for t in
                                 (kid.terms if isinstance(kid, Node) else (kid,))))
            return Node(size=len(terms), children=kids, terms=terms)
        return build(order)

    products = [[[0, 5], 2], [[[3, 4], 1], [6, 7]]]  # no regular shape; 3, 4 four deep
    last = tree([products, 8])
    inside = tree([[[0, 5], 2], [[[[3, 8], 4], 1], [6, 7]]])  # the bias five deep
    assert describe(restrict(last, set(range(8))))["height"] == 4
    assert describe(inside)["height"] == 5  # the whole tree's: not what the name gives
    assert summary(last) == "other (height 4), bias last"
    assert summary(inside) == "other (height 4), bias inside"


# -- the order search at sampled positions ---------------------------------------------------
# A 12x14 output grid, 3x3 'same': pixels whose window reaches the padding sum in index
# order (SEQUENTIAL over the terms they hold), the interior in two lanes (LANES), and the
# interior of the last six columns in a tail loop of its own (blocks of three, bias last).
# At 16 positions the sample is rows 0, 5, 6, 11 x columns 0, 6, 7, 13: corners, edges and
# interior, but no pixel of the tail's interior.
TAIL = [[[[[0, 1], 2], [[3, 4], 5]], [[6, 7], 8]], 9]
WIDE_HEIGHT, WIDE_WIDTH = 12, 14


def wide_conv_spec():
    from bitdrift.analysis.accumulation.probes import probe_spec

    config = {"filters": 2, "kernel_size": [3, 3], "strides": [1, 1], "padding": "same",
              "dilation_rate": [1, 1], "data_format": "channels_last", "groups": 1}
    return probe_spec("Conv2D", config, (WIDE_HEIGHT, WIDE_WIDTH, 1), (3, 3, 1, 2))


def wide_order(live):
    """The order built for each pixel: 0 SEQUENTIAL at the border, 1 LANES inside, 2 TAIL
    inside the last six columns."""
    def order_of(pixel):
        if not live[pixel].all():
            return 0
        return 2 if pixel % WIDE_WIDTH >= WIDE_WIDTH - 6 else 1
    return order_of


def counted(dense):
    calls = [0]

    def call(weights, shift):
        calls[0] += 1
        return dense(weights, shift)
    return call, calls


def test_a_sampled_order_search_finds_each_sampled_pixels_order_with_fewer_calls():
    """At 16 of 168 positions the search finds the border's and the interior's orders at
    every sampled pixel (each tree, restricted to the pixel's terms, is the order built
    there), marks the 152 others not searched ('-' in the map, none known), and makes
    fewer probe calls than the search of every pixel, which also has to search the tail
    loop it finds outside the sample (and finds every pixel's order right)."""
    from bitdrift.analysis.accumulation.probes import conv_grid
    from bitdrift.analysis.accumulation.replay import conv_border
    from bitdrift.analysis.accumulation.reveal import reveal_places
    from bitdrift.record.orders import NOT_SEARCHED

    spec = wide_conv_spec()
    grid, live = conv_grid(spec)
    assert grid == (WIDE_HEIGHT, WIDE_WIDTH)
    orders, order_of = [SEQUENTIAL, LANES, TAIL], wide_order(live)
    border = conv_border(spec["config"], spec["kernel_shape"])
    dense, calls = counted(conv_probe(orders, order_of, spec))
    sampled = reveal_places(dense, spec["terms"], spec["units"], grid=grid, live=live,
                            positions=16, border=border)
    dense, full_calls = counted(conv_probe(orders, order_of, spec))
    full = reveal_places(dense, spec["terms"], spec["units"], grid=grid, live=live)
    ys, xs = [0, 5, 6, 11], [0, 6, 7, 13]
    assert sampled.sampled == (ys, xs) and full.sampled is None
    inside = {y * WIDE_WIDTH + x for y in ys for x in xs}
    assert {order_of(pixel) for pixel in inside} == {0, 1}  # the tail is not sampled
    for found, pixels in ((sampled, inside), (full, range(WIDE_HEIGHT * WIDE_WIDTH))):
        for pixel in pixels:
            keep = set(np.flatnonzero(live[pixel]).tolist())
            index = found.tree_of[0, pixel]
            assert index >= 0, pixel
            assert canonical(nested(found.trees[index]), keep) == \
                canonical(orders[order_of(pixel)], keep), pixel
    outside = sorted(set(range(WIDE_HEIGHT * WIDE_WIDTH)) - inside)
    assert np.all(sampled.tree_of[0, outside] == NOT_SEARCHED)
    assert all((y * WIDE_WIDTH + x) in inside for _, y, x in sampled.entry(10, True)[
        "places"]["searched"])
    assert any(order_of(pixel) == 2 for _, pixel in full.searched)  # the tail, searched
    assert 0 < calls[0] < full_calls[0]


def test_a_grid_within_the_positions_is_searched_whole_as_before():
    """The default run's case: a grid of no more pixels than the positions asked is
    searched at every pixel, the entry (and its calls) the same as without a sample: no
    'sampled', no '-' in the map, the name without the sample's words."""
    from bitdrift.analysis.accumulation.names import order_name
    from bitdrift.analysis.accumulation.probes import conv_grid
    from bitdrift.analysis.accumulation.reveal import reveal_places
    from bitdrift.analysis.accumulation.trees import from_flat

    spec = small_conv_spec()
    (height, width), live = conv_grid(spec)
    entries, counts = [], []
    for positions in (None, height * width, 1024):
        dense, calls = counted(conv_probe([SEQUENTIAL, LANES], lambda p: p % width % 2,
                                          spec))
        found = reveal_places(dense, spec["terms"], spec["units"], grid=(height, width),
                              live=live, positions=positions)
        entries.append(found.entry(10, True))
        counts.append(calls[0])
    assert entries[0] == entries[1] == entries[2] and counts[0] == counts[1] == counts[2]
    places = entries[0]["places"]
    assert "sampled" not in places and places["maps"] == [["101010"] * height]
    name = order_name([from_flat(tree, 10) for tree in entries[0]["trees"]], places, True)
    assert name == "varies by position (2 trees; searched at (2,3), (2,4) of 5x6): " \
        "2 interleaved lanes, bias inside at 15 pixels; sequential, bias last at 15 pixels"


def sampled_wide_entry():
    from bitdrift.analysis.accumulation.probes import conv_grid
    from bitdrift.analysis.accumulation.replay import conv_border
    from bitdrift.analysis.accumulation.reveal import reveal_places

    spec = wide_conv_spec()
    grid, live = conv_grid(spec)
    found = reveal_places(conv_probe([SEQUENTIAL, LANES, TAIL], wide_order(live), spec),
                          spec["terms"], spec["units"], grid=grid, live=live, positions=16,
                          border=conv_border(spec["config"], spec["kernel_shape"]))
    return found.entry(10, True), live


def test_a_sampled_search_is_named_and_recorded_for_its_positions_alone():
    """The record's map marks the pixels outside rows 0, 5, 6, 11 x columns 0, 6, 7, 13
    with '-' and names the sample; the order's name counts the sampled pixels alone (12
    at the border, 4 inside: counted here from the orders built) and says how many were
    searched; the findings' words say so; the record's check accepts it and refuses a map
    whose '-' are not the pixels outside the sample."""
    from bitdrift.analysis.accumulation.names import order_name
    from bitdrift.analysis.accumulation.trees import from_flat
    from bitdrift.record.orders import checked_orders
    from bitdrift.report.findings.orders import order_phrase

    entry, live = sampled_wide_entry()
    places = entry["places"]
    assert places["sampled"] == {"y": [0, 5, 6, 11], "x": [0, 6, 7, 13]}
    (lines,) = places["maps"]
    for y, line in enumerate(lines):
        for x, char in enumerate(line):
            assert (char == "-") == (y not in (0, 5, 6, 11) or x not in (0, 6, 7, 13))
    trees = [from_flat(tree, 10) for tree in entry["trees"]]
    name = order_name(trees, places, True)
    order_of = wide_order(live)
    built = [order_of(y * WIDE_WIDTH + x) for y in (0, 5, 6, 11) for x in (0, 6, 7, 13)]
    assert built.count(0) == 12 and built.count(1) == 4
    assert name == "varies by position (5 trees; searched at (6,7), (11,7), (6,13), (0,7), " \
        "(6,0) of 12x14): 2 interleaved lanes, bias inside at 4 pixels; sequential, bias " \
        "last: 4 trees at 4/3/3/2 pixels (order searched at 16 of 168 positions)"
    assert 4 + 3 + 3 + 2 == built.count(0)
    assert "order unknown" not in name and "not searched" not in name
    phrase = order_phrase(name)
    assert phrase.endswith(", at the 16 of 168 output positions searched (the others' "
                           "order not searched)")
    assert "in 2 interleaved partial sums, the bias added inside the sum, over 4 pixels" \
        in phrase
    assert checked_orders({"conv": {**entry, "order": name}}, ValueError) is not None
    wrong = {**places, "maps": [[lines[0].replace("-", "0", 1), *lines[1:]]]}
    with pytest.raises(ValueError, match="other pixels than those outside 'sampled'"):
        checked_orders({"conv": {**entry, "order": name, "places": wrong}}, ValueError)
    with pytest.raises(ValueError, match="other pixels than those outside 'sampled'"):
        checked_orders({"conv": {**entry, "order": name, "places": {
            key: value for key, value in places.items() if key != "sampled"}}}, ValueError)
    with pytest.raises(ValueError, match="'sampled' is not"):
        checked_orders({"conv": {**entry, "order": name, "places": {
            **places, "sampled": {"y": [0, 12], "x": [0]}}}}, ValueError)


def test_a_uniform_sampled_order_is_one_name_for_its_positions():
    """One order at every pixel, searched at 16 of 168: the plain name, said to hold at
    the positions searched."""
    from bitdrift.analysis.accumulation.names import order_name
    from bitdrift.analysis.accumulation.probes import conv_grid
    from bitdrift.analysis.accumulation.replay import conv_border
    from bitdrift.analysis.accumulation.reveal import reveal_places
    from bitdrift.analysis.accumulation.trees import from_flat

    spec = wide_conv_spec()
    grid, live = conv_grid(spec)
    found = reveal_places(conv_probe([SEQUENTIAL], lambda p: 0, spec), spec["terms"],
                          spec["units"], grid=grid, live=live, positions=16,
                          border=conv_border(spec["config"], spec["kernel_shape"]))
    entry = found.entry(10, True)
    assert len(entry["trees"]) == 1
    assert order_name([from_flat(entry["trees"][0], 10)], entry["places"], True) == \
        "sequential, bias last (order searched at 16 of 168 positions)"


def test_a_replay_beyond_the_sampled_search_counts_the_values_not_searched():
    """The sampled search's entry replayed at the same 16 positions meets no pixel left
    out; replayed at every position, the 152 pixels x 2 filters outside the sample are
    counted as not searched, and the 16 x 2 replayed are the record's bits."""
    from bitdrift.analysis.accumulation.probes import conv_patches
    from bitdrift.analysis.accumulation.replay import replay_layers

    entry, live = sampled_wide_entry()
    spec = wide_conv_spec()
    order_of = wide_order(live)
    rng = np.random.default_rng(5)
    image = rng.standard_normal((1, WIDE_HEIGHT, WIDE_WIDTH, 1)).astype(F32)
    kernel = rng.standard_normal((3, 3, 1, 2)).astype(F32)
    bias = rng.standard_normal(2).astype(F32)
    config = {key: spec["config"][key] for key in ("strides", "dilation_rate", "padding")}
    patches = conv_patches(image, config, kernel.shape, (1, WIDE_HEIGHT, WIDE_WIDTH))
    flat = kernel.reshape(9, 2)
    out = np.zeros((WIDE_HEIGHT * WIDE_WIDTH, 2), dtype=F32)
    orders = [SEQUENTIAL, LANES, TAIL]
    for pixel, patch in enumerate(patches):
        terms = [(patch[t] * flat[t]).astype(F32) for t in range(9)]
        out[pixel] = evaluate(orders[order_of(pixel)], [*terms, bias])
    checked = {"conv": {"class_name": "Conv2D", "inbound": None, "activation": "linear",
                        **config}}
    weights = {"weights/conv/0": kernel, "weights/conv/1": bias}
    outputs = {"conv": out.reshape(1, WIDE_HEIGHT, WIDE_WIDTH, 2)}
    same = replay_layers({"conv": entry}, checked, weights, outputs, "float32", image,
                         replay_positions=16)["conv"]
    assert same["replay"] == "bit-identical without FMA; replayed at 16 of 168 positions " \
        "of 1 of 1 samples (analysis.replay_positions, analysis.replay_samples)"
    every = replay_layers({"conv": entry}, checked, weights, outputs, "float32",
                          image)["conv"]
    assert every["replay"] == "bit-identical without FMA; 304 of 336 values not replayed " \
        "(order not searched there)"


# -- layers of one probe: one search, each its own replay ------------------------------------
# A stem Conv2D, three Conv2D layers of one probe spec (the same shapes and settings; the
# activation, which the probe leaves out, differs) and a Dense head: five orders, three
# searches. twin_c's tanh is not replayed (its own verdict, not twin_a's).
TWINS = ("twin_a", "twin_b", "twin_c")
TWIN_MODEL = """
import keras, sys
keras.utils.set_random_seed(0)
inputs = keras.Input((32, 32, 3))
x = keras.layers.Conv2D(4, 3, strides=4, padding="same", name="stem")(inputs)
for name, activation in (("twin_a", "relu"), ("twin_b", "linear"), ("twin_c", "tanh")):
    x = keras.layers.Conv2D(4, 3, padding="same", activation=activation, name=name)(x)
x = keras.layers.Dense(10, name="head")(keras.layers.Flatten()(x))
keras.Model(inputs, x).save(sys.argv[1])
"""
TWIN_DEVICE = {"accelerator": "cpu", "threads": 1, "batch_size": 2, "precision": "float32",
               "env": {}, "repeats": 1, "external": False, "backend": "tensorflow"}
# every layer searched on its own, in a fresh process of the device's environment
SEARCH_EACH = """
import json, sys
from bitdrift import backends
from bitdrift.run.orders import reveal_orders
device = json.loads(sys.argv[2])
session = backends.open_session({"device": device, "model_path": sys.argv[1], "layers": True},
                                "d")
print(json.dumps(reveal_orders(session, device, reuse=False)))
"""


@pytest.fixture(scope="module")
def twin_record(tmp_path_factory):
    """(the record's orders, the job's log, the model): an inference of the twin model
    with its orders revealed (kernels=True)."""
    import os
    import subprocess
    import sys

    from bitdrift.inputs.datasets import prepare_dataset
    from bitdrift.record.reader import Record
    from bitdrift.run.inference import infer

    folder = tmp_path_factory.mktemp("twins")
    dataset, model = folder / "digits.h5", folder / "twins.keras"
    prepare_dataset("digits", {"source": "digits", "limit_train": 8, "limit_test": 4}, dataset)
    subprocess.run([sys.executable, "-c", TWIN_MODEL, str(model)], check=True,
                   env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    out = folder / "twins.h5"
    with open(folder / "log", "w") as log:
        infer(model_name="twins", device_name="tf", device=TWIN_DEVICE, model_path=model,
              dataset_path=dataset, samples=[0, 1, 2], out=out, log=log, kernels=True)
    with Record(out) as record:
        orders = record.accumulation_orders
    return orders, (folder / "log").read_text(), model


def test_layers_of_one_probe_share_one_search_that_equals_their_own(twin_record):
    """twin_b and twin_c take twin_a's search (marked searched_at), the stem and the head
    are searched; every layer's order equals the one a search of that layer alone finds
    (reuse=False, another process): the truth the other way."""
    import json
    import subprocess
    import sys

    from bitdrift.run.devices import device_environment

    orders, _, model = twin_record
    assert sorted(orders) == sorted(["stem", *TWINS, "head"])
    assert [layer for layer in orders if "searched_at" in orders[layer]] == ["twin_b", "twin_c"]
    assert orders["twin_b"]["searched_at"] == orders["twin_c"]["searched_at"] == "twin_a"
    alone = json.loads(subprocess.run(
        [sys.executable, "-c", SEARCH_EACH, str(model), json.dumps(TWIN_DEVICE)],
        check=True, capture_output=True, text=True,
        env=device_environment(TWIN_DEVICE)).stdout)
    assert sorted(alone) == sorted(orders)
    for layer, entry in alone.items():
        assert "trees" in entry and "searched_at" not in entry, (layer, entry)
        recorded = {key: orders[layer][key] for key in ("trees", "terms", "bias", "places")}
        assert recorded == entry, layer
    # the twins' probes are one program; the stem's and head's are others
    assert alone["twin_a"] == alone["twin_b"] == alone["twin_c"]
    assert alone["stem"]["terms"] == 3 * 3 * 3 + 1 != alone["twin_a"]["terms"] == 3 * 3 * 4 + 1


def test_layers_of_one_probe_are_each_replayed_from_their_own_values(twin_record):
    """The replay is each layer's: twin_a (relu) and twin_b (linear) reproduce their own
    recorded outputs bit for bit, twin_c's tanh is not replayed, whatever twin_a's."""
    orders, _, _ = twin_record
    for layer in ("stem", "twin_a", "twin_b", "head"):
        assert orders[layer]["replay"].startswith("bit-identical"), (layer, orders[layer])
    assert orders["twin_c"]["replay"] == "not replayed: activation tanh folded in"


def test_the_log_says_each_layers_order_search_and_replay(twin_record):
    """One line per layer for the search (the worker's, in the job's log), naming it and
    the layer searched where the search was taken from another, and one per replay."""
    import re

    orders, log, _ = twin_record
    searched = re.findall(r"^bitdrift: twins on tf: order of (\w+) \((\d)/5\): (.*)$", log,
                          re.MULTILINE)
    assert [(layer, int(number)) for layer, number, _ in searched] == \
        [(layer, number) for number, layer in enumerate(["stem", *TWINS, "head"], start=1)]
    said = {layer: text for layer, _, text in searched}
    assert said["twin_b"] == said["twin_c"] == "the same probe as twin_a, reused"
    for layer in ("stem", "twin_a", "head"):
        assert re.fullmatch(re.escape(orders[layer]["order"]) + r", \d+\.\d s", said[layer])
    replayed = re.findall(r"^bitdrift: twins on tf: replay of (\w+) \((\d)/5\): (.*), "
                          r"\d+\.\d s$", log, re.MULTILINE)
    assert [(layer, text) for layer, _, text in replayed] == \
        [(layer, orders[layer]["replay"]) for layer in ["stem", *TWINS, "head"]]
