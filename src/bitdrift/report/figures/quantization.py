"""How far each quantized model lies from its float model (quantization_error.csv): per
layer in graph order, its SQNR on each device, so a device that loses accuracy (an
emulated CPU without VNNI) stands apart at the layer where it parts; bars per device where
only the final output was compared."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from bitdrift.atomic import save_figure
from bitdrift.report.figures.layer_marks import layer_key_text, layer_labels
from bitdrift.report.figures.samples import line_width

DEVICE_COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple",
                  "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "0.4"]
DEVICE_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "<", ">", "*"]


def _labels_said(summary, device: str) -> str:
    labels, changed = summary.labels.get(device, (None, None))
    if labels is None:
        return "labels not compared"
    return f"labels changed {changed} of {labels}"


def _device_label(summary, device: str, recorded: int, drawn: int) -> str:
    sqnr = summary.output_sqnr.get(device)
    at_output = "no final output" if sqnr is None else f"output {_db(sqnr)}"
    fewer = f"\n  {recorded} of the {drawn} layers recorded" if recorded < drawn else ""
    return f"{device}: {at_output}, {_labels_said(summary, device)}{fewer}"


def _db(value: float) -> str:
    return "equal (inf dB)" if math.isinf(value) and value > 0 else f"{value:.1f} dB"


def _finding(summary, axis_label: dict | None = None) -> str:
    """The panel's finding in words: the device that parts and where (the layer as the
    axis labels it: ``axis_label``), or that none does."""
    from bitdrift.analysis.quantization_error import PARTS_DB

    low, high = summary.sqnr_range
    if len(summary.devices) == 1:
        return (f"one device ({summary.devices[0]}): no other to compare; output SQNR "
                f"{_db(low)}")
    if summary.parts_at is None:
        both = _db(low) if _db(low) == _db(high) else f"{_db(low)} to {_db(high)}"
        return (f"the {len(summary.devices)} devices do not part: the lowest at the output "
                f"({summary.furthest}) falls no more than {PARTS_DB} dB further below the "
                f"others at any layer (output {both}); the device does not change this "
                "model's quantization error")
    if not summary.per_layer:
        return (f"{summary.furthest} falls furthest from the float model: {_db(low)} "
                f"against {_db(high)} at the output")
    first = summary.parts_at == summary.first_layer(summary.furthest)
    where = (axis_label or {}).get(summary.parts_at, summary.parts_at)
    how = (f"{summary.parts_by:.1f} dB below the best other device already at its first "
           "recorded layer" if first else f"its shortfall below the best other device "
           f"grows by {summary.parts_by:.1f} dB there")
    return (f"{summary.furthest} parts from the other devices at the dashed line "
            f"({where}): {how}; output {_db(low)} against {_db(high)}")


def _drawn_layers(summary, part: pd.DataFrame) -> list[str]:
    """The layers on the axis: the summary's graph order, the final output left out where
    each device's output is its last layer's tensor again (the same SQNR and error)."""
    from bitdrift.record.hdf5 import OUTPUT

    layers = list(summary.layers)
    if OUTPUT not in layers or len(layers) == 1:
        return layers
    for _, rows in part.groupby("device", sort=False):
        named = rows[rows["layer"] != OUTPUT]
        final = rows[rows["layer"] == OUTPUT]
        if final.empty or named.empty:
            continue
        last = named.iloc[-1]
        if (final["sqnr_db"].iloc[0], final["largest_error"].iloc[0]) != (
                last["sqnr_db"], last["largest_error"]):
            return layers
    return layers[:-1]


def _per_layer_panel(ax, summary, part: pd.DataFrame) -> tuple[list[str], dict]:
    """One line per device over the layers it recorded; the layer where the furthest
    device parts marked. Returns the layer key lines (long names numbered) and each
    layer's label on the axis."""
    layers = _drawn_layers(summary, part)
    position = {layer: k for k, layer in enumerate(layers)}
    finite = part.loc[np.isfinite(part["sqnr_db"]), "sqnr_db"]
    ceiling = (finite.max() if len(finite) else 0.0) + 6.0  # equal tensors drawn here
    for k, device in enumerate(summary.devices):
        rows = part[(part["device"] == device) & part["layer"].isin(position)]
        rows = rows.assign(x=rows["layer"].map(position)).sort_values("x")
        y = rows["sqnr_db"].where(np.isfinite(rows["sqnr_db"]), ceiling)
        # the first device's line the widest: a later one drawn over it leaves its edges
        ax.plot(rows["x"], y, color=DEVICE_COLOURS[k % len(DEVICE_COLOURS)],
                marker=DEVICE_MARKERS[k % len(DEVICE_MARKERS)], lw=line_width(k) - 0.8,
                ms=max(7 - 1.5 * k, 3),
                label=_device_label(summary, device, len(rows), len(layers)))
    if np.isinf(part["sqnr_db"]).any():
        ax.axhline(ceiling, color="0.6", lw=0.6, ls=":")
        ax.text(0, ceiling, " equal to the float model (inf dB)", fontsize=7, va="bottom",
                color="0.4")
    labels, key = layer_labels(layers)
    ax.set_xticks(range(len(layers)), labels, rotation=90, fontsize=7.5)
    ax.set_xlim(-0.6, len(layers) - 0.4)
    ax.set_xlabel("layer, in graph order (each device's recorded layers)", fontsize=9)
    if summary.parts_at is not None and summary.parts_at in position:
        x = position[summary.parts_at]
        ax.axvline(x, color="tab:red", lw=1.0, ls="--", zorder=0)
        ax.text(x, 1.0, f" {summary.furthest} parts", transform=ax.get_xaxis_transform(),
                color="tab:red", fontsize=8, va="top",
                ha="left" if x < 0.7 * len(layers) else "right")
    return key, dict(zip(layers, labels, strict=True))


