"""Figures: the EQC grid with its dendrogram, and remaining precision per layer."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bitdrift.analysis.eqc import class_count_frequency, summarize_repeats  # noqa: E402
from bitdrift.analysis.kernels import UNTRACED  # noqa: E402
from bitdrift.analysis.remaining_precision import MANTISSA_BITS, pairwise_dropped_bits  # noqa: E402
from bitdrift.atomic import save_figure  # noqa: E402
from bitdrift.inputs.models import layer_kind  # noqa: E402
from bitdrift.record.hdf5 import OUTPUT, Record, group_by_model  # noqa: E402


def dendrogram_distances(records: list[Record]) -> tuple[list[str], np.ndarray, int]:
    """Devices of one model and precision, and their pairwise i* over all samples' outputs.

    The largest i* over samples is the i* of the combined output, so merging heights are
    remaining precisions of the whole sample set.
    """
    float_format = None
    matrix = None
    for sample in records[0].samples:
        outputs = []
        for record in records:
            tensor = record.tensor(sample, OUTPUT)
            float_format = tensor.float_format
            _, representative = summarize_repeats(record.device, tensor.values, float_format)
            outputs.append(representative)
        pairwise = pairwise_dropped_bits(outputs, float_format)
        matrix = pairwise if matrix is None else np.maximum(matrix, pairwise)
    return [r.device for r in records], matrix, MANTISSA_BITS[float_format]


def _device_labels(records: list[Record], devices: list[str]) -> tuple[list[str], str]:
    """Row labels and a title part: `device [GPU or CPU model, N cores]` from each record's
    fingerprint, where known; when every device has the same hardware it is named once
    (returned for the title) instead of on every row."""
    described = {}
    for record in records:
        fingerprint = record.fingerprint if isinstance(record.fingerprint, dict) else {}
        cpu = fingerprint.get("cpu") or {}
        gpu = (fingerprint.get("accelerator") or {}).get("gpu_name")
        what = gpu or cpu.get("brand")
        cores = f", {cpu['count']} cores" if cpu.get("count") and not gpu else ""
        described[record.device] = f"{what}{cores}" if what else ""
    hardware = {described.get(device, "") for device in devices}
    if len(hardware) == 1:
        return list(devices), hardware.pop()
    return [f"{device} [{described[device]}]" if described.get(device) else device
            for device in devices], ""


def _class_colours(grid: np.ndarray) -> np.ndarray:
    """Per cell, a colour index that follows the devices, not the class numbers: a class
    takes the colour of its first device (row), so a group of devices keeps its colour in
    every column even where the numbering differs."""
    first = np.full(grid.shape, np.nan)
    for j in range(grid.shape[1]):
        for i in range(grid.shape[0]):
            if not np.isnan(grid[i, j]):
                first[i, j] = int(np.flatnonzero(grid[:, j] == grid[i, j])[0])
    rows = {row: k for k, row in enumerate(sorted({int(v) for v in first[~np.isnan(first)]}))}
    return np.vectorize(lambda v: np.nan if np.isnan(v) else rows[int(v)], otypes=[float])(first)


MAX_GRID_COLUMNS = 60


def _model_tree(group: list[Record]):
    """(devices, pairwise dropped bits capped at the mantissa, mantissa bits, linkage) of
    one model's devices of one precision. Bits beyond the mantissa (sign, exponent) count
    as the whole mantissa: remaining precision is 0 there, never negative."""
    from scipy.cluster.hierarchy import linkage
    from scipy.spatial.distance import squareform

    names, matrix, mantissa = dendrogram_distances(group)
    matrix = np.minimum(matrix, mantissa)
    return names, matrix, mantissa, linkage(squareform(matrix.astype(float), checks=False),
                                            method="complete")


# Up to this many samples the title lists each one's number of classes (3/2/2/...); more
# would run off the figure: the title then counts them.
TITLE_COUNTS = 12


def _class_counts_title(per_sample: pd.Series) -> str:
    """``3/2/2 classes`` for a few samples; for many, the range of classes per sample and
    the commonest count with how many of the drawn samples have it."""
    counts = per_sample.astype(int)
    if len(counts) <= TITLE_COUNTS:
        return f"{'/'.join(map(str, counts))} classes"
    if counts.nunique() == 1:
        return f"{counts.iloc[0]} classes on each of {len(counts)} samples"
    commonest, times = next(iter(class_count_frequency(counts).items()))
    return (f"{counts.min()}–{counts.max()} classes per sample ({commonest} on {times} of "
            f"{len(counts)})")


def plot_eqc(eqc: pd.DataFrame, records: list[Record], out: str | Path,
             precision: str = "float32") -> None:
    """Per model, one block: a grid devices x samples coloured by class ('*':
    non-deterministic), and beside it the dendrogram of its devices in ``precision``, its
    leaves on the grid's rows, x-axis = remaining precision. Class numbers and colours are
    the model's own."""
    from scipy.cluster.hierarchy import dendrogram

    by_model = {model: group for model, group in group_by_model(records)}
    models = list(dict.fromkeys(eqc["model"]))
    # Thousands of samples would make a figure nobody can read (and a PNG of 100,000+
    # pixels): the first MAX_GRID_COLUMNS of each model are drawn, the title says how many
    # are not.
    blocks = []
    for model in models:
        part = eqc[eqc["model"] == model]
        samples = list(dict.fromkeys(part["sample"]))
        devices = list(dict.fromkeys(part["device"]))
        group = [r for r in by_model.get(model, []) if r.precision == precision]
        tree = _model_tree(group) if len(group) >= 2 else None
        if tree is not None:  # rows in leaf order (top to bottom), so rows and leaves meet
            leaves = [tree[0][i] for i in dendrogram(tree[3], no_plot=True)["leaves"]][::-1]
            devices = [d for d in leaves if d in devices] + [d for d in devices
                                                              if d not in leaves]
        left_out = max(len(samples) - MAX_GRID_COLUMNS, 0)
        samples = samples[:MAX_GRID_COLUMNS]
        classes = part.groupby("sample")["eqc"].nunique()
        outside = len(devices) - (len(tree[0]) if tree is not None else 0)
        title = (f"{model}: {_class_counts_title(classes[samples])} among "
                 f"{len(devices)} devices"
                 + (f" (first {len(samples)} samples; {left_out} more in eqc.csv)"
                    if left_out else "")
                 + (f"; dendrogram: its {len(tree[0])} {precision} devices" if tree else "")
                 + (f" ({outside} of other precisions: precision_casting.pdf)"
                    if tree and outside else ""))
        blocks.append((model, part, devices, samples, title, tree))
    labels = {model: _device_labels(by_model.get(model, records), devices)
              for model, _, devices, *_ in blocks}
    hardware = {title for _, title in labels.values()}
    common = hardware.pop() if len(hardware) == 1 else ""
    # Laid out in inches, so every panel keeps a positive width however many columns.
    most = max((len(samples) for *_, samples, _, _ in blocks), default=1)
    column_inches = 0.6 if most <= 20 else 0.3
    label_inches = 0.1 + 0.065 * max((len(label) for names, _ in labels.values()
                                      for label in names), default=4)
    grid_inches = column_inches * max(most, 1) + 0.4
    leaf_inches = 0.3 + 0.065 * max((len(d) for _, _, devices, *_ in blocks
                                     for d in devices), default=4)
    dendrogram_inches, gap_inches = 2.4, 0.5
    width = label_inches + grid_inches + 0.2 + gap_inches + dendrogram_inches + leaf_inches
    header = ("Equivalence classes of the final output. Equal numbers in a column: "
              "bit-identical outputs (an equivalence class); a colour follows a group of "
              "devices across the columns; * = non-deterministic. "
              + ("Class numbers and colours are each model's own. " if len(blocks) > 1
                 else "")
              + "Dendrogram: where the devices in " + precision + " join as low mantissa "
              "bits are dropped (further left: fewer bits shared)"
              + (f"; all on {common}" if common else ""))
    header = textwrap.wrap(header, int(width * 16))
    header_inches = 0.2 + 0.15 * len(header)
    foot_inches, row_inches = 0.75, 0.3
    titles = {model: textwrap.wrap(title, int(width * 11))
              for model, _, _, _, title, _ in blocks}
    heights = [0.2 + 0.2 * len(titles[model]) + row_inches * max(len(devices), 1)
               + foot_inches for model, _, devices, *_ in blocks]
    height = header_inches + sum(heights)
    figure = plt.figure(figsize=(width, height))
    figure.text(0.01, 1 - 0.08 / height, "\n".join(header), fontsize=8, va="top")
    palette = [colour for name in ("tab20", "tab20b", "tab20c")
               for colour in plt.get_cmap(name).colors]
    top = height - header_inches  # inches from the bottom where the next block starts
    for model, part, devices, samples, _, tree in blocks:
        rows = row_inches * max(len(devices), 1)
        bottom = top - 0.2 - 0.2 * len(titles[model]) - rows
        grid_axes = figure.add_axes([label_inches / width, bottom / height,
                                     (grid_inches - 0.4) / width, rows / height])
        grid = np.full((len(devices), len(samples)), np.nan)
        marks = np.full(grid.shape, "", dtype=object)
        for row in part[part["sample"].isin(samples)].itertuples():
            i, j = devices.index(row.device), samples.index(row.sample)
            grid[i, j] = row.eqc
            marks[i, j] = f"{row.eqc}" + ("" if row.deterministic else "*")
        colours = _class_colours(grid)
        count = int(np.nanmax(colours)) + 1 if np.isfinite(colours).any() else 1
        cmap = matplotlib.colors.ListedColormap(
            [palette[k % len(palette)] for k in range(max(count, 1))])
        grid_axes.imshow(colours, cmap=cmap, aspect="auto", vmin=-0.5,
                         vmax=max(count, 1) - 0.5)
        for (i, j), text in np.ndenumerate(marks):
            grid_axes.text(j, i, text, ha="center", va="center", fontsize=8)
        names, _ = labels[model]
        grid_axes.set_yticks(range(len(devices)), names, fontsize=8)
        grid_axes.set_xticks(range(len(samples)), [f"#{s}" for s in samples], fontsize=7,
                             rotation=90 if len(samples) > 20 else 0)
        grid_axes.set_xlabel("test sample (index in the model's test set)", fontsize=7)
        figure.text(0.01, (top - 0.1) / height, "\n".join(titles[model]), fontsize=9,
                    fontweight="bold", va="top")
        if tree is None:
            top = bottom - foot_inches
            continue
        names, matrix, mantissa, linked = tree
        # Its leaves span the grid rows of its devices (the top rows, in the same order)
        share = len(names) / len(devices)
        axes = figure.add_axes([(label_inches + grid_inches + gap_inches) / width,
                                (bottom + rows * (1 - share)) / height,
                                dendrogram_inches / width, rows * share / height])
        with warnings.catch_warnings():
            # All devices equal: every merge at height 0; the limits are set below.
            warnings.filterwarnings("ignore", "Attempting to set identical low and high xlims")
            dendrogram(linked, labels=names, orientation="left", ax=axes, color_threshold=0,
                       above_threshold_color="k", leaf_font_size=7)
        shared = sorted({*range(0, mantissa + 1, 5), mantissa})  # bits, 0 to all
        axes.set_xticks([mantissa - bits for bits in shared], map(str, shared), fontsize=7)
        axes.set_xlim(mantissa + 0.5, -0.5)
        axes.set_ylim(0, 10 * len(names))  # leaf i sits at 10 i + 5: one grid row each
        axes.set_xlabel(f"remaining precision (bits of {mantissa} shared)", fontsize=7)
        top = bottom - foot_inches
    save_figure(figure, out)


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


