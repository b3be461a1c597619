"""Where devices part ways: per layer, the share of device pairs apart."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from bitdrift.atomic import save_figure
from bitdrift.inputs.models import layer_kind
from bitdrift.report.figures.layer_marks import layer_key_text, layer_labels
from bitdrift.report.figures.samples import identical_samples, line_width, samples_label

KIND_STYLE = {"convolution": ("s", "tab:green"), "activation": ("^", "tab:red"),
              "pooling": ("v", "tab:blue"), "dense": ("D", "tab:purple")}
# The layer kinds sit in a strip under 0, off the lines
KIND_ROW = -0.07
SAMPLE_COLOURS = ["black", "tab:orange", "tab:cyan", "tab:pink", "tab:olive", "tab:brown"]


def _panel_note(part: pd.DataFrame, first_label: str) -> str:
    """Why a panel is flat, or why it starts high: the reader cannot see it. The first
    layer is named as on the axis (``first_label``)."""
    first = part[part["position"] == part["position"].min()]
    if part["layer"].nunique() == 1:  # the final output alone: no layer to part at
        return (f"{part['share_apart'].max():.0%} of pairs differ at the final output; no "
                "layers are recorded by two of these devices, so where they part is not "
                "known (divergence.csv: no layers recorded)")
    if first["share_apart"].max() > 0:
        return (f"{first['share_apart'].max():.0%} of pairs already differ at the first "
                f"layer ({first_label}): the same input gives other bits, so "
                "the layer's own arithmetic differs (kernel, summation order or format)")
    return ""


# Where a panel's note may go, in axes fractions: the anchor (x, y, ha, va) and the part
# of the panel it covers (x from, x to, share from, share to), tried in this order
NOTE_PLACES = [((0.02, 0.97, "left", "top"), (0.0, 0.55, 0.55, 1.05)),
               ((0.98, 0.13, "right", "bottom"), (0.45, 1.0, 0.0, 0.5)),
               ((0.02, 0.13, "left", "bottom"), (0.0, 0.55, 0.0, 0.5)),
               ((0.02, 0.5, "left", "center"), (0.0, 0.55, 0.25, 0.75)),
               ((0.98, 0.97, "right", "top"), (0.45, 1.0, 0.55, 1.05))]


def _free_corner(part: pd.DataFrame) -> tuple:
    """Where a note covers the fewest points of the panel's lines (the first such place
    in NOTE_PLACES)."""
    positions = part["position"]
    span = max(positions.max() - positions.min(), 1)
    x = pd.concat([(positions - positions.min()) / span] * 2).to_numpy()
    y = pd.concat([part["share_apart"], part["share_apart_so_far"]]).to_numpy()
    covered = [int(((x >= x0) & (x <= x1) & (y >= y0) & (y <= y1)).sum())
               for _, (x0, x1, y0, y1) in NOTE_PLACES]
    return NOTE_PLACES[covered.index(min(covered))][0]


def plot_divergence(apart: pd.DataFrame, layer_classes: pd.DataFrame, out: str | Path):
    """Per layer position, the share of device pairs already apart (at that layer or any
    before: a pale band) and apart at the layer (a line), one panel per model and declared
    precision (pairs of two precisions differ everywhere by construction and are only
    counted); samples whose shares are equal at every layer are one line, named together;
    the layer kinds marked under the lines; long layer names numbered, with a key. A panel,
    or the figure, with nothing to show says so in its title. Returns the figure (saved
    and closed)."""
    panels = [(key, part) for key, part in apart.groupby(["model", "precision"], sort=False)
              if part["n_pairs"].max() > 0]
    kinds = (layer_classes.drop_duplicates(["model", "layer"])
             .set_index(["model", "layer"])["layer_class"].fillna("")
             if len(layer_classes) else pd.Series(dtype=object))
    # A panel's width follows its layers, so a model of 36 layers is not squeezed beside
    # one of a single recorded output
    widths = [max(part["position"].nunique(), 6) for _, part in panels] or [1]
    inches = [0.9 + 0.2 * width for width in widths]
    scale = min(1.0, 15.0 / sum(inches))
    figure, axes = plt.subplots(
        1, len(widths), figsize=(max(sum(inches) * scale + 1.0, 7.0), 6.4), squeeze=False,
        sharey=True, width_ratios=widths, layout="constrained")
    keys, agreeing = [], 0
    for ax, ((model, precision), part), panel_inches in zip(axes[0], panels, inches,
                                                          strict=False):
        layers = part.drop_duplicates("position").sort_values("position")
        labels, key = layer_labels(layers["layer"])
        if key:
            keys.append(f"{model}: " + layer_key_text(key, 170))
        groups = identical_samples(part, ["share_apart", "share_apart_so_far"])
        n_samples = part["sample"].nunique()
        alone = part["layer"].nunique() == 1
        for k, group in enumerate(groups):
            rows = part[part["sample"] == group[0]].sort_values("position")
            colour = SAMPLE_COLOURS[k % len(SAMPLE_COLOURS)]
            # apart so far: a pale band, apart at the layer: a line, so the line shows
            # inside the band where the two are equal
            ax.plot(rows["position"], rows["share_apart_so_far"], color=colour, lw=8,
                    alpha=0.22, solid_capstyle="butt", marker="o" if alone else None,
                    ms=16)
            ax.plot(rows["position"], rows["share_apart"], color=colour,
                    lw=line_width(k) - 0.8, marker="o", ms=max(6 - 1.5 * k, 3),
                    label=samples_label(group, n_samples))
        for position, layer in zip(layers["position"], layers["layer"], strict=True):
            kind = layer_kind(kinds.get((model, layer), ""))
            if kind:
                marker, color = KIND_STYLE[kind]
                ax.plot(position, KIND_ROW, marker=marker, color=color, ms=6, ls="none")
        ax.axhspan(-0.12, -0.02, color="0.94", zorder=0, lw=0)
        ax.set_xticks(layers["position"], labels, rotation=90, fontsize=8)
        if alone:  # one point: room either side, so it does not sit on the frame
            position = layers["position"].iloc[0]
            ax.set_xlim(position - 1, position + 1)
        ax.set_ylim(-0.12, 1.03)
        ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        ax.tick_params(axis="y", labelsize=9)
        ax.grid(axis="y", color="0.9", lw=0.6)
        label = f", {precision}" if precision else ""
        pairs = int(part["n_pairs"].max())
        # devices that record the final output alone (a compiled graph) have no layers
        # to part at: the pairs are those of the devices that record them, as in the
        # findings' first divergent layers
        left_out = " ".join(part["left_out_devices"].fillna("").astype(str).replace(
            "nan", "").iloc[:1]).split() if "left_out_devices" in part else []
        flat = part["share_apart_so_far"].max() == 0
        agreeing += flat
        heading = [f"{model}{label}: {pairs} device pair{'' if pairs == 1 else 's'}",
                   *([samples_label(groups[0], n_samples)] if len(groups) == 1
                     and n_samples > 1 else [])]
        if flat:
            heading.append(f"nothing parts: all {pairs} pairs identical at every layer")
        if left_out:
            heading += textwrap.wrap(f"{len(left_out)} recording the final output alone "
                                     f"left out: {', '.join(left_out)}", 55)
        ax.set_title("\n".join(heading), fontsize=10, loc="left")
        if len(groups) > 1:  # beside the panel: inside, it covered lines
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                      frameon=False, handlelength=1.6)
        note = _panel_note(part, labels[0])
        if note:
            x, y, ha, va = _free_corner(part)
            ax.text(x, y, textwrap.fill(note, max(int(11 * panel_inches), 26)),
                    transform=ax.transAxes, ha=ha, va=va, fontsize=8,
                    bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9})
    axes[0][0].set_ylabel("share of device pairs apart", fontsize=10)
    title = "Where devices part ways: per layer, the share of device pairs of one precision " \
            "whose outputs differ"
    if not panels:
        title = ("Where devices part ways: nothing to show, no two devices share a "
                 "precision")
    elif agreeing == len(panels):
        title += ":\nnothing to show, every pair agrees bit for bit at every layer"
    cross = apart.drop_duplicates(["model", "sample"])
    if len(cross) and cross["cross_format_pairs"].max() > 0:
        total = (cross["cross_format_pairs"] + apart.drop_duplicates(
            ["model", "sample", "precision"]).groupby(["model", "sample"])["n_pairs"].sum()
            .reindex(pd.MultiIndex.from_frame(cross[["model", "sample"]])).to_numpy())
        title += (f"\n{int(cross['cross_format_pairs'].max())} of {int(total.max())} pairs "
                  "mix two precisions and are not compared")
    if panels:  # the line styles and layer kinds, once for every panel, under the title
        handles = [plt.Line2D([], [], color="0.3", lw=1.6, marker="o", ms=4,
                              label="apart at the layer"),
                   plt.Line2D([], [], color="0.3", lw=8, alpha=0.22,
                              label="apart at it or any layer before")]
        handles += [plt.Line2D([], [], marker=marker, color=color, ls="none", label=kind)
                    for kind, (marker, color) in KIND_STYLE.items()]
        # the title is the legend's: a suptitle and a legend above the panels overlap
        figure.legend(handles=handles, loc="outside upper center", ncol=len(handles),
                      fontsize=9, frameon=False, title=title, title_fontsize=11)
    else:
        axes[0][0].set_axis_off()
        figure.suptitle(title, fontsize=11)
    if keys:  # constrained layout keeps room for a figure's x label
        figure.supxlabel("\n".join(keys), fontsize=8, x=0.01, ha="left",
                         multialignment="left")
    save_figure(figure, out, bbox_inches="tight")
    return figure
