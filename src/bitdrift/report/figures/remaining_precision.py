"""Remaining precision and the number of equivalence classes per layer (Figure SUP-4)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bitdrift.analysis.remaining_precision import MANTISSA_BITS
from bitdrift.atomic import save_figure
from bitdrift.report.figures.layer_marks import mark_layer_kinds


def plot_remaining_precision(table: pd.DataFrame, out: str | Path) -> None:
    """Per model: RP and number of EQCs per layer, one line per sample; activation layers
    marked by red upward arrows and pooling layers by blue downward arrows (Figure SUP-4)."""
    models = list(dict.fromkeys(table["model"]))
    figure, axes = plt.subplots(2, max(len(models), 1), figsize=(6.5 * max(len(models), 1), 8.0),
                                squeeze=False, sharex="col")
    for k, model in enumerate(models):
        part = table[table["model"] == model]
        top, bottom = axes[0, k], axes[1, k]
        dotted = False
        # Devices the effective-precision check flags (a bfloat16-like one among float32
        # devices) bound the line; dashed: the other devices alone
        reduced = sorted({device for cell in part.get("reduced_precision_devices",
                                                      pd.Series(dtype=object)).dropna()
                          for device in str(cell).split(";") if device})
        without = pd.to_numeric(part.get("remaining_precision_without_reduced",
                                         pd.Series(np.nan, index=part.index)), errors="coerce")
        for sample, rows in part.groupby("sample"):
            rows = rows.sort_values("position")
            line, = top.plot(rows["position"], rows["remaining_precision"], marker="o", ms=3,
                             label=f"sample {sample}")
            # measured at the layers the check covers (Dense, Conv2D) and the output: a
            # point each, joined
            apart = without.loc[rows.index]
            known = apart.notna().to_numpy()
            if known.any():
                top.plot(rows["position"][known], apart[known], ls="--", lw=1, marker="x",
                         ms=4, color=line.get_color())
            significant = pd.to_numeric(rows.get("significant_bits_mean"), errors="coerce")
            if significant is not None and significant.notna().any():
                # The statistical view beside the worst case, same axis and colour.
                top.plot(rows["position"], significant, ls=":", color=line.get_color())
                dotted = True
            bottom.plot(rows["position"], rows["n_eqc"], marker="o", ms=3)
        layers = part.drop_duplicates("position").sort_values("position")
        mantissa = MANTISSA_BITS.get(str(part["precision"].iloc[0]), 23) \
            if "precision" in part else 23
        top.set_ylim(-0.15 * mantissa, mantissa + 0.5)  # room for the layer arrows
        if "layer_class" in layers:
            mark_layer_kinds(top, layers)
        top.set_ylabel("remaining precision (bits)")
        precision = str(part["precision"].iloc[0]) if "precision" in part else "float32"
        devices = (f"all {int(part['n_devices'].max())} {precision} devices"
                   if "n_devices" in part else "all devices")
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
        top.set_title(f"{model}: mantissa bits shared by {devices}, per layer\n"
                      + textwrap.fill(takeaway, 95), fontsize=9)
        if reduced:
            top.plot([], [], ls="--", marker="x", ms=4, color="black",
                     label=f"without {', '.join(reduced)} (below {precision})")
        if dotted:
            top.plot([], [], ls=":", color="black",
                     label="significant bits (statistical, mean)")
        # What the arrows at the foot of the upper panel mark.
        top.plot([], [], ls="none", marker="^", color="red", label="activation layer")
        top.plot([], [], ls="none", marker="v", color="blue", label="pooling layer")
        # Under the layer names: inside, the legend covered lines of either panel
        bottom.legend(*top.get_legend_handles_labels(), fontsize=7, loc="upper center",
                      bbox_to_anchor=(0.5, -0.42), ncol=2, frameon=False)
        bottom.set_ylabel("equivalence classes")
        bottom.yaxis.get_major_locator().set_params(integer=True)  # counts
        bottom.set_xlabel("layer (input to output)")
        bottom.set_xticks(layers["position"], layers["layer"], rotation=90, fontsize=6)
    figure.text(0.01, 0.005, textwrap.fill(
        "Remaining precision: how many leading mantissa bits all devices share at the layer "
        f"(all {MANTISSA_BITS.get('float32', 23)} in float32: bit-identical; 0: not even the "
        "first). Significant bits (dotted): significantdigits' statistical estimate of the "
        "bits shared (Centred Normal Hypothesis). Equivalence classes: groups of devices "
        "with bit-identical outputs at the layer.", int(17 * figure.get_figwidth())),
        fontsize=7, va="bottom")
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    save_figure(figure, out)
