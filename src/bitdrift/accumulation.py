"""The order in which a kernel sums, revealed by testing it (after FPRev: Xie, Gao, Wang,
Xue, "Revealing Floating-Point Accumulation Orders in Software/Hardware Implementations",
USENIX ATC 2025).

A sum of n terms is a tree. Give term i the value +M, term j the value -M and every other
term 1, with M so large that adding any count of ones to ±M changes nothing (swamping).
Every partial sum that holds one of i, j is then exactly ±M, the node where i and j meet
gives 0, and only the ones added after that node survive: the output is n minus the
number of terms under the node where i and j meet. Those sizes for all pairs determine
the tree. A dot product is such a sum (its terms are the products, exact as long as the
factors are), and a Dense layer's output columns are independent dot products, so one
call with one probe pair per column reveals many pairs at once.

With float16 inputs (summed in float32, as most kernels do) M and the unit are 2**15 and
2**-24, the extremes float16 holds; the output then counts units.

A kernel that adds in a wider format (float64 accumulators) does not swamp; the outputs
are then not the integers this needs, and the revealing stops with an error saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from bitdrift.errors import BitdriftError, json_kind

# The probe's values (M, the unit) per input format, the sums being float32 or wider.
# 2**40: a float32 sum of up to 2**15 ones added to it stays exactly ±2**40 (its ulp is
# 2**17), and 2**40 - 2**40 is exactly 0; in float64, 2**72 (ulp 2**20). bfloat16 holds
# 2**40 and 1 exactly. float16 tops out at 65504: M = 2**15 and the unit its smallest
# subnormal, 2**-24, keep the ratio (a float32 sum of up to 2**15 units stays under half
# an ulp of 2**15, 2**-9); the output counts units.
PROBE_VALUES = {"float32": (2.0**40, 1.0), "float64": (2.0**72, 1.0),
                "bfloat16": (2.0**40, 1.0), "float16": (2.0**15, 2.0**-24)}


def input_dtype(precision: str):
    """The numpy type of a probe's weights in ``precision``."""
    if precision == "bfloat16":
        import ml_dtypes  # numpy has no bfloat16; JAX and TensorFlow install ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(precision).type


# -- the layers whose order is revealed, as one sum per output ----------------------------
# A Dense layer's output column is a dot product of its n inputs; a Conv2D's output channel
# at one pixel is one of kh * kw * cin products (the GEMM it runs): term t is kernel
# position (i, j) and input channel c with t = (i * kw + j) * cin + c, Keras' kernel order.
PROBED_CLASSES = ("Dense", "Conv2D")
CONV_KEYS = ("filters", "kernel_size", "strides", "padding", "dilation_rate", "data_format",
             "groups")


def probe_spec(class_name: str, config: dict, input_shape, kernel_shape) -> dict | None:
    """What revealing a layer's order needs: its class, the settings that shape its sum
    (activation dropped: the sum comes before it), its input per sample, its kernel's
    shape, and the sum's terms and width; None for a layer that is not one such sum."""
    use_bias = bool(config.get("use_bias", True))
    if class_name == "Dense":
        terms, units = (int(size) for size in kernel_shape)
        kept = {"units": units, "use_bias": use_bias}
    elif class_name == "Conv2D" and config.get("data_format", "channels_last") \
            == "channels_last" and int(config.get("groups", 1)) == 1:
        height, width, channels, units = (int(size) for size in kernel_shape)
        terms = height * width * channels
        kept = {key: (list(value) if isinstance(value, tuple) else value)
                for key, value in config.items() if key in CONV_KEYS}
        kept.update(use_bias=use_bias, filters=units, kernel_size=[height, width])
    else:
        return None
    return {"class_name": class_name, "config": {**kept, "activation": "linear"},
            "input_shape": [int(size) for size in input_shape],
            "kernel_shape": [int(size) for size in kernel_shape], "terms": terms,
            "units": units, "use_bias": use_bias}


