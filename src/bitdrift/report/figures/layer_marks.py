"""The layer kinds marked along a figure's layer axis: what the figures of remaining
precision (bitdrift.report.figures.remaining_precision) and the studies' per-layer figures
share."""

from __future__ import annotations

import pandas as pd

from bitdrift.inputs.models import layer_kind


def mark_layer_kinds(ax, layers: pd.DataFrame) -> None:
    """Activation layers: red upward arrows; pooling layers: blue downward arrows, at the
    foot of the panel (the paper's Figures SUP-4..7 put them on the x-axis)."""
    coordinates = ("data", "axes fraction")
    for position, layer_class in zip(layers["position"], layers["layer_class"].fillna(""),
                                     strict=True):
        kind = layer_kind(layer_class)
        if kind in ("activation", "pooling"):
            low, high = (0.0, 0.09) if kind == "activation" else (0.09, 0.0)
            ax.annotate("", (position, high), (position, low), xycoords=coordinates,
                        textcoords=coordinates,
                        arrowprops={"arrowstyle": "-|>", "lw": 1.5,
                                    "color": "red" if kind == "activation" else "blue"})
    # The arrows sit in a grey strip below 0 (the axis leaves room for them); no tick
    # there: precision and counts are never negative
    bottom, top = ax.get_ylim()
    if bottom < 0:
        ax.axhspan(bottom, 0, color="0.94", zorder=0, lw=0)
        ax.set_yticks([tick for tick in ax.get_yticks() if 0 <= tick <= top])
        ax.set_ylim(bottom, top)