def _output_panel(ax, summary) -> None:
    """Bars per device: the SQNR of the final output, the only tensor compared."""
    devices = list(summary.output_sqnr)
    values = [summary.output_sqnr[device] for device in devices]
    finite = [value for value in values if math.isfinite(value)]
    ceiling = (max(finite) if finite else 0.0) + 6.0
    drawn = [value if math.isfinite(value) else ceiling for value in values]
    colours = [DEVICE_COLOURS[summary.devices.index(device) % len(DEVICE_COLOURS)]
               for device in devices]
    bars = ax.bar(range(len(devices)), drawn, color=colours, width=0.6)
    for bar, device, value in zip(bars, devices, values, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(),
                f"{_db(value)}\n{_labels_said(summary, device)}", ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(range(len(devices)), devices, fontsize=8.5)
    ax.set_ylim(0, ceiling * 1.25)
    ax.set_xlabel("device (final output only: no layers recorded by both models)",
                  fontsize=9)


def plot_quantization_error(table: pd.DataFrame, out: str | Path):
    """One panel per quantized model (the rows of quantization_error.csv): the SQNR in dB
    against its float model per layer in graph order, a line and marker per device, each
    device's output SQNR and labels changed in the legend; where only the final output was
    compared, bars per device and the title says so. Under each panel title, the finding
    in words (bitdrift.analysis.quantization_error.summarize): the device furthest from the
    float model and the layer where it parts (a dashed red line), or that the devices
    agree. No rows: the figure says there is nothing to compare. Returns the figure (saved
    and closed)."""
    from bitdrift.analysis.quantization_error import summarize

    summaries = summarize(table) if len(table) else []
    if not summaries:
        figure, ax = plt.subplots(figsize=(9, 2.2))
        ax.text(0.5, 0.5, "No quantized model and its float model ran on a common device:\n"
                "nothing to compare (quantization_error.csv is empty; device_failures.csv "
                "names failed devices)", ha="center", va="center", fontsize=10)
        ax.set_axis_off()
        save_figure(figure, out)
        return figure
    widths = [max(len(summary.layers), 4) for summary in summaries]
    width = min(max(9.5, 3.0 + 0.3 * max(widths)), 16.0)
    heights = [5.2 if summary.per_layer else 3.6 for summary in summaries]
    figure, axes = plt.subplots(len(summaries), 1, figsize=(width, sum(heights) + 1.0),
                                squeeze=False, height_ratios=heights, layout="constrained")
    keys = []
    for ax, summary in zip(axes[:, 0], summaries, strict=True):
        part = table[table["model"] == summary.model]
        if summary.per_layer:
            key, axis_label = _per_layer_panel(ax, summary, part)
            if key:
                keys.append(f"{summary.model}: " + layer_key_text(key, 150))
            what = "per layer"
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
                      frameon=False, title="device", title_fontsize=8.5)
        else:
            _output_panel(ax, summary)
            axis_label = {}
            what = "final output only (bars per device): no layer recorded by both"
        ax.set_ylabel("SQNR against the float model (dB)", fontsize=9)
        ax.grid(axis="y", color="0.9", lw=0.6)
        ax.spines[["top", "right"]].set_visible(False)
        ax.set_title(f"{summary.model} against {summary.float_model}, {what}, "
                     f"{summary.samples} sample{'s' * (summary.samples != 1)}\n"
                     + textwrap.fill(_finding(summary, axis_label), 120), fontsize=9.5, loc="left")
    figure.suptitle("Quantized models against their float model: SQNR (dB; higher is "
                    "closer), one line per device", fontsize=11)
    if keys:
        figure.supxlabel("\n".join(keys), fontsize=7.5, x=0.01, ha="left",
                         multialignment="left")
    save_figure(figure, out, bbox_inches="tight")
    return figure


def plot_quantization_error_file(table: str | Path, out: str | Path):
    """plot_quantization_error of a quantization_error.csv."""
    frame = pd.read_csv(table) if Path(table).stat().st_size else pd.DataFrame()
    return plot_quantization_error(frame, out)
