"""A sum's order as a tree of additions: its nodes, its flat form in a record, and the
tree restricted to some terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bitdrift.errors import BitdriftError


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


def _terms(child) -> tuple:
    return child.terms if isinstance(child, Node) else (child,)


def _first_term(nodes):
    return lambda item: min(_terms(nodes[item]))


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
