"""Figures of the ablation study (PDF and PNG, matplotlib, no framework import)."""

from __future__ import annotations

import pandas as pd

from bitdrift.atomic import save_figure
from bitdrift.record.hdf5 import OUTPUT
from bitdrift.report.figures.layer_marks import mark_layer_kinds


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _variant_label(row) -> str:
    name = "base" if row["variant"] == "base" else row["variant"]
    trained = "" if row["trained"] else ", untrained"
    return f"{name} ({row['activation']}, {row['pooling']}pool{trained})"


def plot_ablation_layers(layers: pd.DataFrame, out) -> None:
    """Per base model (columns): remaining precision (top) and number of classes (bottom)
    per layer, one line per variant, mean over samples; statistical significant bits as
    dotted lines beside remaining precision."""
    plt = _pyplot()
    bases = list(dict.fromkeys(layers["base"])) or [""]
    fig, axes = plt.subplots(2, len(bases), figsize=(7.5 * len(bases), 7.5), squeeze=False,
                             sharex="col", layout="constrained")
    for column, base in enumerate(bases):
        part = layers[(layers["base"] == base) & (layers["layer"] != OUTPUT)]
        top, bottom = axes[0, column], axes[1, column]
        for _, rows in part.groupby("variant", sort=False):
            mean = rows.groupby(["position", "layer"], sort=True)[
                ["remaining_precision", "n_eqc", "significant_bits_mean"]].mean().reset_index()
            line, = top.plot(mean["position"], mean["remaining_precision"], marker="o", ms=3)
            top.plot(mean["position"], mean["significant_bits_mean"], ls=":",
                     color=line.get_color())
            bottom.plot(mean["position"], mean["n_eqc"], marker="o", ms=3,
                        color=line.get_color(), label=_variant_label(rows.iloc[0]))
        if part.empty:
            top.text(0.5, 0.5, "no ablation records", ha="center", transform=top.transAxes)
            continue
        sequence = part.drop_duplicates("position").sort_values("position")
        top.set_ylim(-3.5, 23.5)  # room for the layer arrows at the foot
        mark_layer_kinds(top, sequence)
        devices = int(part["n_devices"].max())
        top.set_title(f"{base}: {devices} devices, mean over {part['sample'].nunique()} "
                      "samples\nsolid: remaining precision; dotted: significant bits (CNH)",
                      fontsize=9)
        top.set_ylabel("remaining precision (bits)")
        bottom.legend(fontsize=7, loc="lower right")
        bottom.set_ylabel("number of classes")
        bottom.set_ylim(0.5, devices + 0.5)
        bottom.set_yticks(range(1, devices + 1))
        bottom.set_xticks(sequence["position"], sequence["layer"], rotation=90, fontsize=6)
    fig.suptitle("Activation and pooling ablation (Schlögl et al., Figures SUP-4..7)\n"
                 "red up arrows: activation layers; blue down arrows: pooling layers",
                 fontsize=10)
    save_figure(fig, out)


def plot_precision_casting(casting: pd.DataFrame, out) -> None:
    """Figure 6: per base model, one line per precision: number of classes, remaining
    precision in that precision's mantissa bits and as a share of them, per layer (mean
    over samples) with the final output last."""
    plt = _pyplot()
    bases = list(dict.fromkeys(casting["base"])) or [""]
    fig, axes = plt.subplots(3, len(bases), figsize=(7.5 * len(bases), 9), squeeze=False,
                             sharex="col", layout="constrained")
    for column, base in enumerate(bases):
        part = casting[casting["base"] == base]
        counts, bits, shares = axes[:, column]
        notes = []
        for precision, rows in part.groupby("precision", sort=False):
            mean = rows.groupby(["position", "layer"], sort=True)[
                ["n_eqc", "remaining_precision", "remaining_share"]].mean().reset_index()
            devices = int(rows["n_devices"].max())
            label = f"{precision} ({devices} device{'s' if devices != 1 else ''})"
            style = {"marker": "o", "ms": 3, "ls": "-" if devices > 1 else ":"}
            counts.plot(mean["position"], mean["n_eqc"], label=label, **style)
            bits.plot(mean["position"], mean["remaining_precision"], label=label, **style)
            shares.plot(mean["position"], mean["remaining_share"], label=label, **style)
            output = rows[rows["layer"] == OUTPUT]
            low, high = output["n_eqc"].min(), output["n_eqc"].max()
            notes.append(f"{precision}: {low if low == high else f'{low}-{high}'} output "
                         "classes" + (" (one device)" if devices < 2 else ""))
        if part.empty:
            counts.text(0.5, 0.5, "no precision-casting records", ha="center",
                        transform=counts.transAxes)
            continue
        sequence = part.drop_duplicates("position").sort_values("position")
        counts.set_title(f"{base} cast to each precision, the same devices, mean over "
                         f"{part['sample'].nunique()} samples\n" + "; ".join(notes),
                         fontsize=8)
        counts.set_ylabel("number of classes")
        bits.set_ylabel("remaining precision (mantissa bits)")
        shares.set_ylabel("remaining precision / mantissa bits")
        shares.set_ylim(-0.15, 1.05)  # room for the layer arrows at the foot
        counts.legend(fontsize=7)
        shares.set_xticks(sequence["position"], sequence["layer"], rotation=90, fontsize=6)
        mark_layer_kinds(shares, sequence)
    # Say only what is drawn: the dotted style exists only where a precision has one device.
    single = casting.groupby(["base", "precision"])["n_devices"].max().lt(2).any() \
        if len(casting) else False
    fig.suptitle("Precision casting (Schlögl et al., Figure 6 and SUP-2)" + (
        "\ndotted lines: one device, nothing to compare" if single else "")
        + "\nclass counts are means over the samples (each sample's range in the subtitle)",
        fontsize=10)
    save_figure(fig, out)



