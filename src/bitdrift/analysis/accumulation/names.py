"""Names of revealed orders in words: sequential, pairwise, blocks, where the bias enters,
and the orders of a layer's rows or positions.
"""

from __future__ import annotations

import numpy as np

from bitdrift.analysis.accumulation.trees import Node, _post_order, _terms, restrict
from bitdrift.record.orders import NOT_SEARCHED, UNKNOWN, place_trees


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
        # Of the lane counts (block sizes) whose partial sums are all nodes, the first
        # whose partial sums each add their terms in index order (blocks: and are then
        # added in order): lanes of lanes are one set of finer lanes (2 lanes of 2 lanes
        # each are 4 lanes, combined in pairs), and blocks of 8 summed pairwise hold
        # pairs, which are no blocks the sum is made of
        by_terms = {node.terms: node for node in order}
        lanes = _first_regular([count for count in range(2, n // 2 + 1)
                                if all(tuple(range(k, n, count)) in nodes
                                       for k in range(count))],
                               lambda count: [tuple(range(k, n, count))
                                              for k in range(count)], by_terms)
        block = _first_regular([size for size in range(2, n // 2 + 1)
                                if all(tuple(range(first, min(first + size, n))) in nodes
                                       for first in range(0, n, size))],
                               lambda size: [tuple(range(first, min(first + size, n)))
                                             for first in range(0, n, size)], by_terms,
                               lambda size: [tuple(range(0, min(end, n)))
                                             for end in range(2 * size, n + size, size)])
        if lanes:
            result.update(shape="lanes", lanes=lanes)
        elif block:
            result.update(shape="blocks", block=block, blocks=-(-n // block))
    return result


def _first_regular(candidates: list[int], parts, by_terms: dict,
                   joined=None) -> int | None:
    """Of ``candidates``, the first whose parts (``parts(candidate)``: tuples of terms, each
    a node of the tree or a term alone) each sum in index order, at least one of three or
    more terms (a pair is any order's), and whose ``joined(candidate)`` (the running sums
    of the parts, where the parts join in order) are all nodes; else the first of those
    whose parts are so joined; else the first."""
    def sequential_parts(candidate):
        found = parts(candidate)
        return any(len(terms) > 2 for terms in found) and all(
            len(terms) < 3 or _is_sequential(by_terms[terms]) for terms in found)

    def in_order(candidate):
        return joined is None or all(terms in by_terms for terms in joined(candidate))

    return next((c for c in candidates if sequential_parts(c) and in_order(c)),
                next((c for c in candidates if in_order(c)),
                     candidates[0] if candidates else None))


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
    return (shape_name(_numbered(products)) if isinstance(products, Node)
            and products.size > 1 else "single") + where


def shape_name(tree: Node) -> str:
    """The name of a sum of terms 0..n-1 (describe's shape): ``sequential``, ``pairwise``,
    ``other (height H)``; lanes and blocks with how each lane or block sums where that is
    not in index order: ``blocks of 16`` (each block sequential), ``blocks of 160, each
    other (height 79)`` (each block 79 additions deep: a tree 80 deep is no sequential sum
    of blocks of 160, which would be 160 deep), ``4 interleaved lanes, each pairwise``,
    ``blocks of 8, of mixed orders (height 5)`` (the blocks sum in different shapes; the
    tallest block's height). What a part is called is this name again, so a name reads
    from the outside in."""
    found = describe(tree)
    shape = found["shape"]
    if shape == "other":
        return f"other (height {found['height']})"
    if shape not in ("lanes", "blocks"):
        return shape
    name = (f"{found['lanes']} interleaved lanes" if shape == "lanes"
            else f"blocks of {found['block']}")
    # A part of one or two terms (a last, shorter block) sums in any order's way: the
    # name is that of the others
    parts = [part for part in _parts(tree, found)
             if isinstance(part, Node) and part.size > 2]
    names = [shape_name(_numbered(part)) for part in parts]
    if all(part_name == "sequential" for part_name in names):
        return name
    if len(set(names)) == 1:
        return f"{name}, each {names[0]}"
    height = max(describe(_numbered(part))["height"] for part in parts)
    return f"{name}, of mixed orders (height {height})"


def _parts(tree: Node, found: dict) -> list:
    """The lanes' or blocks' subtrees describe found (each a Node, or a term alone)."""
    n = tree.size
    if found["shape"] == "lanes":
        wanted = [tuple(range(k, n, found["lanes"])) for k in range(found["lanes"])]
    else:
        wanted = [tuple(range(first, min(first + found["block"], n)))
                  for first in range(0, n, found["block"])]
    nodes = {node.terms: node for node in _post_order(tree)}
    return [nodes.get(terms, terms[0]) for terms in wanted]


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
