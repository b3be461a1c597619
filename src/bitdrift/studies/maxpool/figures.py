"""Figures of the MaxPool study: backprop variation histograms (Figures 1-3), the volume
of the bifurcation zone (Table 2, Figure 4) and hybrid-beta training (Figure 5)."""

from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bitdrift.atomic import save_figure  # noqa: E402


def _save(figure, out) -> None:
    figure.tight_layout()
    save_figure(figure, out)


COMPARISON_TITLES = {"copy": "P vs a copy of P (sanity)",
                     "native_vs_minimal": "MaxPool: native vs minimal Jacobian",
                     "relu0_vs_relu1": "ReLU'(0) = 0 vs 1"}


def plot_backprop_variation(table: pd.DataFrame, out) -> None:
    """Histogram of log10 D(P, Q) per comparison (columns) and precision (rows), one x axis
    for all panels; a comparison whose D is exactly 0 everywhere is one line of text
    instead of empty axes."""
    comparisons = list(dict.fromkeys(table["comparison"]))
    precisions = sorted(table["precision"].unique())
    finite = table["variation"].to_numpy(dtype=float)
    positive_all = finite[np.isfinite(finite) & (finite > 0)]
    zero_only = [c for c in comparisons
                 if not (table.loc[table["comparison"] == c, "variation"] != 0).any()]
    shown = [c for c in comparisons if c not in zero_only]
    figure, axes = plt.subplots(len(precisions), max(len(shown), 1), squeeze=False,
                                sharex=True, figsize=(4.2 * max(len(shown), 1),
                                                      2.4 * len(precisions) + 0.8))
    edges = (np.linspace(np.log10(positive_all.min()) - 0.5, np.log10(positive_all.max()) + 0.5,
                         31) if positive_all.size else np.linspace(-1, 1, 31))
    for i, precision in enumerate(precisions):
        for j, comparison in enumerate(shown):
            ax = axes[i, j]
            values = table[(table["precision"] == precision)
                           & (table["comparison"] == comparison)]["variation"].to_numpy()
            positive = values[np.isfinite(values) & (values > 0)]
            if positive.size:
                ax.hist(np.log10(positive), bins=edges, color="C0")
            # The count goes in the title: inside the axes it sat over the bars.
            ax.set_title(f"{COMPARISON_TITLES.get(comparison, comparison)}, {precision} bits"
                         f"\nD = 0 in {int((values == 0).sum())} of {values.size}"
                         + (f"; {int((~np.isfinite(values)).sum())} non-finite"
                            if (~np.isfinite(values)).any() else ""), fontsize=8)
            ax.yaxis.get_major_locator().set_params(integer=True)
            if j == 0:
                ax.set_ylabel("draws x mini-batches", fontsize=8)
            if i == len(precisions) - 1:
                ax.set_xlabel("log10 D(P, Q)")
    if not shown:
        axes[0, 0].axis("off")
    note = ""
    if zero_only:
        note = textwrap.fill(
            "No panel, D = 0 for every draw, mini-batch and precision: "
            + "; ".join(COMPARISON_TITLES.get(c, c) for c in zero_only)
            + ". For the copy this is expected of deterministic kernels (on a GPU with "
            "non-deterministic kernels it gives tau1 > 0).", 60 * max(len(shown), 1))
        figure.text(0.01, 0.005, note, fontsize=7, va="bottom")
    figure.tight_layout(rect=(0, 0.03 * (note.count("\n") + 1) + 0.01 if note else 0, 1, 1))
    save_figure(figure, out)


# An interval wider than this (of the [0, 1] a share can take) says little: its setting is
# drawn in grey and counted as inconclusive in the title
WIDE_INTERVAL = 0.5


