"""Remaining precision and the number of equivalence classes per layer (Figure SUP-4)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bitdrift.analysis.remaining_precision import MANTISSA_BITS
from bitdrift.atomic import save_figure
from bitdrift.report.figures.layer_marks import layer_key_text, layer_labels, mark_layer_kinds
from bitdrift.report.figures.samples import identical_samples, line_width, samples_label

# A sample keeps its colour and marker in every panel; lines that coincide show as nested
# lines of stacked markers (the first sample's widest)
SAMPLE_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def _sample_style(k: int) -> dict:
    return {"color": plt.get_cmap("tab10").colors[k % 10],
            "marker": SAMPLE_MARKERS[k % len(SAMPLE_MARKERS)], "lw": line_width(k) - 0.8,
            "ms": max(8 - 1.5 * k, 3.5)}


def _identical(part: pd.DataFrame, column: str, n_samples: int) -> str:
    """Which samples a panel's lines hide behind each other: equal at every layer."""
    said = [samples_label(group, n_samples).replace(" (identical)", "")
            for group in identical_samples(part, [column]) if len(group) > 1]
    return ("identical: " + "; ".join(said)) if said else ""


def plot_remaining_precision(table: pd.DataFrame, out: str | Path):
    """Per model: RP and number of EQCs per layer, one line per sample (samples equal at
    every layer named so); activation layers marked by red upward arrows and pooling
    layers by blue downward arrows (Figure SUP-4); the legend beside the panels, long layer
    names numbered with a key. A model whose devices share no layer but the output is
    drawn per sample, and says so; a figure with nothing to show says so in its title.
    Returns the figure (saved and closed)."""
    models = list(dict.fromkeys(table["model"]))
    singles = {model: table[table["model"] == model]["position"].nunique() <= 1
               for model in models}
    widths = [6.0 if singles[model] else max(table[table["model"] == model]["position"]
                                             .nunique(), 8) for model in models] or [1]
    inches = [1.0 + 0.2 * width for width in widths]
    scale = min(1.0, 13.0 / sum(inches))
    figure, axes = plt.subplots(
        2, len(widths), figsize=(max(sum(inches) * scale + 2.6 * len(widths), 8.0), 8.0),
        squeeze=False, width_ratios=widths, height_ratios=[3, 2], layout="constrained")
    keys = []
    for k, model in enumerate(models):
        part = table[table["model"] == model]
        top, bottom = axes[0, k], axes[1, k]
        bottom.sharex(top)
        single = singles[model]
        samples = list(dict.fromkeys(part["sample"]))
        # One layer (the output alone): the samples are the x-axis, so each is a point
        # of its own instead of all on one spot
        x_of = ({sample: i for i, sample in enumerate(samples)} if single else None)
        dotted = False
        # Devices the effective-precision check flags (a bfloat16-like one among float32
        # devices) bound the line; dashed: the other devices alone
        reduced = sorted({device for cell in part.get("reduced_precision_devices",
                                                      pd.Series(dtype=object)).dropna()
                          for device in str(cell).split(";") if device})
        without = pd.to_numeric(part.get("remaining_precision_without_reduced",
                                         pd.Series(np.nan, index=part.index)), errors="coerce")
        for j, sample in enumerate(samples):
            rows = part[part["sample"] == sample].sort_values("position")
            style = _sample_style(j)
            x = (pd.Series([x_of[sample]] * len(rows), index=rows.index) if single
                 else rows["position"])
            top.plot(x, rows["remaining_precision"], **style, label=f"sample #{sample}")
            # measured at the layers the check covers (Dense, Conv2D) and the output: a
            # point each, joined
            apart = without.loc[rows.index]
            known = apart.notna().to_numpy()
            if known.any():
                top.plot(x[known], apart[known], ls="--", lw=1, marker="x", ms=6,
                         color=style["color"])
            significant = pd.to_numeric(rows.get("significant_bits_mean",
                                                 pd.Series(np.nan, index=rows.index)),
                                        errors="coerce")
            if significant.notna().any():
                # The statistical view beside the worst case, same axis and colour.
                top.plot(x, significant, ls=":", lw=1.2, color=style["color"],
                         marker="_" if single else None, ms=14)
                dotted = True
            if single:
                bottom.bar(x, rows["n_eqc"], color=style["color"], width=0.5)
            else:
                bottom.plot(x, rows["n_eqc"], **style)
        if not single:  # in the legend and the lower panel's title, off the lines
            same = _identical(part, "remaining_precision", len(samples))
            if same:
                top.plot([], [], ls="none", label=f"solid lines {same}")
            same = _identical(part, "n_eqc", len(samples))
            if same:
                bottom.set_title(f"lines {same}", fontsize=9, loc="left")
        layers = part.drop_duplicates("position").sort_values("position")
        mantissa = MANTISSA_BITS.get(str(part["precision"].iloc[0]), 23) \
            if "precision" in part else 23
        top.set_ylim(-0.15 * mantissa, mantissa + 0.5)  # room for the layer arrows
        if "layer_class" in layers and not single:
            mark_layer_kinds(top, layers)
        top.set_ylabel("remaining precision (bits)", fontsize=10)
        precision = str(part["precision"].iloc[0]) if "precision" in part else "float32"
        count = int(part["n_devices"].max()) if "n_devices" in part else 0
        devices = (f"all {count} {precision} devices" if count > 1 else
                   f"its one {precision} device" if count == 1 else "all devices")
        output = part[part["layer"] == "output"].sort_values("sample")
        takeaway = ""
        if len(output):
            bits = "/".join(str(int(v)) for v in output["remaining_precision"])
            takeaway = (f"At the output: {bits} bits on samples "
                        f"{', '.join(f'#{s}' for s in output['sample'])}")
            if reduced:
                alone = pd.to_numeric(output["remaining_precision_without_reduced"],
                                      errors="coerce")
                takeaway += (f", bounded by {', '.join(reduced)}, which "
                             f"{'computes' if len(reduced) == 1 else 'compute'} below "
                             f"{precision} (effective_precision.csv); the other devices "
                             "alone (dashed): "
                             + "/".join("?" if pd.isna(v) else str(int(v)) for v in alone)
                             + " bits")
        lone = "n_devices" in part and part["n_devices"].max() <= 1
        if lone:
            takeaway = (f"Nothing to show: one {precision} device, none to compare it "
                        f"with. {takeaway}")
        elif single:
            takeaway = (f"The devices share no recorded layer but the output: drawn per "
                        f"sample, no layers to follow. {takeaway}")
        characters = int(13 * (inches[k] * scale + 2.4))
        top.set_title("\n".join([f"{model}: mantissa bits shared by {devices}"
                                 + ("" if single else ", per layer"),
                                 *textwrap.wrap(takeaway, characters)]),
                      fontsize=10, loc="left")
        if reduced:
            top.plot([], [], ls="--", marker="x", ms=5, color="black",
                     label=f"without {', '.join(reduced)} (below {precision})")
        if dotted:
            top.plot([], [], ls=":", color="black",
                     label="significant bits (statistical, mean)")
        if not single:  # What the arrows at the foot of the upper panel mark.
            top.plot([], [], ls="none", marker="^", color="red", label="activation layer")
            top.plot([], [], ls="none", marker="v", color="blue", label="pooling layer")
        # Beside the panel: inside or under it, the legend covered lines or tick labels
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5,
                   frameon=False, handlelength=2.2)
        bottom.set_ylabel("equivalence classes", fontsize=10)
        bottom.yaxis.get_major_locator().set_params(integer=True)  # counts
        counts = pd.to_numeric(part["n_eqc"], errors="coerce")
        if counts.notna().any():  # a whole number of classes either side: no 0.96 tick
            # bars (one layer) start at 0, or their lengths would mislead
            bottom.set_ylim(0 if single else max(counts.min() - 1, 0), counts.max() + 1)
        if single:
            bottom.set_xlabel("test sample (the output: the one layer all record)",
                              fontsize=9)
            bottom.set_xticks(range(len(samples)), [f"#{s}" for s in samples], fontsize=9)
            bottom.set_xlim(-0.6, len(samples) - 0.4)
            top.tick_params(labelbottom=False)
        else:
            labels, key = layer_labels(layers["layer"])
            if key:
                keys.append(f"{model}: " + layer_key_text(key, 170))
            bottom.set_xlabel("layer (input to output)", fontsize=9)
            bottom.set_xticks(layers["position"], labels, rotation=90, fontsize=8)
            top.tick_params(labelbottom=False)
    if not models:
        for ax in axes.flat:
            ax.set_axis_off()
        figure.suptitle("Remaining precision per layer: nothing to show, no layer is "
                        "recorded by two devices", fontsize=11)
    definitions = textwrap.fill(
        "Remaining precision: how many leading mantissa bits all devices share at the layer "
        f"(all {MANTISSA_BITS.get('float32', 23)} in float32: bit-identical; 0: not even the "
        "first). Significant bits (dotted): significantdigits' statistical estimate of the "
        "bits shared (Centred Normal Hypothesis). Equivalence classes: groups of devices "
        "with bit-identical outputs at the layer.", int(15 * figure.get_figwidth()))
    figure.supxlabel("\n".join([definitions, *keys]), fontsize=8, x=0.01, ha="left",
                     multialignment="left")
    save_figure(figure, out, bbox_inches="tight")
    return figure
