"""The record's ``accumulation_orders`` attribute (docs/record-format.md): its structure
checked where it is read, and the symbols of its maps of output positions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bitdrift.errors import json_kind

UNKNOWN, NOT_SEARCHED = -1, -2  # a place's tree index where none is known


# Where two products meet at a node of a sum, a kernel with FMA rounds one alone and fuses
# the other onto it, and the tree cannot say which: an entry's ``fused_product`` (the one
# of the higher term index fused, the lower's, or ``either`` where the replay's values do
# not tell them apart).
HIGHER_FUSED, LOWER_FUSED, EITHER_FUSED = "higher index", "lower index", "either"
FUSED_PRODUCTS = (HIGHER_FUSED, LOWER_FUSED, EITHER_FUSED)

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


# -- the record's attribute ------------------------------------------------------------------
def checked_orders(found, wrong: Callable[[str], Exception]) -> dict | None:
    """The ``accumulation_orders`` attribute of a record, its structure checked where it
    is read (bitdrift.record.reader.Record.accumulation_orders): ``{layer: {"order": text,
    "replay": text, "terms": n, "trees": [[[child, ...], ...]], "bias": bool}}`` (and
    ``replayed`` {rows, y, x} where the replay sampled: _replayed; ``fused_product``, one
    of FUSED_PRODUCTS, where it replayed with FMA and two products meet), each tree
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
        if entry.get("fused_product", HIGHER_FUSED) not in FUSED_PRODUCTS:
            raise wrong(f"layer {layer!r}: 'fused_product' is not one of "
                        + ", ".join(repr(word) for word in FUSED_PRODUCTS))
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
