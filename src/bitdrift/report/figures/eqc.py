"""The equivalence classes drawn: the grid of devices x samples coloured by class with its
dendrogram of remaining precision (plot_eqc, eqc.pdf), and the table of classes with the
settings that separate the devices (plot_eqc_table, Tables SUP-1/SUP-2)."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bitdrift.analysis.eqc import class_count_frequency, summarize_repeats
from bitdrift.analysis.remaining_precision import MANTISSA_BITS, pairwise_dropped_bits
from bitdrift.atomic import save_figure
from bitdrift.record.hdf5 import OUTPUT
from bitdrift.record.reader import Record, group_by_model


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
        # what the grid counts: every device of every precision at once, where the
        # findings count each precision apart (issue 64: 13 classes there, 20 here)
        kinds = list(dict.fromkeys(record.precision for record in by_model.get(model, [])))
        counted = (f"all {len(devices)} devices, of every precision ({', '.join(kinds)})"
                   if len(kinds) > 1 else
                   f"{len(devices)} {kinds[0]} devices" if kinds else f"{len(devices)} devices")
        title = (f"{model}: {_class_counts_title(classes[samples])} among {counted}"
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


CLASS_SHADE = "#e8eef7"  # the class columns' background: apart from what describes a device
TABLE_FONT = 9


def class_header(column: str) -> str:
    """A class column's header: ``cifar10_small#6`` reads `class on #6`; its model is
    named once above its columns (or in the title when it is the only one)."""
    return f"class on\n#{column.rpartition('#')[2]}"


def plot_eqc_table(table: pd.DataFrame, out: str | Path):
    """Tables SUP-1/SUP-2: devices (rows, sorted by settings group) with what they are and
    their class per (model, sample), the class columns shaded and headed `class on sample
    #n`; a class's first occurrence in a column in bold, a cell equal to its left neighbour
    faded, `*` non-deterministic. The settings group stands beside the device as G1, G2,
    ... (a label, not a class). A column with one value for every device is named once in
    the title instead; the title says whether the settings groups explain the classes, and
    says so when there is nothing to show. Returns the figure (saved and closed)."""
    class_columns = [c for c in table.columns if "#" in c]
    described = [c for c in table.columns if c not in class_columns]
    constant = [c for c in described if c not in ("device", "settings_group")
                and table[c].astype(str).nunique() <= 1]
    described = [c for c in described if c not in constant]
    # Beside the device it names a group of devices; beside the classes it read as one
    if "settings_group" in described:
        described.remove("settings_group")
        described.insert(min(1, len(described)), "settings_group")
    columns = described + class_columns
    shown = table[columns].astype(str).copy()
    if "settings_group" in shown:
        shown["settings_group"] = "G" + shown["settings_group"]
    cells = shown.to_numpy()
    models = list(dict.fromkeys(c.rpartition("#")[0] for c in class_columns))
    headers = [class_header(c) if c in class_columns
               else "settings\ngroup" if c == "settings_group" else c for c in columns]
    characters = [max(max(len(line) for line in header.split("\n")),
                      shown[c].str.len().max() if len(shown) else 0) + 2
                  for header, c in zip(headers, columns, strict=True)]
    inch_per_character = TABLE_FONT * 0.66 / 72
    width = max(0.3 + inch_per_character * sum(characters), 8.0)
    row_inches = TABLE_FONT * 2.1 / 72
    rows_inches = row_inches * (len(table) + 2)  # the header is two lines
    wrap = int(width / (TABLE_FONT * 0.55 / 72))
    same = "; ".join(f"{c} {table[c].astype(str).iloc[0] or '(none)'}" for c in constant) \
        if len(table) else ""
    # Do the settings explain the classes? Every settings group one class in each column
    mixed = [group for group, part in table.groupby("settings_group")
             if any(part[c].astype(str).str.rstrip("*").nunique() > 1 for c in class_columns)] \
        if "settings_group" in table and class_columns else []
    numbers = {c: table[c].astype(str).str.rstrip("*").nunique() for c in class_columns}
    counts = "; ".join(f"{model}: " + "/".join(str(n) for c, n in numbers.items()
                                               if c.rpartition("#")[0] == model)
                       for model in models)
    if not len(table) or not class_columns:
        title = "Equivalence classes per device: nothing to show, no device has a class"
        takeaway = ""
    elif all(n == 1 for n in numbers.values()):
        title = ("Equivalence classes per device: nothing parts them, every device gives "
                 "the same bits on every sample")
        takeaway = f"{len(table)} devices."
    else:
        title = "Equivalence classes per device, with the settings that separate the rows"
        takeaway = (f"{len(table)} devices in {table['settings_group'].nunique()} settings "
                    f"groups; classes on the samples shown ({counts}). "
                    if "settings_group" in table
                    else "") + (
            "Each settings group is one class in every column: the settings shown explain "
            "the classes." if not mixed else
            f"Settings group(s) {', '.join(f'G{g}' for g in mixed)} hold devices of several "
            "classes: something the settings do not record differs.")
    lines = [title, *textwrap.wrap(takeaway + (f" Every device: {same}." if same else ""),
                                   wrap)]
    note = textwrap.wrap(
        "settings group: devices with equal values of the attributes that explain the "
        "classes (settings_group in eqc_table.csv; explain.csv; device_classes.csv), a "
        "label of its own, not a class. Class on sample #n (shaded): the device's "
        "equivalence class on test sample n (equal numbers: bit-identical outputs); bold: "
        "the first device of a class in its column; faded: the same class as in the column "
        "to its left; * non-deterministic (its class is its majority output over the "
        "repeats).", wrap)
    band_inches = 0.3  # the models' names over their class columns
    title_inches = 0.2 + 0.2 * len(lines) + band_inches
    note_inches = 0.1 + 0.17 * len(note)
    height = rows_inches + note_inches + title_inches + 0.1
    figure = plt.figure(figsize=(width, height))
    figure.text(0.01, 1 - 0.05 / height, lines[0], fontsize=11, va="top", fontweight="bold")
    figure.text(0.01, 1 - 0.3 / height, "\n".join(lines[1:]), fontsize=10, va="top")
    figure.text(0.01, 0.05 / height, "\n".join(note), fontsize=9, va="bottom")
    if not len(table):
        save_figure(figure, out, bbox_inches="tight")
        return figure
    # The table fills its axes (bbox), and the axes the canvas between title and notes.
    axes = figure.add_axes([0.01, (note_inches + 0.05) / height, 0.98, rows_inches / height])
    axes.axis("off")
    drawn = axes.table(cellText=cells, colLabels=headers, cellLoc="center",
                       colWidths=[n / sum(characters) for n in characters], bbox=[0, 0, 1, 1])
    drawn.auto_set_font_size(False)
    drawn.set_fontsize(TABLE_FONT)
    edges = np.cumsum([0, *characters]) / sum(characters)
    for model in models:  # its name once, over the span of its columns
        span = [k for k, c in enumerate(columns) if c in class_columns
                and c.rpartition("#")[0] == model]
        left, right = edges[span[0]], edges[span[-1] + 1]
        above = 1 + 0.06 / rows_inches
        axes.annotate("", (left + 0.002, above), (right - 0.002, above),
                      xycoords="axes fraction", arrowprops={"arrowstyle": "-", "lw": 1.2})
        axes.text((left + right) / 2, above + 0.02 / rows_inches, model, ha="center",
                  va="bottom", fontsize=TABLE_FONT + 0.5, fontweight="bold",
                  transform=axes.transAxes)
    for k, column in enumerate(columns):
        header = drawn[0, k]
        header.set_text_props(fontweight="bold")
        header.set_height(2 * header.get_height())
        if column not in class_columns:
            continue
        header.set_facecolor(CLASS_SHADE)
        seen = set()
        for row in range(len(table)):
            value = cells[row, k].rstrip("*")
            cell = drawn[row + 1, k]
            cell.set_facecolor(CLASS_SHADE)
            if value not in seen:
                seen.add(value)
                cell.set_text_props(fontweight="bold")
            previous = columns[k - 1]
            if previous in class_columns and cells[row, k] == cells[row, k - 1]:
                cell.set_text_props(color="0.6")
    save_figure(figure, out, bbox_inches="tight")
    return figure
