"""The summation trees of two devices at one Dense or Conv2D layer, side by side
(bitdrift.analysis.accumulation)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt

from bitdrift.atomic import save_figure

# The terms of a long sum the order figure draws: the first products and the bias
ORDER_TERMS_SHOWN = 40


def _tree_layout(tree, bias_term: int | None):
    """Leaf x positions (left to right as the tree adds them), and the segments of an
    elbow drawing: each node at height 1 + its highest child's."""
    from bitdrift.analysis.accumulation.trees import Node

    segments, leaves = [], []

    def place(node):
        if not isinstance(node, Node):
            leaves.append(node)
            return float(len(leaves) - 1), 0
        placed = [place(child) for child in sorted(
            node.children, key=lambda c: min(c.terms) if isinstance(c, Node) else c)]
        height = 1 + max(h for _, h in placed)
        xs = [x for x, _ in placed]
        for x, h in placed:
            segments.append(((x, x), (h, height)))
        segments.append(((min(xs), max(xs)), (height, height)))
        return sum(xs) / len(xs), height

    place(tree)
    return leaves, segments


def plot_orders(pairs, out: str | Path) -> None:
    """The summation trees of two devices at one Dense or Conv2D layer
    (bitdrift.analysis.accumulation),
    drawn over the first products and the bias, side by side; one row per model where
    ``pairs`` is a list of (model, pair or None), one pair (or None) otherwise."""
    if not isinstance(pairs, list):
        pairs = [(pairs["model"] if pairs else "", pairs)]
    drawn = [(model, pair) for model, pair in pairs if pair is not None]
    missing = [model for model, pair in pairs if pair is None and model]
    if not drawn:
        figure, ax = plt.subplots(figsize=(9, 2.2))
        ax.text(0.5, 0.5, "No two devices sum a layer in different revealed orders in "
                "these records\n(each device's orders and the reasons where one is not revealed "
                "are in accumulation_orders.csv)",
                ha="center", va="center", fontsize=10)
        ax.set_axis_off()
        save_figure(figure, out)
        return
    figure, axes = plt.subplots(len(drawn), 2, figsize=(13, 0.6 + 4.8 * len(drawn)),
                                squeeze=False)
    for row, (_, pair) in zip(axes, drawn, strict=True):
        _draw_pair(row, pair)
    title = ("How two devices add up one output of a layer, per model: where a class pair "
             "first parts (or the layer's commonest two orders)")
    if len(pairs) == 1:
        pair = drawn[0][1]
        why = "where this class pair first parts" if pair["first_divergence"] else \
            "(the devices' classes part elsewhere; these two orders are the layer's commonest)"
        title = (f"How two devices add up one output of {pair['model']}'s layer "
                 f"{pair['layer']}, {why}")
    if missing:
        title += (f"\nNo two revealed orders differ for {', '.join(missing)} "
                  "(accumulation_orders.csv)")
    figure.suptitle(title, fontsize=11)
    figure.text(0.5, 0.005, "Each joint adds the terms below it; revealed through each "
                "device's own runtime at the layer's shapes (FPRev's method). Other orders "
                "round differently, so the two outputs' last bits differ.", ha="center",
                fontsize=8.5, color="0.3")
    figure.tight_layout(rect=(0, 0.03, 1, 0.95 if len(drawn) == 1 else 0.97))
    save_figure(figure, out)


def _draw_pair(axes, pair: dict) -> None:
    """One pair's two summation trees, on two axes."""
    from bitdrift.analysis.accumulation.trees import restrict

    for ax, device, order, tree in zip(axes, pair["devices"], pair["orders"], pair["trees"],
                                       strict=True):
        total = tree.size
        products = total - 1 if pair["bias"] else total
        bias_term = products if pair["bias"] else None
        keep = set(range(min(ORDER_TERMS_SHOWN, products)))
        if bias_term is not None:
            keep.add(bias_term)
        shown = restrict(tree, keep)
        leaves, segments = _tree_layout(shown, bias_term)
        for xs, ys in segments:
            ax.plot(xs, ys, color="0.25", linewidth=0.9)
        ax.set_xticks(range(len(leaves)))
        ax.set_xticklabels(["bias" if leaf == bias_term else str(leaf) for leaf in leaves],
                           rotation=90, fontsize=6.5)
        for label, leaf in zip(ax.get_xticklabels(), leaves, strict=True):
            if leaf == bias_term:
                label.set_color("tab:red")
                label.set_fontweight("bold")
        ax.set_xlabel(f"term (product x[i]*w[i]; first {len(keep) - (bias_term is not None)}"
                      f" of {products}{' and the bias' if bias_term is not None else ''})")
        ax.set_ylabel("addition step (among the terms drawn)")
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        where = "first parts here" if pair["first_divergence"] else "commonest orders"
        ax.set_title(f"{pair['model']}/{pair['layer']} ({where}): {device}\n"
                     f"{textwrap.fill(order, 60)}", fontsize=10)
        ax.spines[["top", "right"]].set_visible(False)
