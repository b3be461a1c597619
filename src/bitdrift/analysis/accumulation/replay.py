"""numpy replaying a layer in its revealed order from the record's inputs and weights:
whether the device's bits follow from the order alone, per output position sampled.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from bitdrift.analysis.accumulation.names import order_name
from bitdrift.analysis.accumulation.probes import conv_patches, sampled_grid, sampled_samples
from bitdrift.analysis.accumulation.trees import Node, OrderError, _post_order, _terms, from_flat
from bitdrift.record.orders import (
    EITHER_FUSED,
    HIGHER_FUSED,
    LOWER_FUSED,
    NOT_SEARCHED,
    place_trees,
)


# -- replaying a layer in the revealed order -----------------------------------------------
def replay(tree: Node, inputs: np.ndarray, kernel: np.ndarray, bias_values: np.ndarray | None,
           fma: bool, fused_product: str = HIGHER_FUSED) -> np.ndarray:
    """A float32 Dense layer recomputed by numpy in ``tree``'s order: ``inputs`` (rows, n),
    ``kernel`` (n, units), the bias as term n when given. Without ``fma`` every product is
    rounded to float32 and every addition is float32's. With ``fma`` every node where a
    product meets an accumulator is one fused multiply-add, round(acc + a * b) with one
    rounding (_round_sum): the accumulator is the partial sum below the node, or the
    bias where the sum starts from it (XNNPACK), or, where two products meet, one of them
    rounded alone: ``fused_product`` says which is fused onto it, HIGHER_FUSED (the
    product of the higher term index; the lower one rounded) or LOWER_FUSED. The tree
    cannot tell them apart, and kernels differ (issue 63: MKL's sgemm on an Intel Xeon with
    AVX-512 fuses the lower one). A node adding more than two operands, or two partial
    sums, adds them in index order, each addition rounded."""
    x = inputs.astype(np.float32)
    w = kernel.astype(np.float32)
    n = w.shape[0]
    exact = x.astype(np.float64)[:, :, None] * w.astype(np.float64)[None]  # exact products
    rounded = exact.astype(np.float32)

    def leaf(term):
        if term == n:
            return np.broadcast_to(bias_values.astype(np.float32), rounded.shape[::2]).copy()
        return rounded[:, term, :]

    def value(node, values):
        """A node's value from its children's (computed before it: post-order)."""
        def of(child):
            return values.pop(id(child)) if isinstance(child, Node) else leaf(child)

        children = sorted(node.children, key=lambda c: min(_terms(c)))
        products = [k for k, c in enumerate(children) if not isinstance(c, Node) and c != n]
        if fma and len(children) == 2 and products:
            # the product fused onto the other operand: the accumulator, the bias, or
            # (two products) the one rounded alone
            fused = products[0] if fused_product == LOWER_FUSED else products[-1]
            return _round_sum(of(children[1 - fused]).astype(np.float64),
                              exact[:, children[fused], :])
        total = of(children[0])
        for child in children[1:]:
            total = (total + of(child)).astype(np.float32)
        return total

    values: dict[int, np.ndarray] = {}
    for node in _post_order(tree):
        values[id(node)] = value(node, values)
    return values[id(tree)]


def products_meet(tree: Node, terms: int) -> bool:
    """Whether some node of ``tree`` adds two products alone (neither of them the bias,
    term ``terms``): where an FMA replay must choose which product to fuse."""
    return any(len(node.children) == 2 and not any(
        isinstance(child, Node) or child == terms for child in node.children)
        for node in _post_order(tree))


def _round_sum(partial: np.ndarray, product: np.ndarray) -> np.ndarray:
    """float32(partial + product) rounded once. The float64 sum and its exact error
    (TwoSum) give the exact value; rounding the float64 sum to float32 is right unless it
    lands exactly halfway between two float32 numbers while the error is not 0: then the
    exact value lies on the error's side of that tie."""
    total = partial + product
    virtual = total - partial
    error = (partial - (total - virtual)) + (product - virtual)
    nearest = total.astype(np.float32)
    other = np.nextafter(nearest, np.where(total > nearest, np.inf, -np.inf).astype(np.float32))
    middle = (nearest.astype(np.float64) + other.astype(np.float64)) / 2
    tie = (error != 0) & (total == middle) & (total != nearest.astype(np.float64))
    side = np.where(error > 0, np.maximum(nearest, other), np.minimum(nearest, other))
    return np.where(tie, side, nearest).astype(np.float32)


