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

import time
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
    """The sums of a probe's output: (batch, units) of a Dense layer; (batch, pixels,
    units) of a Conv2D, every output pixel (row-major), each a sum of its own whose window
    may reach into the padding (see conv_grid); a ``channels_first`` probe's (an ONNX Conv
    node's) output is read channels-last."""
    output = np.asarray(output)
    if spec.get("channels_first"):
        output = np.moveaxis(output, 1, -1)
    if spec["class_name"] == "Conv2D":
        return output.reshape(output.shape[0], -1, output.shape[-1])
    return output


def conv_grid(spec: dict) -> tuple[tuple[int, int], np.ndarray]:
    """A Conv2D probe's output grid (height, width) and which of its sum's terms each
    output pixel holds: (pixels, terms + 1) booleans, row-major, the last column the bias
    (always there); a term is missing where the kernel position falls on the zero padding
    of an input of ones, its product then exactly 0."""
    kh, kw, channels, _ = spec["kernel_shape"]
    in_h, in_w = spec["input_shape"][:2]
    (sh, sw), (dh, dw) = spec["config"].get("strides", [1, 1]), \
        spec["config"].get("dilation_rate", [1, 1])
    if spec["config"].get("padding") == "same":
        out_h, out_w = -(-in_h // sh), -(-in_w // sw)
    else:
        out_h, out_w = (in_h - dh * (kh - 1) - 1) // sh + 1, (in_w - dw * (kw - 1) - 1) // sw + 1
    ones = np.ones((1, in_h, in_w, channels))
    live = conv_patches(ones, spec["config"], spec["kernel_shape"], (1, out_h, out_w)) != 0
    return (out_h, out_w), np.hstack([live, np.ones((len(live), 1), dtype=bool)])


def conv_patches(x: np.ndarray, spec: dict, kernel_shape, out_shape, ys=None,
                 xs=None) -> np.ndarray:
    """A Conv2D's input as the rows of the GEMM it runs: (samples * out_h * out_w,
    kh * kw * cin), term order as ``probe_spec`` says; zero padding as Keras pads.
    ``ys``, ``xs``: only the output pixels on those rows and columns of the grid
    (samples * len(ys) * len(xs) rows), as a sampled replay needs."""
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
    ys = np.arange(out_h) if ys is None else np.asarray(ys)
    xs = np.arange(out_w) if xs is None else np.asarray(xs)
    rows = ys[:, None] * sh + np.arange(kh)[None, :] * dh  # (out_h, kh)
    cols = xs[:, None] * sw + np.arange(kw)[None, :] * dw  # (out_w, kw)
    patches = padded[:, rows[:, None, :, None], cols[None, :, None, :], :]
    return patches.reshape(x.shape[0] * len(ys) * len(xs), kh * kw * channels)


class OrderError(BitdriftError):
    exit_code = 1


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


def to_flat(tree: Node, terms: int | None = None) -> list[list[int]]:
    """How the record keeps a tree: its nodes in post-order, each the list of its
    children, a child being a term's index (0..n-1) or n + the index of an earlier node;
    n is ``terms``, the sum's terms (default: the tree's; a tree found at a pixel by the
    padding holds fewer)."""
    nodes = _post_order(tree)
    offset = tree.size if terms is None else terms
    number = {id(node): offset + index for index, node in enumerate(nodes)}
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
    row of the batch must give the same sums (else an OrderError), unless ``row`` picks
    one; sums that are not such counts (no swamping) are an OrderError."""
    count = terms + (1 if bias else 0)
    found = {}
    for start in range(0, len(pairs), width):
        chunk = pairs[start:start + width]
        outputs = _probe_call(dense, chunk, terms, bias, width, precision)
        if row is None and not np.all(outputs == outputs[0]):
            raise OrderError("the rows of a batch sum in different orders")
        values = outputs[row or 0, :len(chunk)]
        if not _counts(values, count).all():
            raise OrderError(NOT_COUNTS)
        for pair, value in zip(chunk, values, strict=True):
            found[pair] = count - int(value)
    return found


NOT_COUNTS = ("the kernel's sums are not counts of the terms left after a cancellation: it "
              "does not swamp (a wider accumulator, or the terms are not summed as given)")


def _probe_call(dense, chunk: list[tuple[int, int]], terms: int, bias: bool, width: int,
                precision: str, places: int | None = None,
                kept: np.ndarray | None = None) -> np.ndarray:
    """One call of the probe with the pairs of ``chunk`` in its first columns: its outputs
    in units, (places, width), a place being a batch row (Dense) or a batch row and output
    pixel (Conv2D, row-major); ``places``: how many there must be; ``kept``: those
    returned (None: all)."""
    dtype = input_dtype(precision)
    big, unit = PROBE_VALUES[precision]
    weights = np.full((terms, width), unit, dtype=dtype)
    shift = np.full(width, unit if bias else 0, dtype=dtype)
    for column, pair in enumerate(chunk):
        for term, sign in zip(pair, (1, -1), strict=True):
            if term == terms:
                shift[column] = sign * big
            else:
                weights[term, column] = sign * big
    outputs = np.asarray(dense(weights, shift)).reshape(-1, width)
    if places is not None and outputs.shape[0] != places:
        raise OrderError(f"the probe gave {outputs.shape[0]} outputs per probe, not the "
                         f"{places} places of the layer")
    return (outputs if kept is None else outputs[kept]).astype(np.float64) / unit


def _counts(values: np.ndarray, count) -> np.ndarray:
    """Which outputs are counts of the terms left after a cancellation in a sum of
    ``count`` terms (integers from 0 to count - 2)."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & (values == np.round(values)) & (values >= 0) & \
            (values <= np.asarray(count) - 2)


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
    """A compact form of the tree: its height (the most additions on a path from a term up
    to the root: a node adding two terms has height 1, a sequential sum of n terms n - 1),
    the widest node (2: every node adds two operands), and its shape: ``sequential``
    (each node adds one term to the running sum, in index order), ``pairwise`` (balanced
    halves), ``lanes`` (L interleaved partial sums, term k in lane k mod L, then
    combined), ``blocks`` (contiguous blocks summed apart, then combined), else
    ``other``."""
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
    order is revealed; ``reveal_places`` reveals every row and pixel of a layer."""
    if precision not in PROBE_VALUES:
        raise OrderError(f"the order is revealed with inputs in {', '.join(PROBE_VALUES)}, "
                         f"not {precision}")
    search = _search(list(range(terms + (1 if bias else 0))))
    pairs = next(search)
    while True:
        try:
            pairs = search.send(probe_sums(dense, pairs, terms, bias, units, precision, row))
        except StopIteration as done:
            return done.value


def _solve(group: list[int], ceiling: int):
    """FPRev's recursive step as a generator: the subtrees the terms of ``group`` form
    below a node of ``ceiling`` terms. It yields the (pivot, other) pairs whose meeting
    sizes it needs and is sent them as {pair: size}."""
    if len(group) == 1:
        return [group[0]]
    pivot, others = group[0], group[1:]
    sizes = yield [(pivot, other) for other in others]
    current: Node | int = pivot
    for size in sorted({sizes[(pivot, other)] for other in others} - {ceiling}):
        if size > ceiling:
            raise OrderError(f"terms {pivot} and others meet above their node")
        members = [other for other in others if sizes[(pivot, other)] == size]
        children = [current, *(yield from _solve(members, size))]
        node_terms = tuple(sorted(t for child in children for t in _terms(child)))
        if len(node_terms) != size:
            raise OrderError(f"the meeting sizes are not a summation tree: a node of "
                             f"{len(node_terms)} terms said to hold {size}")
        current = Node(size=size, children=children, terms=node_terms)
    rest = [other for other in others if sizes[(pivot, other)] == ceiling]
    return [current, *((yield from _solve(rest, ceiling)) if rest else [])]


def _search(group: list[int]):
    """The tree of the terms ``group`` (sorted; all the sum's terms, or those a pixel at
    the padding holds), as a generator (see _solve): sizes count the terms of ``group``."""
    forest = yield from _solve(group, len(group))
    if len(forest) != 1:
        # every term meets at the root: one node adds them all
        return Node(size=len(group), children=forest,
                    terms=tuple(sorted(t for tree in forest for t in _terms(tree))))
    top = forest[0]
    if not isinstance(top, Node) or top.size != len(group):
        raise OrderError("the revealed terms do not all meet")
    return top


# -- every place of a layer: batch rows, and a Conv2D's output pixels ----------------------
# One call of the probe computes every output, and each may sum in an order of its own:
# MKL blocks a batch's rows, and a convolution's vector loop can start each pixel's
# products at another offset (torch's first Conv2D on AVX-512: four trees, by column mod
# 4). The search runs at a few places; every call's outputs at *all* places then tell
# which found tree each place sums in.
SEED_PLACES = 2  # searched together first: the centre pixel (row 0) and its right neighbour
PLACE_SEARCHES = 6  # searches per layer at most (Dense: at least one per batch row)


UNKNOWN, NOT_SEARCHED = -1, -2  # a place's tree index where none is known


@dataclass
class Places:
    """What reveal_places found: the distinct trees, which tree each place sums in
    (UNKNOWN; NOT_SEARCHED at an output pixel outside the sample), the (row, pixel)
    places searched, why a search failed, if one did, and the grid's rows and columns
    the order was searched at where it was sampled (None: all)."""

    trees: list[Node]
    tree_of: np.ndarray  # (rows, pixels) indices into trees
    grid: tuple[int, int]
    searched: list[tuple[int, int]]
    errors: list[str]
    sampled: tuple[list[int], list[int]] | None = None

    def entry(self, count: int, bias: bool) -> dict:
        """The record's form (bitdrift.run.inference): ``trees`` flat (to_flat, numbered from
        ``count``: a tree found at a pixel by the padding holds fewer terms) and
        ``places``: the grid, the places searched as [row, y, x], and ``maps``, one per
        batch row or one for all rows where they agree: the grid's rows as strings, a
        character per pixel naming its tree (0-9, a-z: index in ``trees``; '.': unknown;
        '-': not searched), and where the search was sampled ``sampled`` {"y", "x"}: the
        grid's rows and columns it looked at."""
        rows = [_map_rows(row, self.grid) for row in self.tree_of]
        maps = rows[:1] if all(row == rows[0] for row in rows) else rows
        width = self.grid[1]
        places = {"grid": list(self.grid), "maps": maps,
                  "searched": [[row, pixel // width, pixel % width]
                               for row, pixel in self.searched]}
        if self.sampled is not None:
            places["sampled"] = {"y": list(self.sampled[0]), "x": list(self.sampled[1])}
        if self.errors:
            places["errors"] = self.errors
        return {"trees": [to_flat(tree, count) for tree in self.trees], "terms": count,
                "bias": bias, "places": places}


TREE_SYMBOLS = "0123456789abcdefghijklmnopqrstuvwxyz"
MAP_SYMBOLS = {UNKNOWN: ".", NOT_SEARCHED: "-"}


def _map_rows(tree_of: np.ndarray, grid) -> list[str]:
    symbols = np.array([*TREE_SYMBOLS, MAP_SYMBOLS[NOT_SEARCHED], MAP_SYMBOLS[UNKNOWN]])
    return ["".join(line) for line in symbols[tree_of].reshape(grid)]


def place_trees(places: dict, rows: int) -> np.ndarray:
    """(rows, pixels) tree indices (UNKNOWN, NOT_SEARCHED) of an entry's ``places``
    (Places.entry) for ``rows`` batch rows."""
    index = {**{symbol: code for code, symbol in MAP_SYMBOLS.items()},
             **{symbol: code for code, symbol in enumerate(TREE_SYMBOLS)}}
    maps = [np.array([index[char] for line in lines for char in line])
            for lines in places["maps"]]
    return np.stack([maps[row % len(maps)] if len(maps) > 1 else maps[0]
                     for row in range(rows)])


def reveal_places(dense, terms: int, units: int, precision: str = "float32",
                  bias: bool = True, batch: int = 1, grid: tuple[int, int] = (1, 1),
                  live: np.ndarray | None = None, searches: int = PLACE_SEARCHES,
                  positions: int | None = None, border: tuple[int, int] = (1, 1)) -> Places:
    """The tree of every place of a layer (a batch row; a Conv2D's batch row and output
    pixel) from ``dense(weights, bias)`` (-> (batch, pixels, units) or (batch, units)).
    ``live``: (pixels, terms + 1) which terms each pixel holds (conv_grid; None: all).
    ``positions``: a grid of more pixels is searched at about this many alone (the
    replay's sample, sampled_grid with the padding's ``border``: corners, edges, a run at
    the centre, the interior), the others NOT_SEARCHED; None: every pixel.

    The search runs first at the seed places (row 0's centre pixel and its right
    neighbour) at once, their probes sharing calls; then, while some place's tree is
    unknown, at the one holding the most terms (nearest the centre), up to ``searches``
    in all (at least ``batch``). A search at a pixel by the padding reveals the tree of
    the terms it holds. After each search every place is compared with every tree found,
    from the answers all probes gave there: a place whose window is whole takes a tree
    when its answers equal the ones that tree gives, which is exact (the search's probes
    depend only on the answers, so equal answers reveal the same tree); a pixel at the
    padding takes the tree whose restriction to its terms agrees with all its answers,
    after probing pairs that tell apart the trees that agree so far. A failed search
    (sums that are no tree there) leaves its place unknown; where no search succeeds,
    the first one's OrderError is raised. Every call computes the whole layer (the
    runtime's kernel is the one of its shape); a sample keeps and compares the answers
    at its pixels alone, so that what the search holds does not grow with the image."""
    if precision not in PROBE_VALUES:
        raise OrderError(f"the order is revealed with inputs in {', '.join(PROBE_VALUES)}, "
                         f"not {precision}")
    count = terms + (1 if bias else 0)
    pixels = grid[0] * grid[1]
    ys, xs = (list(range(grid[0])), list(range(grid[1]))) if positions is None \
        else sampled_grid(grid, positions, border)
    sampled = len(ys) * len(xs) < pixels
    # the pixels searched (row-major); a place is a batch row and one of them
    picked = (np.asarray(ys)[:, None] * grid[1] + np.asarray(xs)[None, :]).reshape(-1)
    kept = len(picked)
    live = np.ones((pixels, count), dtype=bool) if live is None else \
        np.asarray(live, dtype=bool)[:, list(range(terms)) + ([terms] if bias else [])]
    # pixels at one border hold the same terms: one pattern, compared at once
    patterns, pattern_of = np.unique(live[picked], axis=0, return_inverse=True)
    pattern_of = np.tile(pattern_of.reshape(-1), batch)
    seen = _Seen(dense, terms, bias, units, precision, batch * pixels,
                 (np.arange(batch)[:, None] * pixels + picked[None, :]).reshape(-1)
                 if sampled else None)
    at_y, at_x = picked // grid[1], picked % grid[1]
    middle = (grid[0] // 2, grid[1] // 2)
    # the searched pixel nearest the centre (the centre where all are), and the next one
    # (in a sample: the next on its row holding the same terms, not one at the padding)
    centre = int(np.argmin(np.abs(np.asarray(ys) - middle[0]))) * len(xs) + \
        int(np.argmin(np.abs(np.asarray(xs) - middle[1])))
    after = [centre + 1] if len(xs) > 1 and centre + 1 < kept else []
    if sampled:
        after = [place for place in range(centre + 1, centre - centre % len(xs) + len(xs))
                 if pattern_of[place] == pattern_of[centre]][:1]
    todo = [centre, *after][:SEED_PLACES]
    found: list[_Indexed] = []
    searched, errors, failed = [], [], set()
    table: dict = {}
    while True:
        results = seen.search(todo, [np.flatnonzero(patterns[pattern_of[place]]).tolist()
                                     for place in todo])
        for place, tree in zip(todo, results, strict=True):
            searched.append(place)
            if isinstance(tree, OrderError):
                failed.add(place)
                errors.append(f"row {place // kept}, pixel ({at_y[place % kept]}, "
                              f"{at_x[place % kept]}): {tree}")
            elif not any(item.same(tree, table) for item in found):
                found.append(_Indexed(tree, count))
        if not found:
            raise next(tree for tree in results if isinstance(tree, OrderError))
        tree_of, ambiguous = _classify(found, seen, patterns, pattern_of, table)
        if ambiguous:
            seen.ask(_telling_pairs(found, patterns, ambiguous, table))
            tree_of, _ = _classify(found, seen, patterns, pattern_of, table)
        unknown = [place for place in np.flatnonzero(tree_of < 0) if place not in failed]
        if not unknown or len(searched) >= max(searches, min(batch, len(TREE_SYMBOLS))):
            break
        # next: the unknown place holding the most terms, the first row, nearest the centre
        todo = [int(min(unknown, key=lambda place: (
            -patterns[pattern_of[place]].sum(), place // kept,
            abs(at_y[place % kept] - middle[0]) + abs(at_x[place % kept] - middle[1]),
            place)))]
    every = np.full((batch, pixels), NOT_SEARCHED)
    every[:, picked] = tree_of.reshape(batch, kept)
    return Places(trees=[item.tree for item in found], tree_of=every, grid=tuple(grid),
                  searched=[(place // kept, int(picked[place % kept])) for place in searched],
                  errors=errors, sampled=(ys, xs) if sampled else None)


class _Seen:
    """The probe's answers so far: each pair asked, with its output at every place (in
    units). Every call computes all places, so every answer is kept for every place (of
    the sample, where the search is sampled)."""

    def __init__(self, dense, terms: int, bias: bool, width: int, precision: str,
                 places: int, kept: np.ndarray | None = None):
        # only the places kept (the sample's) are converted and held
        self.call = lambda chunk: _probe_call(dense, chunk, terms, bias, width, precision,
                                              places, kept)
        self.width, self.places = width, places
        self.kept = kept  # the places whose answers are kept (None: all)
        self.index: dict[tuple[int, int], int] = {}
        self.values: list[np.ndarray] = []

    def ask(self, pairs) -> None:
        new = [pair for pair in dict.fromkeys(pairs) if pair not in self.index]
        for start in range(0, len(new), self.width):
            chunk = new[start:start + self.width]
            outputs = self.call(chunk)
            for column, pair in enumerate(chunk):
                self.index[pair] = len(self.values)
                self.values.append(outputs[:, column].astype(np.float32))  # counts

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """The pairs asked (k, 2) and their outputs (k, places kept)."""
        pairs = np.array(list(self.index), dtype=np.int64).reshape(-1, 2)
        values = np.array(self.values).reshape(
            len(pairs), self.places if self.kept is None else len(self.kept))
        return pairs, values

    def search(self, places: list[int], groups: list[list[int]]) -> list:
        """The tree at each of ``places`` over its terms ``groups`` (an OrderError where
        the sums there are no tree): the searches run together, each round asking the
        pairs all of them need in shared calls."""
        searches = [_search(group) for group in groups]
        results: list = [None] * len(places)
        pending: dict[int, list] = {}

        def advance(k, sizes):
            try:
                pending[k] = next(searches[k]) if sizes is None else searches[k].send(sizes)
            except StopIteration as done:
                results[k] = done.value
            except OrderError as error:
                results[k] = error

        for k in range(len(places)):
            advance(k, None)
        while pending:
            self.ask([pair for pairs in pending.values() for pair in pairs])
            for k, pairs in list(pending.items()):
                del pending[k]
                values = np.array([self.values[self.index[pair]][places[k]]
                                   for pair in pairs])
                if not _counts(values, len(groups[k])).all():
                    results[k] = OrderError(NOT_COUNTS)
                    continue
                advance(k, {pair: len(groups[k]) - int(value)
                            for pair, value in zip(pairs, values, strict=True)})
        return results


class _Indexed:
    """A found tree as arrays, for comparing places with it: ids 0..count-1 its terms,
    then its inner nodes in post-order (the root last); parents, depths and the table of
    2^k-th ancestors (lowest common ancestors of many pairs at once)."""

    def __init__(self, tree: Node, count: int):
        self.tree, self.count = tree, count
        nodes = _post_order(tree)
        number = {id(node): count + index for index, node in enumerate(nodes)}
        size = count + len(nodes)
        parent = np.arange(size)  # the root, and terms not in the tree: their own
        self.children = []
        for node in nodes:
            kids = np.array([number[id(child)] if isinstance(child, Node) else int(child)
                             for child in node.children])
            self.children.append(kids)
            parent[kids] = number[id(node)]
        self.depth = np.zeros(size, dtype=np.int64)
        for index in range(len(nodes) - 1, -1, -1):  # parents before children
            self.depth[self.children[index]] = self.depth[count + index] + 1
        self.up = [parent]
        while 1 << len(self.up) <= self.depth.max():
            self.up.append(self.up[-1][self.up[-1]])
        self.terms = np.zeros(count, dtype=bool)
        self.terms[list(tree.terms)] = True

    def meet(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The node where terms a[k] and b[k] meet."""
        a, b = np.array(a), np.array(b)
        deeper = self.depth[a] < self.depth[b]
        a[deeper], b[deeper] = b[deeper], a[deeper]
        lift = self.depth[a] - self.depth[b]
        for k, up in enumerate(self.up):
            move = (lift >> k) & 1 == 1
            a[move] = up[a[move]]
        for up in reversed(self.up):
            apart = up[a] != up[b]
            a[apart], b[apart] = up[a[apart]], up[b[apart]]
        return np.where(a == b, a, self.up[0][a])

    def held(self, live: np.ndarray) -> np.ndarray:
        """Per node, how many of the terms ``live`` lie under it."""
        counts = np.zeros(len(self.depth), dtype=np.int64)
        counts[:self.count] = live & self.terms
        for index, kids in enumerate(self.children):
            counts[self.count + index] = counts[kids].sum()
        return counts

    def restricted(self, live: np.ndarray, table: dict) -> int:
        """An id of the tree restricted to the terms ``live`` (nodes left with one child
        replaced by it), equal for equal trees whatever their children's order: inner
        nodes are numbered by ``table``, shared by all trees."""
        ids = np.where(live & self.terms, np.arange(self.count), -1)
        ids = np.concatenate([ids, np.full(len(self.children), -1)])
        for index, kids in enumerate(self.children):
            under = sorted(int(i) for i in ids[kids] if i >= 0)
            ids[self.count + index] = -1 if not under else under[0] if len(under) == 1 \
                else table.setdefault(tuple(under), self.count + len(table))
        return int(ids[-1])

    def same(self, tree: Node, table: dict) -> bool:
        return self.restricted(np.ones(self.count, dtype=bool), table) == \
            _Indexed(tree, self.count).restricted(np.ones(self.count, dtype=bool), table)


def _classify(found: list[_Indexed], seen: _Seen, patterns, pattern_of, table):
    """(tree index per place, -1 unknown; {(pattern, candidates): places} where trees that
    differ on the place's terms all agree with its answers so far)."""
    pairs, values = seen.table()
    agrees = np.zeros((len(found), len(pattern_of)), dtype=bool)
    for index, item in enumerate(found):
        inside = np.flatnonzero(item.terms[pairs[:, 0]] & item.terms[pairs[:, 1]])
        meet = item.meet(pairs[inside, 0], pairs[inside, 1])
        for pattern, live in enumerate(patterns):
            if np.any(live & ~item.terms):  # a term the tree does not place
                continue
            both = live[pairs[inside, 0]] & live[pairs[inside, 1]]
            expected = live.sum() - item.held(live)[meet[both]]
            places = np.flatnonzero(pattern_of == pattern)
            agrees[index, places] = np.all(
                values[np.ix_(inside[both], places)] == expected[:, None], axis=0)
    tree_of = np.full(len(pattern_of), -1)
    ambiguous = {}
    for pattern, live in enumerate(patterns):
        places = np.flatnonzero(pattern_of == pattern)
        combos, which = np.unique(agrees[:, places].T, axis=0, return_inverse=True)
        for number, combo in enumerate(combos):
            candidates = tuple(int(k) for k in np.flatnonzero(combo))
            members = places[which.reshape(-1) == number]
            if len({found[k].restricted(live, table) for k in candidates}) == 1:
                tree_of[members] = candidates[0]
            elif candidates:
                ambiguous[(pattern, candidates)] = members
    return tree_of, ambiguous


def _telling_pairs(found: list[_Indexed], patterns, ambiguous: dict, table,
                   most: int = 200_000) -> list[tuple[int, int]]:
    """For each set of trees a place cannot yet tell apart, a pair of its terms that meet
    under different numbers of them in two of the trees (one per two trees that differ
    there); none where the place holds so many terms that their pairs exceed ``most``."""
    asked = []
    for pattern, candidates in ambiguous:
        live = patterns[pattern]
        terms = np.flatnonzero(live)
        if len(terms) * (len(terms) - 1) // 2 > most:
            continue
        first, second = np.triu_indices(len(terms), 1)
        first, second = terms[first], terms[second]
        kinds = {}
        for k in candidates:
            kinds.setdefault(found[k].restricted(live, table), k)
        held = [found[k].held(live)[found[k].meet(first, second)] for k in kinds.values()]
        for a, b in combinations(range(len(held)), 2):
            differ = np.flatnonzero(held[a] != held[b])
            if len(differ):
                asked.append((int(first[differ[0]]), int(second[differ[0]])))
    return asked


def summary(tree: Node, bias: bool = True) -> str:
    """One phrase for ``explain`` and the tables: the shape of the products' sum and where
    the bias (the tree's last term) enters: ``first`` (the accumulator starts from it, the
    products added to it one by one in order), ``last`` (after all of them), ``inside``
    (elsewhere). The shape, and an ``other`` shape's height, are describe's of the
    products' sum alone, the bias left out: ``other (height H)`` counts the additions on
    the longest path from a product to the sum of all products."""
    products: Node | int | None = tree
    where = ""
    if bias:
        bias_term = max(tree.terms)
        if bias_term in tree.children and len(tree.children) == 2:
            where = ", bias last"
        elif _is_sequential(tree, first=bias_term):
            # the accumulator starts from the bias (XNNPACK's, ONNX Runtime's packed GEMM)
            return "sequential, bias first"
        else:
            where = ", bias inside"
        products = restrict(tree, set(tree.terms) - {bias_term})
    found = describe(_numbered(products)) if isinstance(products, Node) \
        and products.size > 1 else {"shape": "single"}
    name = {"lanes": f"{found.get('lanes')} interleaved lanes",
            "blocks": f"blocks of {found.get('block')}"}.get(found["shape"], found["shape"])
    if found["shape"] == "other":
        name = f"other (height {found['height']})"
    return name + where


def _numbered(tree: Node) -> Node:
    """The tree with its terms renumbered 0..size-1 in their order (describe's shapes
    are of terms 0..n-1; a tree without the bias, or found at a pixel by the padding,
    holds others)."""
    rank = {term: index for index, term in enumerate(tree.terms)}
    if all(rank[term] == term for term in tree.terms):
        return tree
    built: dict[int, Node] = {}
    for node in _post_order(tree):
        kids = [built[id(kid)] if isinstance(kid, Node) else rank[kid]
                for kid in node.children]
        built[id(node)] = Node(size=node.size, children=kids,
                               terms=tuple(rank[term] for term in node.terms))
    return built[id(tree)]


def order_name(trees: list[Node], places: dict | None, bias: bool) -> str:
    """The ``order`` of a layer: one tree's summary; ``by batch row: ...`` where the rows
    differ but each row's pixels agree; else ``varies by position``, with the places
    searched and, per summary, the trees and pixels (or places) that sum so. ``places``
    as Places.entry writes it; None (older records): one tree, or one per batch row.
    Where the search was sampled, all of it speaks of the positions searched, and the
    name ends in SAMPLED_NAME's ``(order searched at N of M positions)``."""
    names = [summary(tree, bias) for tree in trees]
    if places is None:
        return names[0] if len(trees) == 1 else by_rows(names)
    maps = place_trees(places, len(places["maps"]))
    looked = maps != NOT_SEARCHED
    suffix = SAMPLED_NAME.format(searched=int(looked[0].sum()), pixels=maps.shape[1]) \
        if not looked.all() else ""
    uniform = all(np.all(row[seen] == row[seen][0]) for row, seen in zip(maps, looked,
                                                                            strict=True))
    if uniform:
        rows = [names[row[seen][0]] if row[seen][0] >= 0 else "not revealed"
                for row, seen in zip(maps, looked, strict=True)]
        if suffix and set(rows) == {"not revealed"}:  # the readers' label for no order
            return "not revealed"
        return (rows[0] if len(rows) == 1 else by_rows(rows)) + suffix
    unit = "pixels" if len(maps) == 1 else "places"
    searched = ", ".join(f"({y},{x})" for _, y, x in places["searched"])
    grid = "x".join(str(size) for size in places["grid"])
    counts = np.bincount(maps[maps >= 0].reshape(-1), minlength=len(trees))
    parts = []
    for name in dict.fromkeys(names):
        which = [index for index, other in enumerate(names) if other == name]
        cover = "/".join(str(int(counts[index])) for index in which)
        parts.append(f"{name}: {len(which)} trees at {cover} {unit}" if len(which) > 1
                     else f"{name} at {cover} {unit}")
    unknown = int(np.sum(maps == UNKNOWN))
    if unknown:
        parts.append(f"order unknown at {unknown} {unit}")
    return (f"varies by position ({len(trees)} trees; searched at {searched} of {grid}): "
            + "; ".join(parts) + suffix)


# The end of an order's name where the search looked at a sample of a Conv2D's output
# positions (config analysis.replay_positions): what the name says holds there alone.
SAMPLED_NAME = " (order searched at {searched} of {pixels} positions)"


# -- replaying a layer in the revealed order -----------------------------------------------
def replay(tree: Node, inputs: np.ndarray, kernel: np.ndarray, bias_values: np.ndarray | None,
           fma: bool) -> np.ndarray:
    """A float32 Dense layer recomputed by numpy in ``tree``'s order: ``inputs`` (rows, n),
    ``kernel`` (n, units), the bias as term n when given. Without ``fma`` every product is
    rounded to float32 and every addition is float32's. With ``fma`` every node where a
    product meets an accumulator is one fused multiply-add, round(acc + a * b) with one
    rounding (_round_sum): the accumulator is the partial sum below the node, or the
    bias where the sum starts from it (XNNPACK), or, where two products meet, the first
    (by index) rounded alone. A node adding more than two operands, or two partial sums,
    adds them in index order, each addition rounded."""
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
            # (two products) the first one
            fused = products[-1]
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


def sampled_axis(length: int, count: int, border: int) -> list[int]:
    """At most ``count`` indices of an axis of ``length`` (every one where it has no
    more): ``border`` at each end (at least the first and last: a pixel at the padding
    sums fewer terms), half the rest a contiguous run at the centre (every offset of a
    short period), the other half spread evenly over the interior between them."""
    if length <= count:
        return list(range(length))
    border = max(1, min(border, count // 4))
    chosen = set(range(border)) | set(range(length - border, length))
    run = (count - len(chosen) + 1) // 2
    start = min(max(border, length // 2 - run // 2), length - border - run)
    chosen |= set(range(start, start + run))
    interior = [index for index in range(border, length - border) if index not in chosen]
    spread = min(count - len(chosen), len(interior))
    if spread > 0:
        chosen |= {interior[int(k)] for k in
                   np.linspace(0, len(interior) - 1, spread + 2)[1:-1].round()}
    return sorted(chosen)


def sampled_grid(grid: tuple[int, int], positions: int,
                 border: tuple[int, int] = (1, 1)) -> tuple[list[int], list[int]]:
    """(rows, columns) of the output grid replayed: all of a grid of at most
    ``positions`` pixels, else about ``positions`` pixels as rows x columns, each axis
    sampled_axis's: the corners, the edges, a run at the centre and the interior."""
    height, width = grid
    if height * width <= positions:
        return list(range(height)), list(range(width))
    along_y = min(height, max(2, int(np.sqrt(positions))))
    along_x = min(width, max(2, positions // along_y))
    return (sampled_axis(height, along_y, border[0]), sampled_axis(width, along_x, border[1]))


def sampled_samples(samples: int, count: int) -> list[int]:
    """Rows (the samples in the order they ran) replayed: all of at most ``count``, else
    ``count`` spread evenly from the first to the last (other batch rows can sum in
    other orders)."""
    if samples <= count:
        return list(range(samples))
    return sorted({int(k) for k in np.linspace(0, samples - 1, count).round()})


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
    recorded output bit for bit (with or without FMA); values whose place has no known
    tree are left out and counted. ``outputs``: {layer: array (samples, ...)} of the
    record (repeat 0); ``weights``: {"weights/LAYER/0": kernel, ".../1": bias} as the
    device had them. The replay runs at ``replay_samples`` samples and a Conv2D's
    ``replay_positions`` output pixels (sampled_samples, sampled_grid; all where there
    are no more), which the entry's ``replayed`` names where some are left out;
    ``replay=False`` names the orders and replays none. An entry's ``searched_at`` (its
    order taken from that layer's search: bitdrift.run.inference.reveal_orders) is kept; each
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
    kernel = weights.get(f"weights/{layer}/0")
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
    entry.update(_replayed(found, trees, spec, kernel, bias, inbound,
                           output, replay_positions, replay_samples))
    return entry


def _replayed(found, trees, spec, kernel, bias, inbound, output, positions: int,
              samples: int) -> dict:
    """replay_layers' verdict on one layer: ``replay`` and, where the replay sampled,
    ``replayed`` {"rows": samples in run order, and a Conv2D's "y", "x": the grid's rows
    and columns}."""
    rows = sampled_samples(inbound.shape[0], samples)
    units = kernel.shape[-1]
    if spec["class_name"] == "Conv2D":  # the GEMM it runs: a row per output pixel
        height, width = output.shape[1:3]
        ys, xs = sampled_grid((height, width), positions, conv_border(spec, kernel.shape))
        pixels = height * width
        picked = (np.asarray(ys)[:, None] * width + np.asarray(xs)[None, :]).reshape(-1)
        blocks = [([row], conv_patches(inbound[row:row + 1], spec, kernel.shape,
                                       output.shape, ys, xs)) for row in rows]
        recorded_of = lambda block: output[block][:, ys][:, :, xs].reshape(-1, units)  # noqa: E731
        gemm = kernel.reshape(-1, units)
    else:
        pixels, picked, ys, xs = 1, np.zeros(1, dtype=int), [0], [0]
        blocks = [(rows, inbound[rows].reshape(len(rows), -1))]
        recorded_of = lambda block: output[block].reshape(len(block), -1)  # noqa: E731
        gemm = kernel
    which_all = _value_trees(found, len(trees), inbound.shape[0], pixels).reshape(-1, pixels)
    chunk = max(1, REPLAY_CHUNK_BYTES // (gemm.shape[0] * units * 8))
    verdicts, total, size, unsearched = {False: 0, True: 0}, 0, 0, 0
    for block, x in blocks:  # one sample of a Conv2D at a time: its patches, not all
        recorded = recorded_of(block)
        which = which_all[block][:, picked].reshape(-1)
        known = which >= 0
        total += int(recorded[known].size)
        size += int(recorded.size)
        unsearched += int(recorded[which == NOT_SEARCHED].size)
        for fma in (False, True):
            values = np.empty_like(recorded)
            for index, tree in enumerate(trees):
                where = np.flatnonzero(which == index)
                for start in range(0, len(where), chunk):
                    part = where[start:start + chunk]
                    values[part] = replay(tree, x[part], gemm, bias, fma)
            if spec["activation"] == "relu":
                values = np.maximum(values, np.float32(0))
            verdicts[fma] += int(np.sum(values[known].view(np.uint32)
                                        == recorded[known].view(np.uint32)))
    unknown = size - total - unsearched
    left = (f"; {unknown} of {size} values not replayed (order unknown there)"
            if unknown else "") + (
        f"; {unsearched} of {size} values not replayed (order not searched there)"
        if unsearched else "")
    conv = spec["class_name"] == "Conv2D"
    sampled = len(rows) < inbound.shape[0] or len(ys) * len(xs) < pixels
    if sampled:
        left += (f"; replayed at {len(ys) * len(xs)} of {pixels} positions of "
                 f"{len(rows)} of {inbound.shape[0]} samples (analysis.replay_positions, "
                 "analysis.replay_samples)" if conv else f"; replayed at {len(rows)} of "
                 f"{inbound.shape[0]} samples (analysis.replay_samples)")
    if total and (verdicts[True] == total or verdicts[False] == total):
        said = "bit-identical " + ("with FMA" if verdicts[True] == total
                                   else "without FMA") + left
    else:
        best = max(verdicts, key=verdicts.get)
        said = (f"differs: {verdicts[best]} of {total} values bit-identical "
                f"at best ({'with' if best else 'without'} FMA)" + left)
    found_entry = {"replay": said}
    if sampled:
        found_entry["replayed"] = {"rows": rows, "y": ys, "x": xs} if conv else {"rows": rows}
    return found_entry


def _value_trees(found: dict, trees: int, samples: int, pixels: int) -> np.ndarray:
    """(samples * pixels,) the tree each output value summed in (UNKNOWN, NOT_SEARCHED
    outside a sampled search); sample k ran in batch row k mod batch
    (bitdrift.run.inference.batch_indices). Records without ``places`` keep one tree, or one
    per batch row."""
    places = found.get("places")
    if places is None:
        return np.repeat(np.arange(samples) % trees, pixels)
    if int(np.prod(places["grid"])) != pixels:
        raise OrderError(f"the order's grid {places['grid']} is not the layer's "
                         f"{pixels} output pixels")
    return place_trees(places, samples).reshape(-1)


# -- the record's attribute ------------------------------------------------------------------
def checked_orders(found, wrong: Callable[[str], Exception]) -> dict | None:
    """The ``accumulation_orders`` attribute of a record, its structure checked where it
    is read (bitdrift.record.hdf5.Record.accumulation_orders): ``{layer: {"order": text,
    "replay": text, "terms": n, "trees": [[[child, ...], ...]], "bias": bool}}`` (and
    ``replayed`` {rows, y, x} where the replay sampled: _replayed), each tree
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
                                ("error", str, "text"), ("bias", bool, "true or false"),
                                ("searched_at", str, "a layer's name")):
            if key in entry and not isinstance(entry[key], kind):
                raise wrong(f"layer {layer!r}: {key!r} is not {name}")
        replayed = entry.get("replayed", {})
        if not isinstance(replayed, dict) or not all(
                isinstance(replayed.get(key, []), list) and all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 0
                    for n in replayed.get(key, [])) for key in ("rows", "y", "x")):
            raise wrong(f"layer {layer!r}: 'replayed' is not {{rows, y, x: [index, ...]}}")
        terms = entry.get("terms")
        if "terms" in entry and (isinstance(terms, bool) or not isinstance(terms, int)
                                 or terms < 1):
            raise wrong(f"layer {layer!r}: 'terms' is not a count of terms")
        if "trees" not in entry:
            continue
        trees = entry["trees"]
        if "places" in entry:
            _check_places(entry["places"], len(trees) if isinstance(trees, list) else 0,
                          lambda what, layer=layer: wrong(f"layer {layer!r}: 'places' {what}"))
        if "terms" not in entry or "order" not in entry:
            raise wrong(f"layer {layer!r}: 'trees' without 'terms' and 'order'")
        if not isinstance(trees, list) or not trees:
            raise wrong(f"layer {layer!r}: 'trees' is not a list of trees")
        for index, nodes in enumerate(trees):
            if not isinstance(nodes, list) or not all(isinstance(node, list) for node in nodes):
                raise wrong(f"layer {layer!r}: tree {index} is not a list of nodes")
            used: set[int] = set()
            for number, node in enumerate(nodes):
                if len(node) < 2:
                    raise wrong(f"layer {layer!r}: tree {index}, node {number} adds fewer "
                                "than two operands")
                for child in node:
                    if isinstance(child, bool) or not isinstance(child, int) \
                            or not 0 <= child < terms + number:
                        raise wrong(f"layer {layer!r}: tree {index}, node {number}: child "
                                    f"{child!r} is neither a term (0..{terms - 1}) nor an "
                                    "earlier node")
                    if child in used:  # a sum holds each term and partial sum once
                        raise wrong(f"layer {layer!r}: tree {index}, node {number}: child "
                                    f"{child} is added a second time")
                    used.add(child)
            if nodes and set(range(terms, terms + len(nodes) - 1)) - used:
                raise wrong(f"layer {layer!r}: tree {index}: its nodes do not meet in one "
                            "sum")
    return found


def _check_places(places, trees: int, wrong: Callable[[str], Exception]) -> None:
    """An entry's ``places`` (Places.entry): ``grid`` [height, width], ``maps`` (one per
    batch row, or one) of ``height`` strings of ``width`` characters, each a tree's
    symbol below ``trees``, ``.`` or (outside ``sampled``) ``-``, ``searched`` [[row, y,
    x], ...], and where the search was sampled ``sampled`` {"y": rows, "x": columns} of
    the grid, the pixels whose maps hold no ``-``."""
    if not isinstance(places, dict):
        raise wrong(f"is {json_kind(places)}, not an object")
    grid, maps = places.get("grid"), places.get("maps")
    if not (isinstance(grid, list) and len(grid) == 2 and all(
            isinstance(side, int) and not isinstance(side, bool) and side > 0 for side in grid)):
        raise wrong("has no 'grid' [height, width]")
    symbols = set(TREE_SYMBOLS[:trees]) | {MAP_SYMBOLS[UNKNOWN], MAP_SYMBOLS[NOT_SEARCHED]}
    if not isinstance(maps, list) or not maps or not all(
            isinstance(lines, list) and len(lines) == grid[0] and all(
                isinstance(line, str) and len(line) == grid[1] and set(line) <= symbols
                for line in lines) for lines in maps):
        raise wrong(f"'maps' are not {grid[0]} rows of {grid[1]} tree symbols each")
    sampled = places.get("sampled", {"y": list(range(grid[0])), "x": list(range(grid[1]))})
    if not isinstance(sampled, dict) or not all(
            isinstance(sampled.get(axis), list) and sampled[axis] and all(
                isinstance(n, int) and not isinstance(n, bool) and 0 <= n < size
                for n in sampled[axis]) and sampled[axis] == sorted(set(sampled[axis]))
            for axis, size in zip("yx", grid, strict=True)):
        raise wrong(f"'sampled' is not {{y, x: [index, ...]}} of the {grid[0]}x{grid[1]} grid")
    outside = np.ones(grid, dtype=bool)
    outside[np.ix_(sampled["y"], sampled["x"])] = False
    if any(np.any((np.frombuffer("".join(lines).encode(), "S1").reshape(grid)
                   == MAP_SYMBOLS[NOT_SEARCHED].encode()) != outside) for lines in maps):
        raise wrong("'maps' mark as not searched ('-') other pixels than those outside "
                    "'sampled'")
    searched = places.get("searched", [])
    if not isinstance(searched, list) or not all(
            isinstance(place, list) and len(place) == 3 and all(
                isinstance(n, int) and not isinstance(n, bool) for n in place)
            for place in searched):
        raise wrong("'searched' is not a list of [row, y, x]")


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
    kept: dict[int, Node | int | None] = {}
    for node in _post_order(tree):  # no recursion: a sequential sum is n deep
        kids = [kid for kid in (kept[id(child)] if isinstance(child, Node) else
                                child if child in keep else None for child in node.children)
                if kid is not None]
        covered = tuple(sorted(t for kid in kids for t in _terms(kid)))
        kept[id(node)] = None if not kids else kids[0] if len(kids) == 1 else \
            Node(size=len(covered), children=kids, terms=covered)
    return kept[id(tree)]


def contrasting_pair(divergence, records, model: str | None = None) -> dict | None:
    """The two devices whose orders the figure draws: a class pair whose first divergent
    layer is a Dense or Conv2D layer with both orders revealed and different (float32
    first), else the two largest groups of devices by order at the first layer where revealed
    orders differ (``first_divergence`` False); None where no two orders differ.
    Returns {"model", "layer", "devices": [a, b], "orders": [...], "trees": [Node, Node],
    "bias": bool, "first_divergence": bool}. With ``model``, that model's pair only."""
    found = {(record.model, record.device): record.accumulation_orders or {}
             for record in records if model is None or record.model == model}
    if model is not None and len(divergence):
        divergence = divergence[divergence["model"] == model]

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