def plot_bifurcation_volume(table: pd.DataFrame, out) -> None:
    """Share of parameter draws (Eq. 18) and of mini-batches (Eq. 19) in S, per setting,
    each a point with its 95 % interval (Hoeffding's, McDiarmid's margins clipped to
    [0, 1]) and the threshold used; a title that says what the intervals allow: with few
    draws they span most of [0, 1], and the settings cannot be told apart. A threshold of 0
    (tau^1 on deterministic kernels) is said to count every nonzero D."""
    from bitdrift.studies.maxpool.jacobians import hoeffding_margin

    labels = [f"{setting}\nτ = {threshold:.0e}" if threshold else f"{setting}\nτ = 0 (!)"
              for setting, threshold in zip(table["setting"], table["threshold"], strict=True)]
    x = np.arange(len(labels))
    figure, ax = plt.subplots(figsize=(max(6.5, 1.4 * len(labels)), 5.2))
    widths = []
    for offset, share, margin, colour, label in (
            (-0.12, "share_theta", "share_theta_margin", "tab:blue",
             "draws θ in S (Eq. 18, Hoeffding)"),
            (0.12, "share_batches", "share_batches_margin", "tab:orange",
             "mini-batches in S (Eq. 19, McDiarmid)")):
        values, half = table[share].to_numpy(float), table[margin].to_numpy(float)
        low, high = np.clip(values - half, 0, 1), np.clip(values + half, 0, 1)
        widths.append(high - low)
        for position, value, lo, hi in zip(x + offset, values, low, high, strict=True):
            wide = hi - lo > WIDE_INTERVAL
            ax.plot([position, position], [lo, hi], color="0.6" if wide else colour, lw=2.5,
                    solid_capstyle="butt")
            ax.plot(position, value, "o", color=colour, ms=6, mec="black", mew=0.5)
        ax.plot([], [], "o-", color=colour, label=label)
    ax.plot([], [], "-", color="0.6", lw=2.5,
            label=f"interval wider than {WIDE_INTERVAL:g}: inconclusive")
    ax.set_xticks(x, labels, rotation=0, fontsize=7)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_ylim(-0.04, 1.06)
    ax.set_ylabel("proportion in the bifurcation zone S (95 % interval)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    draws = int(table["M"].max()) if len(table) else 0
    batches = int(table["R"].max()) if len(table) else 0
    wide = int(np.sum(np.maximum(*widths) > WIDE_INTERVAL)) if len(table) else 0
    # Draws for a ±0.1 interval on the draws' share (Hoeffding): what a finding would need
    needed = next(n for n in range(1, 10**6) if hoeffding_margin(n) <= 0.1)
    if len(table) and wide == len(table):
        takeaway = (f"Inconclusive at this size: with M = {draws} draws and R = {batches} "
                    "mini-batches every interval spans most of [0, 1], so no setting can be "
                    f"told from another. About {needed} draws give ±0.1 "
                    "(maxpool.volume.draws).")
    elif wide:
        takeaway = (f"{wide} of {len(table)} settings inconclusive (grey: intervals wider "
                    f"than {WIDE_INTERVAL:g}); M = {draws} draws, R = {batches} mini-batches.")
    else:
        takeaway = (f"M = {draws} draws, R = {batches} mini-batches: settings whose intervals "
                    "do not overlap differ in the share of the zone.")
    title = ("Volume of the bifurcation zone S: how often the two MaxPool Jacobians give "
             "different gradients\n" + textwrap.fill(takeaway, 110))
    if (table["threshold"] == 0).any():
        title += ("\nτ = 0 (!): every nonzero D counts, compensation errors included; set "
                  "maxpool.volume.thresholds (Table 4) to compare with Table 2")
    ax.set_title(title, fontsize=8.5, loc="left")
    figure.tight_layout()
    save_figure(figure, out)


# What β is, in words, on the figure that varies it (Boustany, Definition of the hybrid)
BETA_MEANING = ("β sets which gradient backprop takes through a MaxPool window with tied "
                "maxima: (1 − β) × all to the first maximum (β = 0, the framework's own) + "
                "β × shared equally among the tied ones (β = 1, the minimal-norm Jacobian); "
                "β > 1 leaves the Clarke Jacobian (Boustany, Figure 5).")


def plot_maxpool_training(table: pd.DataFrame, out) -> None:
    """Final test accuracy per beta (a dot per seed, a bar at the mean; a box plot of a few
    seeds would suggest a distribution that is not there) and the mean learning curve per
    beta; each beta's learning rate is on its label, since it is chosen per beta. Both
    panels span accuracy 0 to 1, so that the few seeds' spread is not blown up to fill
    the axis; the title says what β is and, for fewer than three seeds, that the spread
    is not measured. An empty table gives a figure that says it has nothing to show."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.6), sharey=True)
    if table.empty:
        figure.suptitle("Hybrid-β MaxPool training: nothing to show, no training table rows",
                        fontsize=9)
        _save(figure, out)
        return
    final = table[table["epoch"] == table["epoch"].max()]
    betas = sorted(final["beta"].unique())
    rates = table.groupby("beta")["learning_rate"].first()
    names = {b: f"β={b:g}\n(lr {rates[b]:g})" for b in betas}
    per_beta = final.groupby("beta")["seed"].nunique()
    seeds = int(per_beta.min())  # the fewest seeds of any β decides what can be said
    seeds_text = f"{seeds}" if seeds == per_beta.max() else f"{seeds}–{int(per_beta.max())}"
    for k, beta in enumerate(betas):
        values = final[final["beta"] == beta]["test_accuracy"].to_numpy(float)
        left.scatter(np.full(len(values), k), values, s=18, color="k", zorder=3)
        left.hlines(values.mean(), k - 0.3, k + 0.3, color="C0", lw=2)
        spread = f"{values.min():.2f}–{values.max():.2f}" if len(values) > 1 else ""
        left.annotate(f"{values.mean():.2f}\n{spread}", (k, values.min()), xytext=(0, -8),
                      textcoords="offset points", ha="center", va="top", fontsize=7)
    left.set_xticks(range(len(betas)), [names[b] for b in betas], fontsize=8)
    left.set_xlim(-0.6, len(betas) - 0.4)
    plural = "s" if per_beta.max() != 1 else ""
    left.set_xlabel(f"β; {seeds_text} seed{plural} each, bar and number = mean, then the "
                    "seeds' range", fontsize=8)
    left.set_ylabel(f"test accuracy after epoch {int(table['epoch'].max())}")
    for beta, rows in table.groupby("beta"):
        curve = rows.groupby("epoch")["test_accuracy"].agg(["mean", "min", "max"])
        right.plot(curve.index, curve["mean"], marker="o",
                   label=names[beta].replace("\n", " "))
        right.fill_between(curve.index, curve["min"], curve["max"], alpha=0.2)
    right.set_ylim(0, 1.02)
    right.tick_params(labelleft=True)  # the shared axis would hide them
    right.set_xlabel("epoch")
    right.set_ylabel("test accuracy (mean; band: the seeds' range)")
    right.legend(fontsize=8, loc="lower right")
    caution = ("" if seeds >= 3 else f" With {seeds_text} seed{plural} per β "
               "the run-to-run spread is not measured: differences between β within the "
               "seeds' ranges are not a finding.")
    figure.suptitle("Training with the hybrid-β MaxPool Jacobian\n"
                    + textwrap.fill(BETA_MEANING + caution, 125), fontsize=8.5)
    _save(figure, out)