def plot_eqc_table(table: pd.DataFrame, out: str | Path) -> None:
    """Tables SUP-1/SUP-2: devices (rows, sorted by settings group) with what they are and
    their class per (model, sample); a class's first occurrence in a column in bold, a cell
    equal to its left neighbour faded, `*` non-deterministic. A column with one value for
    every device is named once in the title instead; the title says whether the settings
    groups explain the classes."""
    class_columns = [c for c in table.columns if "#" in c]
    described = [c for c in table.columns if c not in class_columns]
    constant = [c for c in described if c not in ("device", "settings_group")
                and table[c].astype(str).nunique() <= 1]
    columns = [c for c in described if c not in constant] + class_columns
    cells = table[columns].astype(str).to_numpy()
    characters = [max(len(str(c)), table[c].astype(str).str.len().max()) + 2
                  for c in columns]
    width = 1.2 + 0.07 * sum(characters)
    rows_inches, note_inches, title_inches = 0.24 * (len(table) + 1), 0.75, 0.75
    height = rows_inches + note_inches + title_inches + 0.1
    figure = plt.figure(figsize=(max(width, 7), height))
    width = max(width, 7)
    # The table fills its axes (bbox), and the axes the canvas between title and notes.
    axes = figure.add_axes([0.01, (note_inches + 0.05) / height, 0.98, rows_inches / height])
    axes.axis("off")
    same = "; ".join(f"{c} {table[c].astype(str).iloc[0] or '(none)'}" for c in constant)
    # Do the settings explain the classes? Every settings group one class in each column
    mixed = [group for group, part in table.groupby("settings_group")
             if any(part[c].astype(str).str.rstrip("*").nunique() > 1 for c in class_columns)] \
        if "settings_group" in table and class_columns else []
    counts = ", ".join(f"{c}: {table[c].astype(str).str.rstrip('*').nunique()}"
                       for c in class_columns)
    takeaway = (f"{len(table)} devices in {table['settings_group'].nunique()} settings groups; "
                f"classes per column ({counts}). " if "settings_group" in table else "") + (
        "Each settings group is one class in every column: the settings shown explain the "
        "classes." if not mixed else
        f"Settings group(s) {', '.join(map(str, mixed))} hold devices of several classes: "
        "something the settings do not record differs.")
    figure.text(0.01, 1 - 0.05 / height, "\n".join(
        ["Equivalence classes per device, with the settings that separate the rows",
         *textwrap.wrap(takeaway + (f" Every device: {same}." if same else ""),
                        int(width * 14))]), fontsize=8.5, va="top")
    figure.text(0.01, 0.05 / height, "\n".join(textwrap.wrap(
        "settings_group: devices with equal values of the attributes that explain the "
        "classes (explain.csv; device_classes.csv); a number of its own, not a class. "
        "model#n: the device's equivalence class on test sample n (equal numbers: "
        "bit-identical outputs); bold: the first device of a class in its column; faded: "
        "the same class as in the column to its left; * non-deterministic (its class is its "
        "majority output over the repeats)", int(width * 14))), fontsize=8, va="bottom")
    drawn = axes.table(cellText=cells, colLabels=columns, cellLoc="center",
                       colWidths=[n / sum(characters) for n in characters], bbox=[0, 0, 1, 1])
    drawn.auto_set_font_size(False)
    drawn.set_fontsize(7)
    for k, column in enumerate(columns):
        drawn[0, k].set_text_props(fontweight="bold")
        if column not in class_columns:
            continue
        seen = set()
        for row in range(len(table)):
            value = cells[row, k].rstrip("*")
            cell = drawn[row + 1, k]
            if value not in seen:
                seen.add(value)
                cell.set_text_props(fontweight="bold")
            previous = columns[k - 1]
            if previous in class_columns and cells[row, k] == cells[row, k - 1]:
                cell.set_text_props(color="0.6")
    save_figure(figure, out, bbox_inches="tight")


