"""The machines: the classes by CPU generation and runtime (plot_generations, emulated
CPUs), and this machine among the machines measured (plot_atlas, bitdrift.atlas)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import NamedTuple

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bitdrift.atomic import save_figure


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


# What a cell of the atlas figure says about a machine's run of a device, the same in every
# column (the legend's entries, in order), and its colour
CELL_KINDS = ("this machine", "same bits as this machine",
              "differs: first differing layer, bits left in the final output",
              "configured otherwise", "not run there")
THIS, SAME, DIFFERS, CONFIGURED, NOT_RUN = range(len(CELL_KINDS))
CELL_COLOURS = ("#4e79a7", "#8cd17d", "#f28e2b", "#b07aa1", "#eeeeee")
LAYER_CHARS = 12  # a layer's name in a cell, cut beyond this


class AtlasGrid(NamedTuple):
    machines: list[str]  # row labels: this machine first ("this machine: ..."), by label
    devices: list[str]  # columns: this machine's devices
    kinds: np.ndarray  # (machines, devices): index into CELL_KINDS
    texts: list[list[str]]  # what each cell says


def atlas_grid(table: pd.DataFrame) -> AtlasGrid:
    """The atlas table (atlas.csv, bitdrift.atlas.entries.rows_table) as the figure draws
    it: a row per machine by its label, a column per device of this machine, each cell
    one of CELL_KINDS, whose meaning does not depend on the column."""
    from bitdrift.atlas.entries import (
        CONFIGURED_OTHERWISE,
        THIS_MACHINE,
        machine_order,
        rows_from_table,
    )

    rows = rows_from_table(table)
    order = machine_order(rows)
    devices = list(dict.fromkeys(row.device for row in rows if row.machine == THIS_MACHINE))
    by_cell = {(row.machine, row.device): row for row in rows}
    labels = {row.machine: row.label for row in rows}
    kinds = np.full((len(order), len(devices)), NOT_RUN)
    texts = [["–"] * len(devices) for _ in order]
    for i, machine in enumerate(order):
        for j, device in enumerate(devices):
            row = by_cell.get((machine, device))
            if row is None:
                continue
            if machine == THIS_MACHINE:
                kinds[i, j], texts[i][j] = THIS, "here"
            elif row.same_as_this:
                kinds[i, j], texts[i][j] = SAME, "same"
            elif row.first_difference == CONFIGURED_OTHERWISE:
                kinds[i, j], texts[i][j] = CONFIGURED, "config"
            else:
                layer = row.first_difference
                layer = layer if len(layer) <= LAYER_CHARS else layer[:LAYER_CHARS - 1] + "…"
                bits = "?" if row.remaining_precision is None else \
                    f"{row.remaining_precision:g}"
                kinds[i, j], texts[i][j] = DIFFERS, f"{layer}\n{bits} bits"
    names = [f"this machine: {labels[m]}" if m == THIS_MACHINE else labels[m] for m in order]
    return AtlasGrid(names, devices, kinds, texts)


def plot_atlas(table: pd.DataFrame, out: str | Path) -> None:
    """This machine among the machines measured (bitdrift.atlas.entries): a row per
    machine by its label (this one first), a column per device of this machine; a cell's
    colour says the same in every column (CELL_KINDS): same bits as this machine, or
    differs (the first differing layer and the bits left in the final output written in
    it), or not run there."""
    from matplotlib.patches import Patch

    if table.empty:  # every device of the reference model failed here: the figure says so
        figure, axis = plt.subplots(figsize=(6, 1.5))
        axis.axis("off")
        axis.text(0.5, 0.5, "No device ran the reference model here (see the device "
                  "failures)", ha="center", va="center", fontsize=9)
        save_figure(figure, out)
        return
    grid = atlas_grid(table)
    rows, columns = len(grid.machines), len(grid.devices)
    width = max(0.62 * columns + 4.2, 8.0)
    height = 0.36 * rows + 2.6
    figure, axis = plt.subplots(figsize=(width, height))
    for i in range(rows):
        for j in range(columns):
            kind = grid.kinds[i, j]
            axis.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=CELL_COLOURS[kind],
                                         edgecolor="white"))
            axis.text(j + 0.5, i + 0.5, grid.texts[i][j], ha="center", va="center",
                      fontsize=5.5, color="grey" if kind == NOT_RUN else
                      "white" if kind == THIS else "black")
    axis.set_xlim(0, columns)
    axis.set_ylim(rows, 0)
    axis.set_xticks(np.arange(columns) + 0.5, grid.devices, rotation=45, ha="right",
                    fontsize=7)
    axis.set_yticks(np.arange(rows) + 0.5, [textwrap.fill(name, 48) for name in grid.machines],
                    fontsize=7)
    axis.tick_params(length=0)
    axis.set_xlabel("device of this machine (runtime and settings) running the reference "
                    "model", fontsize=8)
    present = sorted(set(grid.kinds.ravel()) | {SAME, DIFFERS})
    figure.legend([Patch(facecolor=CELL_COLOURS[k], edgecolor="grey") for k in present],
                  [CELL_KINDS[k] for k in present], loc="lower center", fontsize=7,
                  ncol=2 if width < 12 else len(present), frameon=False)
    figure.suptitle(textwrap.fill(
        "This machine among the machines measured: each device on each machine against "
        "this machine's bits (every layer, every sample); one colour means the same in "
        "every column", int(width * 11)), fontsize=9)
    # room at the bottom for the legend's rows (about a quarter inch each)
    figure.tight_layout(rect=(0, (0.6 if width < 12 else 0.35) / height, 1, 1))
    save_figure(figure, out)