# -- the replay at sampled places ------------------------------------------------------------
# The replay recomputes every product of a layer in numpy: a ResNet-50 at 224 took 7 min
# per device and a 142 GB working array at 100 samples. It runs at a stated number of
# output positions and samples (config analysis.replay_positions, replay_samples; these
# are the schema's defaults), so its cost does not grow with the image or the samples.
# A Conv2D's order can vary by position: the borders hold fewer terms, a vector loop can
# start each pixel at another offset (period 4 on AVX-512); the sample keeps both.
REPLAY_POSITIONS = 1024
REPLAY_SAMPLES = 8
REPLAY_CHUNK_BYTES = 64 * 2**20  # the exact products one replay call holds, at most


def conv_border(spec: dict, kernel_shape) -> tuple[int, int]:
    """Output pixels at each end of each axis whose window can reach the padding."""
    strides = spec.get("strides", [1, 1])
    dilation = spec.get("dilation_rate", [1, 1])
    if spec.get("padding") != "same":
        return 1, 1
    return tuple(max(1, -(-((size - 1) * rate // 2) // stride)) for size, rate, stride
                 in zip(kernel_shape[:2], dilation, strides, strict=True))


def replay_layers(orders: dict, checked: dict, weights: dict, outputs: dict,
                  precision: str, model_input: np.ndarray | None = None,
                  replay: bool = True, replay_positions: int = REPLAY_POSITIONS,
                  replay_samples: int = REPLAY_SAMPLES,
                  report: Callable[[str, int, int, dict, float], None] | None = None) -> dict:
    """Per Dense or Conv2D layer with a revealed order: the order's name (order_name), and
    whether numpy replaying the layer in that order (a Conv2D as the GEMM of its input
    patches, each pixel's sum in its own tree), from the recorded input activation
    (``model_input`` for the first layer) and the weights the device used, gives the
    recorded output bit for bit (with or without FMA; with FMA where two products meet,
    each tried fused, the entry's ``fused_product`` saying which one gives the record's
    bits: replay_verdict); values whose place has no known tree are left out and
    counted. ``outputs``: {layer: array (samples, ...)} of the record (repeat 0);
    ``weights``: {"weights/LAYER/0": kernel, ".../1": bias} as the
    device had them. The replay runs at ``replay_samples`` samples and a Conv2D's
    ``replay_positions`` output pixels (sampled_samples, sampled_grid; all where there
    are no more), which the entry's ``replayed`` names where some are left out;
    ``replay=False`` names the orders and replays none. An entry's ``searched_at`` (its
    order taken from that layer's search: bitdrift.run.orders.reveal_orders) is kept; each
    layer is replayed from its own values. ``report(layer, number, count, entry,
    seconds)``: called after each layer (the job's progress lines)."""
    results = {}
    for number, (layer, found) in enumerate(orders.items(), start=1):
        started = time.perf_counter()
        results[layer] = _replayed_layer(layer, found, checked, weights, outputs, precision,
                                         model_input, replay, replay_positions,
                                         replay_samples)
        if "searched_at" in found:
            results[layer]["searched_at"] = found["searched_at"]
        if report is not None:
            report(layer, number, len(orders), results[layer], time.perf_counter() - started)
    return results


def _replayed_layer(layer, found, checked, weights, outputs, precision, model_input, replay,
                    replay_positions, replay_samples) -> dict:
    """replay_layers' entry of one layer."""
    if "trees" not in found:
        return {"order": "not revealed", "replay": found.get("error", "")}
    trees = [from_flat(tree, found["terms"]) for tree in found["trees"]]
    entry = {"order": order_name(trees, found.get("places"), bool(found.get("bias"))),
             "terms": found["terms"], "trees": found["trees"],
             "bias": bool(found.get("bias"))}
    if "places" in found:
        entry["places"] = found["places"]
    spec = checked.get(layer)
    # a MatMul of two activations: its second operand is recorded, one per sample
    kernel = outputs.get(spec["operand"]) if spec and spec.get("operand") else \
        weights.get(f"weights/{layer}/0")
    inbound = (outputs.get(spec["inbound"]) if spec["inbound"] else model_input) \
        if spec else None
    reason = ("not replayed: analysis.replay is false" if not replay else
              f"not replayed: {precision}" if precision != "float32" else
              "not replayed: its input is not recorded" if spec is None or kernel is None
              or inbound is None or layer not in outputs else
              f"not replayed: activation {spec['activation']} folded in"
              if spec["activation"] not in ("linear", "relu") else "")
    if reason:
        entry["replay"] = reason
        return entry
    bias = weights.get(f"weights/{layer}/1") if found.get("bias") else None
    output = outputs[layer]
    if spec["class_name"] == "Conv2D" and spec.get("data_format") == "channels_first":
        # an ONNX Conv's or a torch program's NCHW values, replayed channels-last as
        # their probes were read
        inbound, output = np.moveaxis(inbound, 1, -1), np.moveaxis(output, 1, -1)
    try:
        entry.update(_replayed(found, trees, spec, kernel, bias, inbound,
                               output, replay_positions, replay_samples))
    except Exception as error:  # noqa: BLE001 - any layer's failure is that layer's alone
        # one layer the replay cannot take (a shape it does not know) is recorded as such;
        # the device's record and the other layers' replays stand
        said = (str(error).strip().splitlines() or [""])[0][:300]
        entry["replay"] = f"not replayed: {type(error).__name__}: {said}"
    return entry


def _replayed(found, trees, spec, kernel, bias, inbound, output, positions: int,
              samples: int) -> dict:
    """replay_layers' verdict on one layer: ``replay`` and, where the replay sampled,
    ``replayed`` {"rows": samples in run order, and a Conv2D's or an N-D Dense layer's
    "y", "x": the grid's rows and columns}.

    The GEMM each layer runs, a row per sum: a Dense layer over (batch, terms) a row per
    sample; over (batch, ..., terms) (a transformer's (batch, tokens, features)) a row
    per leading position of each sample, its places (dense_grid: the last leading axis
    the columns, the others' product the rows), as a Conv2D's output pixels are; a
    Conv2D a row per output pixel, each group of a grouped one (depthwise: one channel
    per group) its own GEMM of its channels and filters; a MatMul of two activations
    (batch, ..., M, K) @ (batch, ..., K, N) the GEMM of each sample's leading position,
    its rows M, its kernel that position's recorded (K, N) operand."""
    rows = sampled_samples(inbound.shape[0], samples)
    units = kernel.shape[-1]
    conv = spec["class_name"] == "Conv2D"
    operands = spec["class_name"] == "MatMul"  # a kernel per sample and leading position
    if operands:
        if kernel.ndim != inbound.ndim or kernel.ndim < 3 or \
                kernel.shape[-2] != inbound.shape[-1]:
            raise ValueError(f"a MatMul of {inbound.shape[1:]} and {kernel.shape[1:]} per "
                             "sample: not (..., M, K) @ (..., K, N)")
        # the leading axes broadcast, as ONNX's MatMul broadcasts them
        lead = np.broadcast_shapes(inbound.shape[1:-2], kernel.shape[1:-2])
        inbound = np.broadcast_to(inbound, (inbound.shape[0], *lead, *inbound.shape[-2:]))
        kernel = np.broadcast_to(kernel, (kernel.shape[0], *lead, *kernel.shape[-2:]))
    elif kernel.ndim != 2 and not conv:
        raise ValueError(f"a Dense kernel of shape {kernel.shape}, not (terms, units)")
    if not conv and inbound.shape[-1] != kernel.shape[-2 if operands else 0]:
        raise ValueError(f"its input's last axis ({inbound.shape[-1]}) is not the kernel's "
                         f"{kernel.shape[-2 if operands else 0]} terms")
    if conv:  # the GEMM it runs: a row per output pixel
        height, width = output.shape[1:3]
        border = conv_border(spec, kernel.shape)
    elif inbound.ndim > 2:  # the GEMM of the leading positions: a row per place
        height, width = (int(np.prod(inbound.shape[1:-2], dtype=np.int64)),
                         inbound.shape[-2])
        border = (1, 1)
    else:
        height = width = 1
    grouped = conv and kernel.shape[2] != inbound.shape[-1]
    if height * width > 1 or conv:
        ys, xs = sampled_grid((height, width), positions, border)
        pixels = height * width
        picked = (np.asarray(ys)[:, None] * width + np.asarray(xs)[None, :]).reshape(-1)
    else:
        pixels, picked, ys, xs = 1, np.zeros(1, dtype=int), [0], [0]
    # (columns of the output, the GEMM's kernel, its input's channels): a grouped
    # Conv2D's groups, each its own GEMM; a Dense layer or an ungrouped Conv2D one
    if grouped:
        groups = int(spec.get("groups", 1))
        per_group, filters = kernel.shape[2], units // groups
        if groups * per_group != inbound.shape[-1] or groups * filters != units:
            raise ValueError(f"a Conv2D of {groups} groups whose kernel {kernel.shape} does "
                             f"not split its {inbound.shape[-1]} input channels")
        gemms = [(slice(g * filters, (g + 1) * filters),
                  kernel[..., g * filters:(g + 1) * filters].reshape(-1, filters),
                  slice(g * per_group, (g + 1) * per_group)) for g in range(groups)]
    elif not operands:
        gemms = [(slice(None), kernel.reshape(-1, units), slice(None))]

    def pieces(block):
        """(the recorded rows of ``block`` it computes, their input rows, the GEMM's
        kernel, the output's columns, the bias): each GEMM of the block's values."""
        if operands:  # per sample and leading row of the grid: that position's operand
            per_sample = len(picked)
            for at, sample in enumerate(block):
                left = inbound[sample].reshape(height, width, -1)
                right = kernel[sample].reshape(height, *kernel.shape[-2:])
                for row_at, y in enumerate(ys):
                    first = at * per_sample + row_at * len(xs)
                    yield (np.arange(first, first + len(xs)), left[y, xs], right[y],
                           slice(None), bias)
            return
        everything = np.arange(len(block) * len(picked))
        for columns, gemm, channels in gemms:
            if conv:
                x = conv_patches(inbound[block][..., channels], spec,
                                 (*kernel.shape[:3], units), output.shape, ys, xs)
            else:
                x = inbound[block].reshape(len(block), pixels, -1)[:, picked].reshape(
                    -1, inbound.shape[-1])
            yield (everything, x, gemm, columns,
                   None if bias is None else np.asarray(bias)[columns])

    if conv:
        blocks = [[row] for row in rows]  # one sample of a Conv2D at a time: its patches
        recorded_of = lambda block: output[block][:, ys][:, :, xs].reshape(-1, units)  # noqa: E731
    else:
        blocks = [rows]
        recorded_of = lambda block: output[block].reshape(len(block), pixels, units)[  # noqa: E731
            :, picked].reshape(-1, units)
    which_all = _value_trees(found, len(trees), inbound.shape[0], pixels).reshape(-1, pixels)
    # (fma, the product fused where two meet): both products tried where two meet
    gemm_terms = kernel.shape[-2] if operands else gemms[0][1].shape[0]
    variants = [(False, HIGHER_FUSED), (True, HIGHER_FUSED)] + (
        [(True, LOWER_FUSED)] if any(products_meet(tree, gemm_terms) for tree in trees)
        else [])
    verdicts, total, size, unsearched = dict.fromkeys(variants, 0), 0, 0, 0
    for block in blocks:
        recorded = recorded_of(block)
        which = which_all[block][:, picked].reshape(-1)
        known = which >= 0
        total += int(recorded[known].size)
        size += int(recorded.size)
        unsearched += int(recorded[which == NOT_SEARCHED].size)
        for variant in variants:
            values = np.empty_like(recorded)
            for at, x, gemm, columns, piece_bias in pieces(block):
                chunk = max(1, REPLAY_CHUNK_BYTES // (gemm.shape[0] * gemm.shape[1] * 8))
                for index, tree in enumerate(trees):
                    where = np.flatnonzero(which[at] == index)  # rows of x
                    for start in range(0, len(where), chunk):
                        part = where[start:start + chunk]
                        values[at[part], columns] = replay(tree, x[part], gemm, piece_bias,
                                                           *variant)
            if spec["activation"] == "relu":
                values = np.maximum(values, np.float32(0))
            verdicts[variant] += int(np.sum(values[known].view(np.uint32)
                                            == recorded[known].view(np.uint32)))
    unknown = size - total - unsearched
    left = (f"; {unknown} of {size} values not replayed (order unknown there)"
            if unknown else "") + (
        f"; {unsearched} of {size} values not replayed (order not searched there)"
        if unsearched else "")
    sampled = len(rows) < inbound.shape[0] or len(ys) * len(xs) < pixels
    if sampled:
        left += (f"; replayed at {len(ys) * len(xs)} of {pixels} positions of "
                 f"{len(rows)} of {inbound.shape[0]} samples (analysis.replay_positions, "
                 "analysis.replay_samples)" if pixels > 1 or conv else
                 f"; replayed at {len(rows)} of {inbound.shape[0]} samples "
                 "(analysis.replay_samples)")
    found_entry = replay_verdict(verdicts, total, left)
    if sampled:
        found_entry["replayed"] = {"rows": rows, "y": ys, "x": xs} if pixels > 1 or conv \
            else {"rows": rows}
    return found_entry


def replay_verdict(verdicts: dict, total: int, left: str = "") -> dict:
    """The replay's ``replay`` words on a layer, and where it was bit-identical with FMA
    and two products meet, its ``fused_product``: from ``verdicts`` {(fma, the product
    fused where two meet): values bit-identical}, of ``total`` replayed, ``left`` saying
    what was left out. A bit-identical layer's words are those of records made before
    both products were tried (those fused the higher-index one), the fused product a key
    of its own; a layer that differs names it in its best arithmetic's words."""
    tried = {product for fma, product in verdicts if fma}
    exact = [(fma, product) for (fma, product), count in verdicts.items()
             if total and count == total]
    fused = [product for fma, product in exact if fma]
    if fused:
        found = {"replay": "bit-identical with FMA" + left}
        if len(tried) > 1:  # two products meet: which one the kernel fuses
            found["fused_product"] = fused[0] if len(fused) == 1 else EITHER_FUSED
        return found
    if exact:
        return {"replay": "bit-identical without FMA" + left}
    best = max(verdicts.values())
    fma, product = next(variant for variant in verdicts if verdicts[variant] == best)
    ties = {other for other_fma, other in verdicts
            if other_fma and verdicts[(other_fma, other)] == best}
    how = "without FMA" if not fma else "with FMA" if len(tried) == 1 else \
        "with FMA, either product fused where two meet" if len(ties) > 1 else \
        f"with FMA, the product of {product} fused where two meet"
    return {"replay": f"differs: {best} of {total} values bit-identical at best ({how})"
                      + left}


def _value_trees(found: dict, trees: int, samples: int, pixels: int) -> np.ndarray:
    """(samples * pixels,) the tree each output value summed in (UNKNOWN, NOT_SEARCHED
    outside a sampled search); sample k ran in batch row k mod batch
    (bitdrift.run.selection.batch_indices). Records without ``places`` keep one tree, or one
    per batch row."""
    places = found.get("places")
    if places is None:
        return np.repeat(np.arange(samples) % trees, pixels)
    if int(np.prod(places["grid"])) != pixels:
        raise OrderError(f"the order's grid {places['grid']} is not the layer's "
                         f"{pixels} output pixels")
    return place_trees(places, samples).reshape(-1)