KIND_STYLE = {"convolution": ("s", "tab:green"), "activation": ("^", "tab:red"),
              "pooling": ("v", "tab:blue"), "dense": ("D", "tab:purple")}


def plot_divergence(apart: pd.DataFrame, layer_classes: pd.DataFrame, out: str | Path) -> None:
    """Per layer position, the share of device pairs already apart (at that layer or any
    before: dashed) and apart at the layer (solid), one panel per model and declared
    precision (pairs of two precisions differ everywhere by construction and are only
    counted); layer classes marked on each point."""
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
        ax.set_title(f"{model}{label}: {pairs} device pairs", fontsize=9)
        # Say why a panel is flat, or why it starts high: the reader cannot see it
        first = part[part["position"] == part["position"].min()]
        if part["share_apart_so_far"].max() == 0:
            ax.text(0.5, 0.5, textwrap.fill(f"all {pairs} pairs of {precision or 'these'} "
                                            "devices agree bit for bit at every layer", 30),
                    transform=ax.transAxes, ha="center", va="center", fontsize=8)
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


def _kernel_letters(index: int) -> str:
    """A, B, ..., Z, AA, AB, ...: a kernel's short name within its layer."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("A") + rest) + letters
    return letters


def plot_kernels(signatures: pd.DataFrame, eqc: pd.DataFrame, divergence: pd.DataFrame,
                 coverage: pd.DataFrame, out: str | Path) -> None:
    """Devices x compute layers, each cell a letter naming the kernel signature the layer
    ran (the implementations the libraries logged), A, B, ... within each layer, coloured by
    letter so that equal colours in a column mean the same kernel; the letters spelled out
    under the grid, layer by layer, in full. Devices ordered by their final-output class of
    the model's first sample, with the class boundaries drawn; above each layer, how many
    class pairs (of one precision, over all samples) first part there; the coverage and a
    takeaway in the title."""
    from bitdrift.analysis.divergence import class_pairs

    models = list(dict.fromkeys(signatures["model"]))
    if not models:
        figure, ax = plt.subplots(figsize=(9, 2.2))
        ax.text(0.5, 0.5, "no record carries kernels", ha="center", va="center")
        ax.set_axis_off()
        save_figure(figure, out)
        return
    # Few colours, each clearly apart: a column rarely holds more than a handful of kernels
    palette = [*plt.get_cmap("Set2").colors, *plt.get_cmap("Pastel1").colors]
    untraced_colour, none_colour = (0.62, 0.62, 0.62), (0.93, 0.93, 0.93)
    width = 13.0
    panels = []
    for model in models:
        # One row per layer and device (kernels.csv has one per kernel call).
        part = signatures[signatures["model"] == model].drop_duplicates(["device", "layer"])
        layers = list(dict.fromkeys(part["layer"]))
        runtimes = part.drop_duplicates("device").set_index("device")["backend"]
        final = eqc[eqc["model"] == model]
        first_sample = final["sample"].min() if len(final) else None
        classes = final[final["sample"] == first_sample].set_index("device")["eqc"] \
            if first_sample is not None else pd.Series(dtype=int)
        devices = sorted(dict.fromkeys(part["device"]),
                         key=lambda d: (classes.get(d, 10**6), list(part["device"]).index(d)))
        grid = part.set_index(["device", "layer"])["signature"]
        letters = {}  # layer -> {signature: letter}, in the order of the rows
        for layer in layers:
            names = [grid.get((device, layer), "none") for device in devices]
            traced = [n for n in dict.fromkeys(names)
                      if n != "none" and not n.startswith(UNTRACED)]
            letters[layer] = {name: _kernel_letters(k) for k, name in enumerate(traced)}
        legend = []
        for layer in layers:
            spelled = "; ".join(f"{letter} = {name}" for name, letter in letters[layer].items())
            if spelled:  # layers no library names a kernel for (activations) stay out
                legend += textwrap.wrap(f"{layer}: {spelled}", int(width * 14),
                                        subsequent_indent="    ")
        panels.append((model, layers, runtimes, classes, first_sample, devices, grid,
                       letters, legend))
    # title and takeaway, the grid, its layer names, the letters spelled out
    heights = [1.05 + 0.26 * len(panel[5]) + 0.95 + 0.15 * (len(panel[8]) + 1) + 0.3
               for panel in panels]
    figure = plt.figure(figsize=(width, sum(heights)))
    top = sum(heights)
    for (model, layers, runtimes, classes, first_sample, devices, grid, letters,
         legend), height in zip(panels, heights, strict=True):
        rows = 0.26 * len(devices)
        label_inches = 0.3 + 0.062 * max(len(f"{d} ({runtimes.get(d, '?')}, class 99)")
                                         for d in devices)
        grid_width = min(0.55 * len(layers), width - label_inches - 0.4)
        ax = figure.add_axes([label_inches / width, (top - 1.05 - rows) / figure.get_figheight(),
                              grid_width / width, rows / figure.get_figheight()])
        image = np.ones((len(devices), len(layers), 3))
        for row, device in enumerate(devices):
            for column, layer in enumerate(layers):
                name = grid.get((device, layer), "none")
                letter = letters[layer].get(name)
                image[row, column] = (none_colour if name == "none" else untraced_colour
                                      if letter is None else
                                      palette[(ord(letter[-1]) - ord("A")) % len(palette)])
                ax.text(column, row, letter or ("–" if name != "none" else ""), ha="center",
                        va="center", fontsize=7)
        ax.imshow(image, aspect="auto", interpolation="nearest")
        ax.set_yticks(range(len(devices)),
                      [f"{d} ({runtimes.get(d, '?')}"
                       + (f", class {classes[d]})" if d in classes else ")") for d in devices],
                      fontsize=7)
        ax.set_xticks(range(len(layers)), layers, rotation=90, fontsize=7)
        for row in range(1, len(devices)):
            if classes.get(devices[row]) != classes.get(devices[row - 1]):
                ax.axhline(row - 0.5, color="black", lw=1.2)
        firsts = class_pairs(divergence[divergence["model"] == model])
        counts = firsts["first_layer"].value_counts()
        for column, layer in enumerate(layers):
            if counts.get(layer, 0):
                ax.text(column, -0.7, str(int(counts[layer])), ha="center", va="bottom",
                        fontsize=8, fontweight="bold", color="darkred")
        row = coverage[coverage["model"] == model]
        takeaway = ""
        if len(row):
            row = row.iloc[0]

            def share(value):
                return "n/a" if pd.isna(value) else f"{float(value):.0%}"

            ari = row["adjusted_rand_index_mean"]
            deployed_only = int(row.get("deployed_only", 0) or 0)
            traced = int(row["first_divergences"]) - int(row["untraced"]) - deployed_only
            takeaway = (f"Of {traced} first divergences between traced runtimes, the kernels "
                        f"differ in {share(row['share_kernels_differ'])}; the same kernels "
                        f"with other settings (threads, batch) in "
                        f"{share(row['share_same_kernels_other_settings'])}; unexplained "
                        f"{share(row['share_unexplained'])}"
                        + (f" ({int(row['untraced'])} more involve a runtime that names no "
                           "kernels: grey –)" if int(row["untraced"]) else "")
                        + (f" ({deployed_only} more part only at the deployed model's output, "
                           "every recorded layer agreeing)" if deployed_only else "")
                        + ". Kernels predict "
                        "the classes with adjusted Rand index "
                        f"{'n/a' if pd.isna(ari) else f'{float(ari):.2f}'} (1 = fully, 0 = "
                        "chance).")
        figure.text(0.01, (top - 0.08) / figure.get_figheight(), "\n".join(
            [f"{model}: which kernel ran in each compute layer, per device",
             *textwrap.wrap(takeaway, int(width * 15))]), fontsize=8.5, va="top",
            fontweight="normal")
        ax.set_title(f"rows grouped by the final output's class on test sample #{first_sample}"
                     " (black lines); red numbers: class pairs that first differ at the layer",
                     fontsize=7.5, loc="left", pad=14)
        # The letters spelled out, layer by layer, under the grid
        figure.text(0.01, (top - 1.05 - rows - 0.95) / figure.get_figheight(), "\n".join(
            ["Kernels by layer (a letter names one kernel signature within its column; grey "
             "–: the runtime names none):", *legend]), fontsize=7, va="top",
            family="monospace")
        top -= height
    save_figure(figure, out, bbox_inches="tight")


def generations_grid(eqc: pd.DataFrame, devices: dict) -> tuple[pd.DataFrame, list, list]:
    """Runtime x CPU grid of each device's classes over the samples (``devices``: device ->
    (backend, CPU: the emulated model or ``host``)): the cell holds the classes, sample by
    sample ("1/1/2"); devices with equal cells agree bit for bit on every sample."""
    signature = eqc.pivot_table(index="device", columns="sample", values="eqc",
                                aggfunc="first")
    from bitdrift.emulation.cpus import ARM_FAMILIES, FAMILIES, family

    rows, columns = [], []
    for backend, cpu in devices.values():
        rows += [backend] if backend not in rows else []
        columns += [cpu] if cpu not in columns else []
    # the host, then the emulated models by generation (the families' order, x86 then Arm),
    # then by name
    generations = [*FAMILIES, *ARM_FAMILIES]
    columns.sort(key=lambda cpu: (cpu != "host", generations.index(family(cpu))
                                  if family(cpu) in generations else len(generations), cpu))
    grid = pd.DataFrame("", index=rows, columns=columns)
    for device, (backend, cpu) in devices.items():
        if device in signature.index:
            grid.loc[backend, cpu] = "/".join(str(int(v)) for v in signature.loc[device])
    return grid, rows, columns


def plot_generations(eqc: pd.DataFrame, devices: dict, out: str | Path) -> None:
    """Classes by CPU generation (columns: the host, then each emulated model) and runtime
    (rows): one colour per distinct cell, so a row of one colour is a runtime whose output
    does not depend on the CPU generation."""
    from bitdrift.emulation.cpus import family, unavailable

    grid, rows, columns = generations_grid(eqc, devices)
    cells = sorted({value for value in grid.to_numpy().ravel() if value})
    colours = plt.get_cmap("tab20", max(len(cells), 1))
    figure, axis = plt.subplots(figsize=(1.3 * len(columns) + 2.5, 0.55 * len(rows) + 2.2))
    for i, backend in enumerate(rows):
        for j, cpu in enumerate(columns):
            value = grid.loc[backend, cpu]
            colour = colours(cells.index(value)) if value else (0.95, 0.95, 0.95)
            axis.add_patch(plt.Rectangle((j, i), 1, 1, color=colour))
            # an empty cell: why no device is there (a runtime that cannot run on that CPU),
            # or that the config has none
            why = (cpu != "host" and family(cpu) and unavailable(backend, cpu)) or "no device"
            axis.text(j + 0.5, i + 0.5, value or textwrap.fill(why, 14), ha="center",
                      va="center", fontsize=8 if value else 6.5,
                      color="black" if value else "grey")
    axis.set_xlim(0, len(columns))
    axis.set_ylim(len(rows), 0)
    axis.set_xticks(np.arange(len(columns)) + 0.5, columns, rotation=30, ha="right")
    axis.set_yticks(np.arange(len(rows)) + 0.5, rows)
    axis.set_xlabel("CPU (host, then emulated by QEMU: x86-64, then aarch64)")
    samples = sorted(eqc["sample"].unique())
    axis.set_title("Equivalence class of the final output per runtime and CPU generation\n"
                   f"cell: class on test samples {', '.join(f'#{s}' for s in samples)}; "
                   "one colour = bit-identical on every sample", fontsize=9)
    figure.tight_layout()
    save_figure(figure, out)


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


def plot_atlas(table: pd.DataFrame, out: str | Path) -> None:
    """This machine among the machines measured (bitdrift.atlas.entries): a row per
    machine (this one first), a column per device of the reference model; a cell's number
    and colour are the device's class across the machines (1: this machine's where it ran
    the device), grey where a machine did not run the device."""
    from bitdrift.atlas.entries import THIS_MACHINE

    if table.empty:  # every device of the reference model failed here: the figure says so
        figure, axis = plt.subplots(figsize=(6, 1.5))
        axis.axis("off")
        axis.text(0.5, 0.5, "No device ran the reference model here (see the device "
                  "failures)", ha="center", va="center", fontsize=9)
        save_figure(figure, out)
        return
    machines = list(dict.fromkeys(table["machine"]))
    devices = list(dict.fromkeys(table["device"]))
    names = dict(zip(table["machine"], table["name"], strict=False))
    labels = [textwrap.fill(f"this machine: {names[m]}" if m == THIS_MACHINE else names[m], 44)
              + ("" if m == THIS_MACHINE else f"\n[{m}]") for m in machines]
    cells = {(row.machine, row.device): int(row["class"]) for _, row in table.iterrows()}
    colours = plt.get_cmap("tab10")
    figure, axis = plt.subplots(figsize=(max(0.55 * len(devices) + 4.5, 9.0),
                                         0.55 * len(machines) + 2.6))
    for i, machine in enumerate(machines):
        for j, device in enumerate(devices):
            cls = cells.get((machine, device))
            colour = (0.93, 0.93, 0.93) if cls is None else colours((cls - 1) % 10)
            axis.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=colour, edgecolor="white"))
            axis.text(j + 0.5, i + 0.5, "–" if cls is None else str(cls), ha="center",
                      va="center", fontsize=7, color="grey" if cls is None else "black")
    axis.set_xlim(0, len(devices))
    axis.set_ylim(len(machines), 0)
    axis.set_xticks(np.arange(len(devices)) + 0.5, devices, rotation=60, ha="right",
                    fontsize=7)
    axis.set_yticks(np.arange(len(machines)) + 0.5, labels, fontsize=7)
    axis.set_xlabel("device (runtime and settings) running the reference model")
    axis.set_title("This machine among the machines measured: each device's class across "
                   "machines\n(one colour in a column = the same bits on every layer and "
                   "sample; – = not run there)", fontsize=9, loc="right")
    figure.tight_layout()
    save_figure(figure, out)
