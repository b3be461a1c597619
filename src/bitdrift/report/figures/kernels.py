"""The kernels each device ran, per compute layer, beside the classes they end in."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bitdrift.analysis.kernels import UNTRACED
from bitdrift.atomic import save_figure


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
