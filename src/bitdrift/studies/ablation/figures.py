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


# Variants draw with their own marker, so that lines lying on one another stay told apart
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def class_count_note(part: pd.DataFrame) -> str | None:
    """When every layer of every variant splits the devices into the same number of
    classes, the sentence that says so (a panel of flat lines would show nothing more);
    None when the count varies."""
    counts, devices = part["n_eqc"].unique(), part["n_devices"].unique()
    if len(counts) != 1 or len(devices) != 1:
        return None
    count, devices = int(counts[0]), int(devices[0])
    if count == devices:
        return (f"every layer of every variant: {count} classes among {devices} devices "
                "(each device its own bits)")
    if count == 1:
        return f"every layer of every variant: 1 class, the {devices} devices agree bit for bit"
    return f"every layer of every variant: {count} classes among {devices} devices"


def plot_ablation_layers(layers: pd.DataFrame, out) -> None:
    """Per base model (columns): remaining precision (top) and number of classes (bottom)
    per layer, one line per variant, mean over samples; statistical significant bits as
    dotted lines beside remaining precision. Where the number of classes is the same at
    every layer of every variant, the title says it and no panel of flat lines is drawn;
    else the lines of the variants are set slightly apart so that equal ones stay visible."""
    plt = _pyplot()
    bases = list(dict.fromkeys(layers["base"])) or [""]
    parts = {base: layers[(layers["base"] == base) & (layers["layer"] != OUTPUT)]
             for base in bases}
    notes = {base: class_count_note(part) if len(part) else None
             for base, part in parts.items()}
    counts_drawn = any(notes[base] is None and len(parts[base]) for base in bases)
    rows = 2 if counts_drawn else 1
    fig, axes = plt.subplots(rows, len(bases), figsize=(7.5 * len(bases), 3.0 + 3.6 * rows),
                             squeeze=False, sharex="col", layout="constrained")
    handles = {}
    for column, base in enumerate(bases):
        part = parts[base]
        top = axes[0, column]
        bottom = axes[1, column] if rows == 2 else None
        if part.empty:
            top.text(0.5, 0.5, "no ablation records", ha="center", transform=top.transAxes)
            top.set_title(f"{base}: nothing to show, no ablation records", fontsize=9)
            continue
        variants = list(dict.fromkeys(part["variant"]))
        for index, (_, rows_of) in enumerate(part.groupby("variant", sort=False)):
            mean = rows_of.groupby(["position", "layer"], sort=True)[
                ["remaining_precision", "n_eqc", "significant_bits_mean"]].mean().reset_index()
            label = _variant_label(rows_of.iloc[0])
            marker = MARKERS[index % len(MARKERS)]
            line, = top.plot(mean["position"], mean["remaining_precision"], marker=marker,
                             ms=4, label=label)
            handles.setdefault(label, line)
            top.plot(mean["position"], mean["significant_bits_mean"], ls=":",
                     color=line.get_color())
            if bottom is not None and notes[base] is None:
                # A fifth of a class apart at most: equal counts stay readable as integers
                offset = 0.2 * (index - (len(variants) - 1) / 2) / max(len(variants) - 1, 1)
                bottom.plot(mean["position"], mean["n_eqc"] + offset, marker=marker, ms=4,
                            color=line.get_color())
        sequence = part.drop_duplicates("position").sort_values("position")
        top.set_ylim(-3.5, 23.5)  # room for the layer arrows at the foot
        mark_layer_kinds(top, sequence)
        devices = int(part["n_devices"].max())
        title = (f"{base}: {devices} devices, mean over {part['sample'].nunique()} samples\n"
                 "solid: remaining precision; dotted: significant bits (CNH)")
        if notes[base]:
            title += f"\nclasses: {notes[base]}"
        top.set_title(title, fontsize=9)
        top.set_ylabel("remaining precision (bits)")
        labelled = top if bottom is None or notes[base] else bottom
        labelled.set_xticks(sequence["position"], sequence["layer"], rotation=90, fontsize=6)
        labelled.tick_params(labelbottom=True)  # a shared axis hides them above a panel
        if bottom is None:
            continue
        if notes[base]:
            bottom.axis("off")
            bottom.text(0.5, 0.5, f"classes: {notes[base]}", ha="center", fontsize=9,
                        transform=bottom.transAxes)
            continue
        bottom.set_ylabel("number of classes\n(variants set apart by up to 0.1)")
        bottom.set_ylim(0.5, devices + 0.5)
        bottom.set_yticks(range(1, devices + 1))
    if handles:
        fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=2,
                   fontsize=8)
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



