"""Revealing the order a kernel sums in (FPRev's method; the package's docstring says how):
the probe calls, the tree built from the sizes where pairs of terms meet, and the search
over a convolution's output positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from bitdrift.analysis.accumulation.probes import PROBE_VALUES, input_dtype, sampled_grid
from bitdrift.analysis.accumulation.trees import (
    Node,
    OrderError,
    _first_term,
    _post_order,
    _terms,
    to_flat,
)
from bitdrift.record.orders import NOT_SEARCHED, TREE_SYMBOLS, _map_rows


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
        """The record's form (bitdrift.run.orders): ``trees`` flat (to_flat, numbered from
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