def probe_output(spec: dict, output: np.ndarray) -> np.ndarray:
    """The (batch, units) sums of a probe's output: a Conv2D's at its centre pixel, whose
    window lies inside the input (every term a product of the input of ones)."""
    output = np.asarray(output)
    if spec["class_name"] == "Conv2D":
        return output[:, output.shape[1] // 2, output.shape[2] // 2, :]
    return output


def conv_patches(x: np.ndarray, spec: dict, kernel_shape, out_shape) -> np.ndarray:
    """A Conv2D's input as the rows of the GEMM it runs: (samples * out_h * out_w,
    kh * kw * cin), term order as ``probe_spec`` says; zero padding as Keras pads."""
    kh, kw, channels, _ = kernel_shape
    sh, sw = spec.get("strides", [1, 1])
    dh, dw = spec.get("dilation_rate", [1, 1])
    _, out_h, out_w = out_shape[:3]
    _, in_h, in_w, _ = x.shape
    pad_h = pad_w = 0
    if spec.get("padding") == "same":
        pad_h = max((out_h - 1) * sh + (kh - 1) * dh + 1 - in_h, 0)
        pad_w = max((out_w - 1) * sw + (kw - 1) * dw + 1 - in_w, 0)
    padded = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2),
                        (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    rows = np.arange(out_h)[:, None] * sh + np.arange(kh)[None, :] * dh  # (out_h, kh)
    cols = np.arange(out_w)[:, None] * sw + np.arange(kw)[None, :] * dw  # (out_w, kw)
    patches = padded[:, rows[:, None, :, None], cols[None, :, None, :], :]
    return patches.reshape(x.shape[0] * out_h * out_w, kh * kw * channels)


class OrderError(BitdriftError):
    exit_code = 1


class RowsDiffer(OrderError):
    """The rows of one batch are summed in different orders (see reveal_rows)."""


def reveal_rows(dense, terms: int, units: int, precision: str, bias: bool,
                batch: int) -> list[Node]:
    """The tree of each row of a batch: one tree for all rows where they agree (the
    usual case), else one per row (a kernel that blocks rows: seen with MKL's sgemm at
    batch 2 and 10 units)."""
    try:
        return [reveal(dense, terms, units, precision, bias)]
    except RowsDiffer:
        return [reveal(dense, terms, units, precision, bias, row=row) for row in range(batch)]


@dataclass
class Node:
    """A node of the summation tree: the terms under it and its children."""

    size: int
    children: list = field(default_factory=list)  # Node or int (a term's index)
    terms: tuple = ()

    def as_list(self):
        """Nested lists of term indices (small trees; deep ones: to_flat)."""
        return [child.as_list() if isinstance(child, Node) else child
                for child in self.children]


def _post_order(tree: Node) -> list[Node]:
    """The tree's nodes, children before parents, without recursion (a sequential sum of
    n terms is n deep)."""
    order, stack = [], [(tree, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(node.children)
                     if isinstance(child, Node))
    return order


def to_flat(tree: Node) -> list[list[int]]:
    """How the record keeps a tree: its nodes in post-order, each the list of its
    children, a child being a term's index (0..n-1) or n + the index of an earlier node."""
    nodes = _post_order(tree)
    number = {id(node): tree.size + index for index, node in enumerate(nodes)}
    return [[number[id(child)] if isinstance(child, Node) else int(child)
             for child in node.children] for node in nodes]


def from_flat(nodes: list[list[int]], terms: int) -> Node:
    """The tree of to_flat's lists over ``terms`` terms."""
    built: list[Node] = []
    for children in nodes:
        kids = [built[child - terms] if child >= terms else child for child in children]
        covered = tuple(sorted(t for kid in kids for t in _terms(kid)))
        built.append(Node(size=len(covered), children=kids, terms=covered))
    if not built:
        return Node(size=1, children=[0], terms=(0,))
    return built[-1]


def probe_sums(dense, pairs: list[tuple[int, int]], terms: int, bias: bool, width: int,
               precision: str = "float32", row: int | None = None) -> dict:
    """{pair: meeting size} from ``dense(kernel, bias)`` called with ``width`` probes per
    call: pair (i, j) puts +M on term i and -M on term j (term ``terms`` is the bias) and
    1 on every other term, so the output counts the terms added after i and j met. Every
    row of the batch must give the same sums (RowsDiffer), unless ``row`` picks one; sums
    that are not such counts (no swamping) are an OrderError."""
    dtype = input_dtype(precision)
    (big, unit), count = PROBE_VALUES[precision], terms + (1 if bias else 0)
    found = {}
    for start in range(0, len(pairs), width):
        chunk = pairs[start:start + width]
        weights = np.full((terms, width), unit, dtype=dtype)
        shift = np.full(width, unit if bias else 0, dtype=dtype)
        for column, pair in enumerate(chunk):
            for term, sign in zip(pair, (1, -1), strict=True):
                if term == terms:
                    shift[column] = sign * big
                else:
                    weights[term, column] = sign * big
        outputs = np.asarray(dense(weights, shift), dtype=np.float64).reshape(-1, width)
        if row is None and not np.all(outputs == outputs[0]):
            raise RowsDiffer("the rows of a batch sum in different orders")
        values = outputs[row or 0, :len(chunk)] / unit
        if not np.all(np.isfinite(values)) or np.any(values != np.round(values)) or \
                np.any(values < 0) or np.any(values > count - 2):
            raise OrderError("the kernel's sums are not counts of the terms left after a "
                             "cancellation: it does not swamp (a wider accumulator, or the "
                             "terms are not summed as given)")
        for pair, value in zip(chunk, values, strict=True):
            found[pair] = count - int(value)
    return found


def meeting_sizes(dense: Callable[[np.ndarray], np.ndarray], n: int,
                  columns_per_call: int = 4096, precision: str = "float32") -> np.ndarray:
    """The n x n matrix of the number of terms under the node where terms i and j meet,
    every pair probed (the all-pairs search; ``reveal`` is the recursive one), from
    ``dense(weights)`` (a float32 (n, k) matrix -> the k outputs of a row of ones through
    a Dense layer with these weights and no bias)."""
    found = probe_sums(lambda weights, _: dense(weights), list(combinations(range(n), 2)),
                       n, bias=False, width=columns_per_call, precision=precision)
    sizes = np.zeros((n, n), dtype=np.int64)
    for (i, j), size in found.items():
        sizes[i, j] = sizes[j, i] = size
    if n > 3 and np.all(sizes[np.triu_indices(n, 1)] == 2):
        # every pair "met first": nothing was swamped, the ones all survived
        raise OrderError("the kernel's sums keep every term: it does not swamp in float32 "
                         "(a wider accumulator)")
    return sizes


def build_tree(sizes: np.ndarray) -> Node:
    """The summation tree from the meeting sizes: clusters join, smallest first, into a
    node whose size is the number of terms under it (several at once where one node adds
    more than two operands). Inconsistent sizes are an error."""
    n = sizes.shape[0]
    parent = list(range(n))
    nodes: dict[int, Node | int] = dict(enumerate(range(n)))
    cluster_size = dict.fromkeys(range(n), 1)

    def root(item):
        while parent[item] != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    for size in sorted({int(v) for v in sizes[np.triu_indices(n, 1)]}):
        members = np.argwhere(np.triu(sizes == size, 1))
        groups: dict[int, set[int]] = {}
        links = {}
        for i, j in members:
            a, b = root(int(i)), root(int(j))
            links.setdefault(a, set()).add(b)
            links.setdefault(b, set()).add(a)
        seen = set()
        for start in links:  # connected groups of current clusters meet at one node
            if start in seen:
                continue
            group, stack = set(), [start]
            while stack:
                item = stack.pop()
                if item in group:
                    continue
                group.add(item)
                stack.extend(links[item] - group)
            seen |= group
            groups[start] = group
        for group in groups.values():
            total = sum(cluster_size[item] for item in group)
            if total != size:
                raise OrderError(f"the meeting sizes are not a summation tree: clusters of "
                                 f"{total} terms meet at a node said to hold {size}")
            children = [nodes[item] for item in sorted(group, key=_first_term(nodes))]
            terms = tuple(sorted(t for child in children for t in _terms(child)))
            node = Node(size=size, children=children, terms=terms)
            keep = min(group)
            for item in group:
                parent[item] = keep
            nodes[keep] = node
            cluster_size[keep] = size
            for item in group - {keep}:
                nodes.pop(item, None)
    roots = {root(item) for item in range(n)}
    if len(roots) != 1:
        raise OrderError("the meeting sizes leave terms that never meet")
    top = nodes[roots.pop()]
    return top if isinstance(top, Node) else Node(size=1, children=[top], terms=(top,))


def _terms(child) -> tuple:
    return child.terms if isinstance(child, Node) else (child,)


def _first_term(nodes):
    return lambda item: min(_terms(nodes[item]))


def describe(tree: Node) -> dict:
    """A compact form of the tree: its height, the widest node (2: every node adds two
    operands), and its shape: ``sequential`` (each node adds one term to the running sum,
    in index order), ``pairwise`` (balanced halves), ``lanes`` (L interleaved partial sums,
    term k in lane k mod L, then combined), ``blocks`` (contiguous blocks summed apart,
    then combined), else ``other``."""
    order = _post_order(tree)
    heights: dict[int, int] = {}
    for node in order:
        heights[id(node)] = 1 + max((heights[id(c)] for c in node.children
                                     if isinstance(c, Node)), default=0)
    n = tree.size
    result = {"terms": n, "height": heights[id(tree)],
              "widest": max(len(node.children) for node in order), "shape": "other"}
    nodes = {node.terms for node in order}
    if _is_sequential(tree):
        result["shape"] = "sequential"
    elif _is_pairwise(tree):
        result["shape"] = "pairwise"
    else:
        lanes = next((count for count in range(2, n // 2 + 1)
                      if all(tuple(range(k, n, count)) in nodes for k in range(count))), None)
        block = next((size for size in range(2, n // 2 + 1)
                      if all(tuple(range(first, min(first + size, n))) in nodes
                             for first in range(0, n, size))), None)
        if lanes:
            result.update(shape="lanes", lanes=lanes)
        elif block:
            result.update(shape="blocks", block=block, blocks=-(-n // block))
    return result


def _chain(node: Node) -> list | None:
    """The terms in the order they join the running sum when each node adds one term to
    it (the first two as a set, added together), else None."""
    joined = []
    while isinstance(node, Node):
        if len(node.children) != 2:
            return None
        inner = [c for c in node.children if isinstance(c, Node)]
        leaves = [c for c in node.children if not isinstance(c, Node)]
        if len(leaves) == 2:
            return [set(leaves), *reversed(joined)]
        if len(leaves) != 1:
            return None
        joined.append(leaves[0])
        node = inner[0]
    return None


def _is_sequential(node: Node, first=None) -> bool:
    """Each node adds one term to the sum of the terms before it, in index order (after
    ``first``, where a term other than 0 opens the sum: a bias the accumulator starts from)."""
    chain = _chain(node)
    if chain is None:
        return False
    order = sorted(node.terms) if first is None else \
        [first, *sorted(set(node.terms) - {first})]
    return chain[0] == set(order[:2]) and chain[1:] == order[2:]


def _is_pairwise(node) -> bool:
    if not isinstance(node, Node):
        return True
    if len(node.children) != 2:
        return False
    sizes = [len(_terms(c)) for c in node.children]
    return abs(sizes[0] - sizes[1]) <= 1 and all(_is_pairwise(c) for c in node.children)


# -- revealing through a Dense call, at the layer's own shapes ----------------------------
def reveal(dense: Callable[[np.ndarray, np.ndarray], np.ndarray], terms: int, units: int,
           precision: str = "float32", bias: bool = True, row: int | None = None) -> Node:
    """The summation tree of a Dense layer's outputs, from ``dense(weights, bias)`` (an
    (n, units) kernel and a (units,) bias -> the layer's output for a batch of rows of
    ones, shape (batch, units)), called at the layer's own width: each call holds
    ``units`` probes. The terms are the n products and, with ``bias``, the bias (term n).

    One term at a time is the pivot (FPRev's recursive search): its meeting sizes with
    the other terms of its group split them into the subtrees met on its way to the root,
    each searched the same way, so a sequential sum needs n - 1 probes and a balanced one
    about n log n. Every row of the batch must give the same sums (else the kernel sums
    rows in different orders, and the error says so), unless ``row`` picks the row whose
    order is revealed (see reveal_rows)."""
    if precision not in PROBE_VALUES:
        raise OrderError(f"the order is revealed with inputs in {', '.join(PROBE_VALUES)}, "
                         f"not {precision}")
    count = terms + (1 if bias else 0)

    def query(pairs):
        return probe_sums(dense, pairs, terms, bias, units, precision, row)

    def solve(group: list[int], ceiling: int) -> list:
        """The subtrees the terms of ``group`` form below a node of ``ceiling`` terms."""
        if len(group) == 1:
            return [group[0]]
        pivot, others = group[0], group[1:]
        sizes = query([(pivot, other) for other in others])
        current: Node | int = pivot
        for size in sorted({sizes[(pivot, other)] for other in others} - {ceiling}):
            if size > ceiling:
                raise OrderError(f"terms {pivot} and others meet above their node")
            members = [other for other in others if sizes[(pivot, other)] == size]
            children = [current, *solve(members, size)]
            node_terms = tuple(sorted(t for child in children for t in _terms(child)))
            if len(node_terms) != size:
                raise OrderError(f"the meeting sizes are not a summation tree: a node of "
                                 f"{len(node_terms)} terms said to hold {size}")
            current = Node(size=size, children=children, terms=node_terms)
        rest = [other for other in others if sizes[(pivot, other)] == ceiling]
        return [current, *(solve(rest, ceiling) if rest else [])]

    forest = solve(list(range(count)), count)
    if len(forest) != 1:
        # every term meets at the root: one node adds them all
        return Node(size=count, children=forest,
                    terms=tuple(sorted(t for tree in forest for t in _terms(tree))))
    top = forest[0]
    if not isinstance(top, Node) or top.size != count:
        raise OrderError("the revealed terms do not all meet")
    return top


def summary(tree: Node, bias: bool = True) -> str:
    """One phrase for ``explain`` and the tables: the shape of the products' sum and where
    the bias enters (``first`` with the first product, ``last`` after all of them)."""
    count = tree.size
    products = tree
    where = ""
    if bias:
        bias_term = count - 1
        if bias_term in tree.children and len(tree.children) == 2:
            other = next(child for child in tree.children if child != bias_term)
            products = other if isinstance(other, Node) else Node(1, [other], (other,))
            where = ", bias last"
        elif _is_sequential(tree, first=bias_term):
            # the accumulator starts from the bias (XNNPACK's, ONNX Runtime's packed GEMM)
            return "sequential, bias first"
        else:
            where = ", bias inside"
    found = describe(products) if isinstance(products, Node) and products.size > 1 \
        else {"shape": "single"}
    name = {"lanes": f"{found.get('lanes')} interleaved lanes",
            "blocks": f"blocks of {found.get('block')}"}.get(found["shape"], found["shape"])
    if found["shape"] == "other":
        name = f"other (height {found['height']})"
    return name + where


# -- replaying a layer in the revealed order -----------------------------------------------
def replay(tree: Node, inputs: np.ndarray, kernel: np.ndarray, bias_values: np.ndarray | None,
           fma: bool) -> np.ndarray:
    """A float32 Dense layer recomputed by numpy in ``tree``'s order: ``inputs`` (rows, n),
    ``kernel`` (n, units), the bias as term n when given. Without ``fma`` every product is
    rounded to float32 and every addition is float32's; with ``fma`` a product added to a
    partial sum is not rounded first (one rounding for the multiply-add), as an FMA unit
    computes it. A node adding more than two operands adds them in index order."""
    x = inputs.astype(np.float32)
    w = kernel.astype(np.float32)
    n = w.shape[0]
    exact = x.astype(np.float64)[:, :, None] * w.astype(np.float64)[None]  # exact products
    rounded = exact.astype(np.float32)

    def leaf(term):
        if term == n:
            return np.broadcast_to(bias_values.astype(np.float32), rounded.shape[::2]).copy()
        return rounded[:, term, :]

    def add_product(partial, term):
        """partial + product(term), one rounding with an FMA."""
        if not fma or term == n:
            return (partial + leaf(term)).astype(np.float32)
        return _round_sum(partial.astype(np.float64), exact[:, term, :])

    def value(node, values):
        """A node's value from its children's (computed before it: post-order)."""
        def of(child):
            return values.pop(id(child)) if isinstance(child, Node) else leaf(child)

        children = sorted(node.children, key=lambda c: min(_terms(c)))
        leaves = [c for c in children if not isinstance(c, Node)]
        inner = [c for c in children if isinstance(c, Node)]
        if fma and len(children) == 2 and len(inner) == 1:
            return add_product(of(inner[0]), leaves[0])
        if fma and len(children) == 2 and not inner:
            first, second = sorted(leaves)
            return add_product(leaf(first), second)
        total = of(children[0])
        for child in children[1:]:
            total = (total + of(child)).astype(np.float32)
        return total

    values: dict[int, np.ndarray] = {}
    for node in _post_order(tree):
        values[id(node)] = value(node, values)
    return values[id(tree)]


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


def by_rows(names: list[str]) -> str:
    """The orders of a batch's rows, runs of rows with the same name together:
    ``by batch row: rows 0-5: sequential, bias last; rows 6-7: 2 interleaved lanes, ...``
    (the trees may still differ within a run: the names are a summary)."""
    runs: list[list] = []
    for row, name in enumerate(names):
        if runs and runs[-1][2] == name:
            runs[-1][1] = row
        else:
            runs.append([row, row, name])
    return "by batch row: " + "; ".join(
        f"row {first}: {name}" if first == last else f"rows {first}-{last}: {name}"
        for first, last, name in runs)


def replay_layers(orders: dict, checked: dict, weights: dict, outputs: dict,
                  precision: str, model_input: np.ndarray | None = None) -> dict:
    """Per Dense or Conv2D layer with a revealed order: the order's summary, and whether
    numpy replaying the layer in that order (a Conv2D as the GEMM of its input patches),
    from the recorded input activation (``model_input`` for the first layer) and the
    weights the device used, gives the recorded output bit for bit (with or without FMA).
    ``outputs``: {layer: array (samples, ...)} of the record (repeat 0); ``weights``:
    {"weights/LAYER/0": kernel, ".../1": bias} as the device had them."""
    results = {}
    for layer, found in orders.items():
        if "trees" not in found:
            results[layer] = {"order": "not revealed", "replay": found.get("error", "")}
            continue
        trees = [from_flat(tree, found["terms"]) for tree in found["trees"]]
        names = [summary(tree, found.get("bias", False)) for tree in trees]
        order = names[0] if len(trees) == 1 else by_rows(names)
        entry = {"order": order, "terms": found["terms"], "trees": found["trees"],
                 "bias": bool(found.get("bias"))}
        spec = checked.get(layer)
        kernel = weights.get(f"weights/{layer}/0")
        inbound = (outputs.get(spec["inbound"]) if spec["inbound"] else model_input) \
            if spec else None
        reason = (f"not replayed: {precision}" if precision != "float32" else
                  "not replayed: its input is not recorded" if spec is None or kernel is None
                  or inbound is None or layer not in outputs else
                  f"not replayed: activation {spec['activation']} folded in"
                  if spec["activation"] not in ("linear", "relu") else "")
        if reason:
            entry["replay"] = reason
            results[layer] = entry
            continue
        bias = weights.get(f"weights/{layer}/1") if found.get("bias") else None
        # sample k ran in batch row k mod batch (bitdrift.inference.batch_indices)
        rows = np.arange(inbound.shape[0]) % len(trees)
        if spec["class_name"] == "Conv2D":  # the GEMM it runs: a row per output pixel
            out_shape = outputs[layer].shape
            x = conv_patches(inbound, spec, kernel.shape, out_shape)
            rows = np.repeat(rows, out_shape[1] * out_shape[2])
            kernel = kernel.reshape(-1, kernel.shape[-1])
        else:
            x = inbound.reshape(inbound.shape[0], -1)
        recorded = outputs[layer].reshape(x.shape[0], -1)
        verdicts = {}
        for fma in (False, True):
            values = np.empty_like(recorded)
            for row, tree in enumerate(trees):
                values[rows == row] = replay(tree, x[rows == row], kernel, bias, fma)
            if spec["activation"] == "relu":
                values = np.maximum(values, np.float32(0))
            verdicts[fma] = int(np.sum(values.view(np.uint32) == recorded.view(np.uint32)))
        total = recorded.size
        if verdicts[True] == total or verdicts[False] == total:
            entry["replay"] = "bit-identical " + ("with FMA" if verdicts[True] == total
                                                  else "without FMA")
        else:
            best = max(verdicts, key=verdicts.get)
            entry["replay"] = (f"differs: {verdicts[best]} of {total} values bit-identical "
                               f"at best ({'with' if best else 'without'} FMA)")
        results[layer] = entry
    return results


# -- the record's attribute ------------------------------------------------------------------
def checked_orders(found, wrong: Callable[[str], Exception]) -> dict | None:
    """The ``accumulation_orders`` attribute of a record, its structure checked where it
    is read (bitdrift.record.Record.accumulation_orders): ``{layer: {"order": text,
    "replay": text, "terms": n, "trees": [[[child, ...], ...]], "bias": bool}}``, each tree
    as to_flat keeps it (a child a term 0..n-1 or n + an earlier node). A record from
    another tool may hold anything: ``wrong(what)`` is raised naming what is wrong."""
    if found is None:
        return None
    if not isinstance(found, dict):
        raise wrong(f"{json_kind(found)}, not an object of layers")
    for layer, entry in found.items():
        if not isinstance(entry, dict):
            raise wrong(f"layer {layer!r} is {json_kind(entry)}, not an object")
        for key, kind, name in (("order", str, "text"), ("replay", str, "text"),
                                ("error", str, "text"), ("bias", bool, "true or false")):
            if key in entry and not isinstance(entry[key], kind):
                raise wrong(f"layer {layer!r}: {key!r} is not {name}")
        terms = entry.get("terms")
        if "terms" in entry and (isinstance(terms, bool) or not isinstance(terms, int)
                                 or terms < 1):
            raise wrong(f"layer {layer!r}: 'terms' is not a count of terms")
        if "trees" not in entry:
            continue
        trees = entry["trees"]
        if "terms" not in entry or "order" not in entry:
            raise wrong(f"layer {layer!r}: 'trees' without 'terms' and 'order'")
        if not isinstance(trees, list) or not trees:
            raise wrong(f"layer {layer!r}: 'trees' is not a list of trees")
        for index, nodes in enumerate(trees):
            if not isinstance(nodes, list) or not all(isinstance(node, list) for node in nodes):
                raise wrong(f"layer {layer!r}: tree {index} is not a list of nodes")
            for number, node in enumerate(nodes):
                for child in node:
                    if isinstance(child, bool) or not isinstance(child, int) \
                            or not 0 <= child < terms + number:
                        raise wrong(f"layer {layer!r}: tree {index}, node {number}: child "
                                    f"{child!r} is neither a term (0..{terms - 1}) nor an "
                                    "earlier node")
    return found


# -- the table over records ------------------------------------------------------------------
TABLE_COLUMNS = ["model", "device", "backend", "layer", "terms", "order", "replay"]


def orders_table(records) -> list[dict]:
    """``accumulation_orders.csv``: per device and Dense layer, the revealed order and its
    replay (records without orders are left out)."""
    rows = []
    for record in records:
        for layer, entry in (record.accumulation_orders or {}).items():
            rows.append({"model": record.model, "device": record.device,
                         "backend": record.attr("backend"), "layer": layer,
                         "terms": entry.get("terms", ""), "order": entry.get("order", ""),
                         "replay": entry.get("replay", "")})
    return rows


# -- two orders side by side (the figure) ---------------------------------------------------
def restrict(tree: Node | int, keep: set[int]) -> Node | int | None:
    """The tree induced on the terms in ``keep``: subtrees without them dropped, a node
    left with one child replaced by that child (what the figure draws of a long sum)."""
    if not isinstance(tree, Node):
        return tree if tree in keep else None
    kids = [kid for kid in (restrict(child, keep) for child in tree.children)
            if kid is not None]
    if not kids:
        return None
    if len(kids) == 1:
        return kids[0]
    covered = tuple(sorted(t for kid in kids for t in _terms(kid)))
    return Node(size=len(covered), children=kids, terms=covered)


def contrasting_pair(divergence, records) -> dict | None:
    """The two devices whose orders the figure draws: a class pair whose first divergent
    layer is a Dense or Conv2D layer with both orders revealed and different (float32
    first), else the two largest groups of devices by order at the first layer where revealed
    orders differ (``first_divergence`` False); None where no two orders differ.
    Returns {"model", "layer", "devices": [a, b], "orders": [...], "trees": [Node, Node],
    "bias": bool, "first_divergence": bool}."""
    found = {(record.model, record.device): record.accumulation_orders or {}
             for record in records}

    def entry(model, device, layer):
        return found.get((model, device), {}).get(layer) or {}

    def revealed(item):
        return "trees" in item and len(item["trees"]) == 1

    def pick(model, layer, devices, first):
        items = [entry(model, device, layer) for device in devices]
        return {"model": model, "layer": layer, "devices": list(devices),
                "orders": [item["order"] for item in items],
                "trees": [from_flat(item["trees"][0], item["terms"]) for item in items],
                # records written before the entry kept "bias" say it in the order's name
                "bias": bool(items[0].get("bias", ", bias " in items[0]["order"])),
                "first_divergence": first}

    rows = divergence[divergence["layer_class"].astype(str).isin(PROBED_CLASSES)] \
        if len(divergence) else divergence
    for precision in ("float32", "float64"):
        for row in rows[rows["precision"] == precision].itertuples() if len(rows) else []:
            a = entry(row.model, row.device_a, row.first_layer)
            b = entry(row.model, row.device_b, row.first_layer)
            if revealed(a) and revealed(b) and a["order"] != b["order"]:
                return pick(row.model, row.first_layer, (row.device_a, row.device_b), True)
    by_layer: dict[tuple[str, str], dict[str, list[str]]] = {}
    for (model, device), orders in found.items():
        for layer, item in orders.items():
            if revealed(item):
                by_layer.setdefault((model, layer), {}).setdefault(item["order"], []).append(
                    device)
    for (model, layer), groups in by_layer.items():
        if len(groups) > 1:
            largest = sorted(groups.values(), key=len, reverse=True)[:2]
            return pick(model, layer, (largest[0][0], largest[1][0]), False)
    return None
