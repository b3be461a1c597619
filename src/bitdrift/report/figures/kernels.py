"""The kernels each device ran, per compute layer, beside the classes they end in."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bitdrift.analysis.kernels import UNTRACED
from bitdrift.atomic import save_figure
from bitdrift.report.figures.layer_marks import layer_key_text, layer_labels

# Few colours, each clearly apart: a column rarely holds more than a handful of kernels
PALETTE = [*plt.get_cmap("Set2").colors, *plt.get_cmap("Pastel1").colors]
UNTRACED_COLOUR, NONE_COLOUR = (0.62, 0.62, 0.62), (0.93, 0.93, 0.93)
WIDTH = 13.0  # inches
KEY_COLUMNS = 4  # kernels side by side in the key under the grid
KEY_FONT = 8.5  # points: read at the report's width, where the figure shrinks to ~0.7
LINE_INCHES = KEY_FONT * 1.3 / 72


def _kernel_letters(index: int) -> str:
    """A, B, ..., Z, AA, AB, ...: a kernel's short name within its layer."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("A") + rest) + letters
    return letters


def letter_colour(letter: str):
    return PALETTE[(ord(letter[-1]) - ord("A")) % len(PALETTE)]


def kernel_key(letters: dict[str, dict[str, str]]) -> list[tuple[list[str], list[tuple[str, str]]]]:
    """The letters spelled out once for every set of layers that names its kernels alike:
    ([layers], [(letter, kernel signature)]) in the order the layers come, layers that
    name no kernel (activations in most runtimes) left out. Layers of one kind mostly run
    the same kernels on every device (conv2d and conv2d_1), so the key is a few blocks
    instead of a line per layer."""
    blocks: dict[tuple, list[str]] = {}
    for layer, names in letters.items():
        spelled = tuple((letter, name) for name, letter in names.items())
        if spelled:
            blocks.setdefault(spelled, []).append(layer)
    return [(layers, list(spelled)) for spelled, layers in blocks.items()]


