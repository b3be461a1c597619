"""The machines: the classes by CPU generation and runtime (plot_generations, emulated
CPUs), and this machine among the machines measured (plot_atlas, bitdrift.atlas)."""

from __future__ import annotations

import textwrap
from pathlib import Path

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
