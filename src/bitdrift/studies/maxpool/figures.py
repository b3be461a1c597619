"""Figures of the MaxPool study: backprop variation histograms (Figures 1-3), the volume
of the bifurcation zone (Table 2, Figure 4) and hybrid-beta training (Figure 5)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bitdrift.atomic import save_figure  # noqa: E402


def _save(figure, out) -> None:
    figure.tight_layout()
    save_figure(figure, out)


def plot_backprop_variation(table: pd.DataFrame, out) -> None:
    """Histogram of log10 D(P, Q) per comparison (columns) and precision (rows); the
    number of exactly-zero variations is written in each panel."""
    comparisons = list(dict.fromkeys(table["comparison"]))
    precisions = sorted(table["precision"].unique())
    figure, axes = plt.subplots(len(precisions), len(comparisons), squeeze=False,
                                figsize=(4 * len(comparisons), 2.6 * len(precisions)))
    for i, precision in enumerate(precisions):
        for j, comparison in enumerate(comparisons):
            ax = axes[i, j]
            values = table[(table["precision"] == precision)
                           & (table["comparison"] == comparison)]["variation"].to_numpy()
            positive = values[np.isfinite(values) & (values > 0)]
            if positive.size:
                ax.hist(np.log10(positive), bins=30, color="C0")
            ax.set_title(f"{comparison}, {precision} bits", fontsize=9)
            ax.text(0.02, 0.9, f"D = 0: {int((values == 0).sum())}/{values.size}",
                    transform=ax.transAxes, fontsize=8)
            ax.set_xlabel("log10 D(P, Q)")
    _save(figure, out)


def plot_bifurcation_volume(table: pd.DataFrame, out) -> None:
    """Share of parameter draws (Eq. 18) and of mini-batches (Eq. 19) in S, per setting,
    with the Hoeffding and McDiarmid margins."""
    labels = table["setting"].tolist()
    x = np.arange(len(labels))
    figure, ax = plt.subplots(figsize=(max(5, 1.2 * len(labels)), 4))
    ax.bar(x - 0.2, table["share_theta"], 0.4, yerr=table["share_theta_margin"],
           label="draws θ in S (Eq. 18, Hoeffding)", capsize=3)
    ax.bar(x + 0.2, table["share_batches"], 0.4, yerr=table["share_batches_margin"],
           label="mini-batches in S (Eq. 19, McDiarmid)", capsize=3)
    ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("proportion")
    ax.legend(fontsize=8)
    _save(figure, out)


def plot_maxpool_training(table: pd.DataFrame, out) -> None:
    """Final test accuracy per beta (one box per beta, a dot per seed) and the mean
    learning curve per beta."""
    final = table[table["epoch"] == table["epoch"].max()]
    betas = sorted(final["beta"].unique())
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.boxplot([final[final["beta"] == b]["test_accuracy"] for b in betas],
                 tick_labels=[f"{b:g}" for b in betas])
    for k, beta in enumerate(betas, start=1):
        values = final[final["beta"] == beta]["test_accuracy"]
        left.scatter(np.full(len(values), k), values, s=12, color="k")
    left.set_xlabel("β (hybrid MaxPool)")
    left.set_ylabel("test accuracy")
    for beta, rows in table.groupby("beta"):
        curve = rows.groupby("epoch")["test_accuracy"].agg(["mean", "std"]).fillna(0)
        right.plot(curve.index, curve["mean"], marker="o", label=f"β={beta:g}")
        right.fill_between(curve.index, curve["mean"] - curve["std"],
                           curve["mean"] + curve["std"], alpha=0.2)
    right.set_xlabel("epoch")
    right.set_ylabel("test accuracy (mean ± sd over seeds)")
    right.legend(fontsize=8)
    _save(figure, out)
