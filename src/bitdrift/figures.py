"""Figures: the EQC grid with its dendrogram, and remaining precision per layer."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bitdrift.atomic import atomic_output  # noqa: E402
from bitdrift.eqc import summarize_repeats  # noqa: E402
from bitdrift.models import ACTIVATION_CLASSES  # noqa: E402
from bitdrift.precision import MANTISSA_BITS, pairwise_dropped_bits  # noqa: E402
from bitdrift.record import OUTPUT, Record, group_by_model  # noqa: E402


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


def plot_eqc(eqc: pd.DataFrame, records: list[Record], out: str | Path,
             precision: str = "float32") -> None:
    """Grid devices x (model, sample) coloured by class ('*': non-deterministic), and a
    dendrogram per model of its devices in ``precision``, x-axis = remaining precision."""
    from scipy.cluster.hierarchy import dendrogram, linkage
    from scipy.spatial.distance import squareform

    devices = list(dict.fromkeys(eqc["device"]))
    columns = list(dict.fromkeys(zip(eqc["model"], eqc["sample"], strict=True)))
    grid = np.full((len(devices), len(columns)), np.nan)
    marks = np.full(grid.shape, "", dtype=object)
    for row in eqc.itertuples():
        i, j = devices.index(row.device), columns.index((row.model, row.sample))
        grid[i, j] = row.eqc
        marks[i, j] = f"{row.eqc}" + ("" if row.deterministic else "*")
    groups = [(model, [r for r in group if r.precision == precision])
              for model, group in group_by_model(records)]
    groups = [(model, group) for model, group in groups if len(group) >= 2]
    width = 2.5 + 0.7 * len(columns) + 4.0 * len(groups)
    height = 1.5 + 0.35 * len(devices)
    figure = plt.figure(figsize=(max(width, 6), max(height, 3)))
    grid_axes = figure.add_axes([0.15, 0.15, 0.7 * (0.7 * len(columns) + 2.5) / width, 0.7])
    cmap = plt.get_cmap("tab20", max(int(np.nanmax(grid)), 1))
    grid_axes.imshow(grid, cmap=cmap, aspect="auto", vmin=0.5, vmax=np.nanmax(grid) + 0.5)
    for (i, j), text in np.ndenumerate(marks):
        grid_axes.text(j, i, text, ha="center", va="center", fontsize=8)
    grid_axes.set_yticks(range(len(devices)), devices, fontsize=8)
    grid_axes.set_xticks(range(len(columns)), [f"{m}\n#{s}" for m, s in columns], fontsize=7)
    grid_axes.set_title("Equivalence classes of the final output (* = non-deterministic)",
                        fontsize=9)
    left = 0.15 + 0.7 * (0.7 * len(columns) + 2.5) / width + 0.12
    step = (0.95 - left) / max(len(groups), 1)
    for k, (model, group) in enumerate(groups):
        names, matrix, mantissa = dendrogram_distances(group)
        axes = figure.add_axes([left + k * step, 0.15, step * 0.55, 0.7])
        tree = linkage(squareform(matrix.astype(float), checks=False), method="complete")
        dendrogram(tree, labels=names, orientation="left", ax=axes, color_threshold=0,
                   above_threshold_color="k", leaf_font_size=7)
        top = max(float(matrix.max()), 1.0)
        ticks = np.unique(np.linspace(0, top, num=min(int(top) + 1, 6)).round())
        axes.set_xticks(ticks, [f"{mantissa - t:.0f}" for t in ticks])
        axes.set_xlim(top + 0.5, -0.5)
        axes.set_xlabel("remaining precision (bits)", fontsize=8)
        axes.set_title(f"{model} ({precision})", fontsize=9)
    with atomic_output(out) as tmp:
        figure.savefig(tmp, format=Path(out).suffix.lstrip(".") or "pdf")
    plt.close(figure)


def plot_remaining_precision(table: pd.DataFrame, out: str | Path) -> None:
    """Per model: RP and number of EQCs per layer, one line per sample; activation layers
    marked by red upward arrows and pooling layers by blue downward arrows (Figure SUP-4)."""
    models = list(dict.fromkeys(table["model"]))
    figure, axes = plt.subplots(2, max(len(models), 1), figsize=(6 * max(len(models), 1), 6),
                                squeeze=False, sharex="col")
    for k, model in enumerate(models):
        part = table[table["model"] == model]
        top, bottom = axes[0, k], axes[1, k]
        for sample, rows in part.groupby("sample"):
            rows = rows.sort_values("position")
            top.plot(rows["position"], rows["remaining_precision"], marker="o", ms=3,
                     label=f"sample {sample}")
            bottom.plot(rows["position"], rows["n_eqc"], marker="o", ms=3)
        layers = part.drop_duplicates("position").sort_values("position")
        classes = layers.get("layer_class", pd.Series([""] * len(layers))).fillna("")
        for position, layer_class in zip(layers["position"], classes, strict=True):
            if layer_class in ACTIVATION_CLASSES:
                top.annotate("", (position, 0), (position, -2.5), annotation_clip=False,
                             arrowprops={"arrowstyle": "-|>", "color": "red"})
            elif "Pooling" in str(layer_class):
                top.annotate("", (position, -2.5), (position, 0), annotation_clip=False,
                             arrowprops={"arrowstyle": "-|>", "color": "blue"})
        mantissa = MANTISSA_BITS.get(str(part["precision"].iloc[0]), 23) \
            if "precision" in part else 23
        top.set_ylim(-0.5, mantissa + 0.5)
        top.set_ylabel("remaining precision (bits)")
        top.set_title(f"{model}")
        top.legend(fontsize=7)
        bottom.set_ylabel("number of EQCs")
        bottom.set_xlabel("layer")
        bottom.set_xticks(layers["position"], layers["layer"], rotation=90, fontsize=6)
    figure.tight_layout()
    with atomic_output(out) as tmp:
        figure.savefig(tmp, format=Path(out).suffix.lstrip(".") or "pdf")
    plt.close(figure)
