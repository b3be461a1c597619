"""Where devices part ways: per layer, the share of device pairs apart."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from bitdrift.atomic import save_figure
from bitdrift.inputs.models import layer_kind

KIND_STYLE = {"convolution": ("s", "tab:green"), "activation": ("^", "tab:red"),
              "pooling": ("v", "tab:blue"), "dense": ("D", "tab:purple")}


def plot_divergence(apart: pd.DataFrame, layer_classes: pd.DataFrame, out: str | Path):
    """Per layer position, the share of device pairs already apart (at that layer or any
    before: dashed) and apart at the layer (solid), one panel per model and declared
    precision (pairs of two precisions differ everywhere by construction and are only
    counted); layer classes marked on each point. Returns the figure (saved and closed)."""
    panels = [key for key, part in apart.groupby(["model", "precision"], sort=False)
              if part["n_pairs"].max() > 0]
    columns = max(len(panels), 1)
    figure, axes = plt.subplots(1, columns, figsize=(min(5.0 * columns, 16), 5.4),
                                squeeze=False)
    kinds = (layer_classes.drop_duplicates(["model", "layer"])
             .set_index(["model", "layer"])["layer_class"].fillna("")
             if len(layer_classes) else pd.Series(dtype=object))
    for ax, (model, precision) in zip(axes[0], panels, strict=False):
        part = apart[(apart["model"] == model) & (apart["precision"] == precision)]
        for sample, rows in part.groupby("sample"):
            rows = rows.sort_values("position")
            line, = ax.plot(rows["position"], rows["share_apart"], lw=1,
                            label=f"sample {sample}: apart at the layer")
            ax.plot(rows["position"], rows["share_apart_so_far"], lw=1, ls="--",
                    color=line.get_color(), label=f"sample {sample}: apart so far")
            for _, row in rows.iterrows():
                kind = layer_kind(kinds.get((model, row["layer"]), ""))
                if kind:
                    marker, color = KIND_STYLE[kind]
                    ax.plot(row["position"], row["share_apart"], marker=marker, color=color,
                            ms=5, ls="none")
        for kind, (marker, color) in KIND_STYLE.items():
            ax.plot([], [], marker=marker, color=color, ls="none", label=kind)
        layers = part.drop_duplicates("position").sort_values("position")
        ax.set_xticks(layers["position"], layers["layer"], rotation=90, fontsize=6)
        ax.set_ylim(-0.03, 1.03)
        ax.set_ylabel("share of device pairs in different classes")
        label = f", {precision}" if precision else ""
        pairs = int(part["n_pairs"].max())
        # devices that record the final output alone (a compiled graph) have no layers
        # to part at: the pairs are those of the devices that record them, as in the
        # findings' first divergent layers
        left_out = " ".join(part["left_out_devices"].fillna("").astype(str).replace(
            "nan", "").iloc[:1]).split() if "left_out_devices" in part else []
        ax.set_title(f"{model}{label}: {pairs} device pairs" + ("\n" + textwrap.fill(
            f"{len(left_out)} recording the final output alone left out: "
            f"{', '.join(left_out)}", 60) if left_out else ""), fontsize=9)
        # Say why a panel is flat, or why it starts high: the reader cannot see it
        first = part[part["position"] == part["position"].min()]
        if part["share_apart_so_far"].max() == 0:
            ax.text(0.5, 0.5, textwrap.fill(f"all {pairs} pairs of {precision or 'these'} "
                                            "devices agree bit for bit at every layer", 30),
                    transform=ax.transAxes, ha="center", va="center", fontsize=8)
        elif part["layer"].nunique() == 1:  # the final output alone: no layer to part at
            ax.text(0.02, 0.02, textwrap.fill(
                f"{part['share_apart'].max():.0%} of pairs differ at the final output; no "
                "layers are recorded by two of these devices, so where they part is not "
                "known (divergence.csv: no layers recorded)", 40),
                transform=ax.transAxes, ha="left", va="bottom", fontsize=7)
        elif first["share_apart"].max() > 0:
            ax.text(0.02, 0.02, textwrap.fill(
                f"{first['share_apart'].max():.0%} of pairs already differ at the first "
                f"layer ({first['layer'].iloc[0]}): the same input gives other bits, so "
                "the layer's own arithmetic differs (kernel, summation order or format)", 40),
                transform=ax.transAxes, ha="left", va="bottom", fontsize=7)
    if panels:  # one legend for all panels, below them: none covers a line
        handles, names = axes[0][0].get_legend_handles_labels()
        figure.legend(handles, names, loc="lower center", ncol=min(len(names), 5),
                      fontsize=7, frameon=False)
    if not panels:
        axes[0][0].text(0.5, 0.5, "no two devices share a precision: nothing to compare",
                        ha="center", va="center")
        axes[0][0].set_axis_off()
    title = textwrap.fill(
        "Where devices part ways: per layer, the share of device pairs of one precision whose "
        "outputs differ (solid: at that layer; dashed: at it or any layer before)", 160)
    cross = apart.drop_duplicates(["model", "sample"])
    if len(cross) and cross["cross_format_pairs"].max() > 0:
        total = (cross["cross_format_pairs"] + apart.drop_duplicates(
            ["model", "sample", "precision"]).groupby(["model", "sample"])["n_pairs"].sum()
            .reindex(pd.MultiIndex.from_frame(cross[["model", "sample"]])).to_numpy())
        title += (f"\n{int(cross['cross_format_pairs'].max())} of {int(total.max())} pairs "
                  "mix two precisions and are not compared")
    figure.suptitle(title, fontsize=9)
    figure.tight_layout(rect=(0, 0.14, 1, 1))
    save_figure(figure, out)
    return figure