def _key_layout(key, characters: int):
    """Per block: its heading's lines, its columns (each a list of (letter, lines), the
    kernels down the columns first) and its height in lines."""
    laid = []
    for layers, spelled in key:
        heading = textwrap.wrap(", ".join(layers), KEY_COLUMNS * characters)
        entries = [(letter, textwrap.wrap(name, characters - 6, break_on_hyphens=False))
                   for letter, name in spelled]
        # Columns of about equal height in lines, filled in order
        total = sum(len(lines) for _, lines in entries)
        columns, column, filled = [], [], 0
        for letter, lines in entries:
            if column and filled + len(lines) > -(-total // KEY_COLUMNS) \
                    and len(columns) < KEY_COLUMNS - 1:
                columns.append(column)
                column, filled = [], 0
            column.append((letter, lines))
            filled += len(lines)
        columns.append(column)
        height = max(sum(len(lines) for _, lines in column) for column in columns)
        laid.append((heading, columns, len(heading) + height + 0.6))
    return laid


def plot_kernels(signatures: pd.DataFrame, eqc: pd.DataFrame, divergence: pd.DataFrame,
                 coverage: pd.DataFrame, out: str | Path):
    """Devices x compute layers, each cell a letter naming the kernel signature the layer
    ran (the implementations the libraries logged), A, B, ... within each layer, coloured by
    letter so that equal colours in a column mean the same kernel; under the grid the
    letters spelled out once per set of layers that names its kernels alike, each beside
    its colour. Devices ordered by their final-output class of the model's first sample,
    with the class boundaries drawn; above each layer, how many class pairs (of one
    precision, over all samples) first part there; long layer names numbered, with a key;
    the coverage and a takeaway in the title, which says when there is nothing to show.
    Returns the figure (saved and closed)."""
    from bitdrift.analysis.divergence import class_pairs

    models = list(dict.fromkeys(signatures["model"]))
    if not models:
        figure, ax = plt.subplots(figsize=(9, 1.2))
        ax.set_title("Kernels per layer: nothing to show, no record carries kernels",
                     fontsize=11)
        ax.set_axis_off()
        save_figure(figure, out)
        return figure
    characters = int((WIDTH - 0.3) / KEY_COLUMNS / (KEY_FONT * 0.6 / 72))  # per key column
    panels = []
    for model in models:
        # One row per layer and device (kernels.csv has one per kernel call).
        part = signatures[signatures["model"] == model].drop_duplicates(["device", "layer"])
        layers = list(dict.fromkeys(part["layer"]))
        labels, layer_key = layer_labels(layers)
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
        shown = dict(zip(layers, labels, strict=True))
        key = _key_layout([([shown[layer] for layer in block], spelled)
                           for block, spelled in kernel_key(letters)], characters)
        key_text = layer_key_text(layer_key, int(WIDTH * 14))
        panels.append((model, layers, labels, runtimes, classes, first_sample, devices,
                       grid, letters, key, key_text))
    # Per model: title and takeaway, the grid, its layer names, the key, the layer key
    sizes = []
    for panel in panels:
        labels, devices, key, key_text = panel[2], panel[6], panel[9], panel[10]
        ticks = 0.3 + 0.066 * max(len(label) for label in labels)
        key_inches = LINE_INCHES * 1.5 + sum(LINE_INCHES * height + 0.04
                                             for *_, height in key)
        layer_key_inches = 8 * 1.3 / 72 * (key_text.count("\n") + 1) + 0.2 if key_text \
            else 0.0
        sizes.append((0.26 * len(devices), ticks, key_inches, layer_key_inches))
    heights = [1.2 + rows + ticks + key_inches + layer_key_inches + 0.3
               for rows, ticks, key_inches, layer_key_inches in sizes]
    figure = plt.figure(figsize=(WIDTH, sum(heights)))
    inches = figure.get_figheight()
    top = sum(heights)
    for (model, layers, labels, runtimes, classes, first_sample, devices, grid, letters,
         key, key_text), height, (rows, ticks, *_) in zip(panels, heights, sizes,
                                                          strict=True):
        label_inches = 0.3 + 0.072 * max(len(f"{d} ({runtimes.get(d, '?')}, class 99)")
                                         for d in devices)
        grid_width = min(0.55 * len(layers), WIDTH - label_inches - 0.4)
        ax = figure.add_axes([label_inches / WIDTH, (top - 1.2 - rows) / inches,
                              grid_width / WIDTH, rows / inches])
        image = np.ones((len(devices), len(layers), 3))
        for row, device in enumerate(devices):
            for column, layer in enumerate(layers):
                name = grid.get((device, layer), "none")
                letter = letters[layer].get(name)
                image[row, column] = (NONE_COLOUR if name == "none" else UNTRACED_COLOUR
                                      if letter is None else letter_colour(letter))
                ax.text(column, row, letter or ("–" if name != "none" else ""), ha="center",
                        va="center", fontsize=8)
        ax.imshow(image, aspect="auto", interpolation="nearest")
        ax.set_yticks(range(len(devices)),
                      [f"{d} ({runtimes.get(d, '?')}"
                       + (f", class {classes[d]})" if d in classes else ")") for d in devices],
                      fontsize=8.5)
        ax.set_xticks(range(len(layers)), labels, rotation=90, fontsize=8.5)
        for row in range(1, len(devices)):
            if classes.get(devices[row]) != classes.get(devices[row - 1]):
                ax.axhline(row - 0.5, color="black", lw=1.2)
        firsts = class_pairs(divergence[divergence["model"] == model])
        counts = firsts["first_layer"].value_counts()
        for column, layer in enumerate(layers):
            if counts.get(layer, 0):
                ax.text(column, -0.7, str(int(counts[layer])), ha="center", va="bottom",
                        fontsize=9, fontweight="bold", color="darkred")
        figure.text(0.01, (top - 0.08) / inches, "\n".join(
            [f"{model}: which kernel ran in each compute layer, per device",
             *textwrap.wrap(_takeaway(coverage[coverage["model"] == model]),
                            int(WIDTH * 13))]), fontsize=10, va="top")
        ax.set_title(f"rows grouped by the final output's class on test sample #{first_sample}"
                     " (black lines); red numbers: class pairs that first differ at the layer",
                     fontsize=8.5, loc="left", pad=16)
        # The letters spelled out under the grid, a block per set of layers alike
        y = top - 1.2 - rows - ticks
        figure.text(0.01, y / inches, "Kernels by layer: a letter names one kernel "
                    "signature within its column (grey –: the runtime names none)",
                    fontsize=KEY_FONT + 0.5, va="top", fontweight="bold")
        y -= 1.5 * LINE_INCHES
        column_inches = (WIDTH - 0.3) / KEY_COLUMNS
        for heading, columns, lines_high in key:
            figure.text(0.01, y / inches, "\n".join(heading), fontsize=KEY_FONT, va="top",
                        fontstyle="italic")
            for column, entries in enumerate(columns):
                x = (0.15 + column * column_inches) / WIDTH
                below = y - LINE_INCHES * len(heading) - 0.04
                for letter, lines in entries:
                    figure.text(x, below / inches, letter, fontsize=KEY_FONT, va="top",
                                fontweight="bold", bbox={"facecolor": letter_colour(letter),
                                                         "edgecolor": "none", "pad": 1.5})
                    figure.text(x + 0.3 / WIDTH, below / inches, "\n".join(lines),
                                fontsize=KEY_FONT, va="top", linespacing=1.15)
                    below -= LINE_INCHES * len(lines)
            y -= LINE_INCHES * lines_high + 0.04
        if key_text:
            figure.text(0.01, y / inches, key_text, fontsize=8, va="top")
        top -= height
    save_figure(figure, out, bbox_inches="tight")
    return figure


def _takeaway(row: pd.DataFrame) -> str:
    """The coverage of one model in a sentence; with no first divergence between two
    runtimes that name their kernels, that there is nothing to compare."""
    if not len(row):
        return ""
    row = row.iloc[0]

    def share(value):
        return "n/a" if pd.isna(value) else f"{float(value):.0%}"

    ari = row["adjusted_rand_index_mean"]
    deployed_only = int(row.get("deployed_only", 0) or 0)
    traced = int(row["first_divergences"]) - int(row["untraced"]) - deployed_only
    others = ((f" ({int(row['untraced'])} more involve a runtime that names no kernels: "
               "grey –)" if int(row["untraced"]) else "")
              + (f" ({deployed_only} more part only at the deployed model's output, every "
                 "recorded layer agreeing)" if deployed_only else ""))
    ari = ("Kernels predict the classes with adjusted Rand index "
           f"{'n/a' if pd.isna(ari) else f'{float(ari):.2f}'} (1 = fully, 0 = chance).")
    if traced <= 0:
        return ("Nothing to compare: no first divergence lies between two runtimes that "
                f"name their kernels{others}. {ari}")
    return (f"Of {traced} first divergences between traced runtimes, the kernels differ in "
            f"{share(row['share_kernels_differ'])}; the same kernels with other settings "
            f"(threads, batch) in {share(row['share_same_kernels_other_settings'])}; "
            f"unexplained {share(row['share_unexplained'])}{others}. {ari}")
