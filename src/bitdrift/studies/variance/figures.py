"""Figures of the training-variance study (PDF, matplotlib, no framework import)."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd

from bitdrift.atomic import save_figure
from bitdrift.commands.common import outputs_together
from bitdrift.studies.variance.plans import ARM_LABELS


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _arm(arm: str) -> str:
    return ARM_LABELS.get(arm, arm)


def _devices_of(summary: pd.DataFrame, plan: str, arm: str) -> list[str]:
    """The devices an all-devices row of ``plan`` and ``arm`` pools (its per-device rows)."""
    rows = summary[(summary["plan"] == plan) & (summary["arm"] == arm)
                   & (summary["scope"] != "all")]
    return list(dict.fromkeys(rows["scope"]))


def _label(row, summary: pd.DataFrame | None = None) -> str:
    """``plan: ARM on device``; an all-devices row names its devices (from ``summary``)."""
    if row["scope"] == "all":
        devices = [] if summary is None else _devices_of(summary, row["plan"], row["arm"])
        where = (f" on {len(devices)} devices:\n" + ", ".join(devices)) if devices \
            else " on all its devices"
    else:
        where = f" on {row['scope']}"
    # A degenerate group (models at chance, diverged training) is named as such.
    flag = row.get("flag", "")
    flag = f" [{flag}: not a finding]" if isinstance(flag, str) and flag else ""
    return f"{row['plan']}: {_arm(row['arm'])}{where}{flag}"


def _plans(summary: pd.DataFrame) -> pd.DataFrame:
    """The non-ensemble rows with a spread to show (two runs or more): per device, plus
    the all-devices row where there is one."""
    return summary[(summary["study"] == "plan") & (summary["runs"] > 1)].reset_index(drop=True)


def _save(fig, out) -> None:
    save_figure(fig, out)


def _bars(ax, rows: pd.DataFrame, column: str, title: str, scale: float = 1.0,
          summary: pd.DataFrame | None = None) -> None:
    """One horizontal bar per row, its value written just beyond the bar's end (on white,
    not over the bar's colour)."""
    values = rows[column].to_numpy(dtype=float) * scale
    positions = np.arange(len(rows))
    ax.barh(positions, np.nan_to_num(values), color="tab:blue")
    top = np.nanmax(values) if np.isfinite(values).any() else 0.0
    room = top * 0.02 if top > 0 else 0.02
    for position, value in zip(positions, values, strict=True):
        ax.text((0 if np.isnan(value) else value) + room, position,
                "n/a" if np.isnan(value) else f"{value:.3g}", va="center", fontsize=7,
                color="black")
    ax.set_xlim(0, top * 1.22 if top > 0 else 1)  # room for the value beyond the longest bar
    ax.set_yticks(positions, [_label(r, summary) for _, r in rows.iterrows()], fontsize=7)
    ax.set_title(textwrap.fill(title, 36), fontsize=9)  # narrow panels: titles would meet


# What the arms mean, on the figures that show them (Zhuang et al.; Morin & Willetts)
ARMS_CAPTION = ("Arms: ALGO = seeds of initialisation, data order, augmentation and dropout "
                "differ per run, deterministic ops; IMPL = the same seeds, non-deterministic "
                "ops (implementation noise only); ALGO+IMPL = both; CONTROL = the same seeds, "
                "deterministic ops (no noise expected). same seed / different seeds: Morin & "
                "Willetts' arms. sd: sample standard deviation over the runs of an arm.")


def _bar_panels(summary: pd.DataFrame, panels, title: str, out) -> None:
    """One horizontal bar panel per (column, title, scale), the plans' arms as rows; the
    arms explained below. Without a group of two runs or more the title says there is
    nothing to show."""
    plt = _pyplot()
    rows = _plans(summary)
    lines = sum(1 + _label(r, summary).count("\n") for _, r in rows.iterrows())
    # Narrow panels: three of them stay about 1,200 px wide in the report (was 1,700).
    fig, axes = plt.subplots(1, len(panels), figsize=(3.0 * len(panels) + 2.2,
                                                      1.2 + 0.32 * max(lines, 1)),
                             sharey=True, layout="constrained")
    for ax, (column, panel_title, scale) in zip(axes, panels, strict=True):
        _bars(ax, rows, column, panel_title, scale, summary)
    axes[0].invert_yaxis()  # shared y: once for all panels, first row on top
    if rows.empty:
        title = ("Nothing to show: no arm of a plan has two runs or more, so there is no "
                 "spread\n" + title)
        for ax in axes:
            ax.set_yticks([])
    fig.suptitle(title, fontsize=8)
    fig.supxlabel(textwrap.fill(ARMS_CAPTION, 40 * len(panels) + 40), fontsize=7, x=0.01,
                  ha="left")
    _save(fig, out)


def plot_training_variance(summary: pd.DataFrame, ratios: pd.DataFrame, out) -> None:
    """sd of test accuracy and loss per arm; the same/different ratios in the title."""
    def ratio(row, measure):
        value = row[f"ratio_{measure}"]
        low, high = row.get(f"ratio_{measure}_low"), row.get(f"ratio_{measure}_high")
        text = f"{measure} {value:.3g}"
        if low is not None and not pd.isna(low):
            text += f" (95 % bootstrap {low:.2g} to {high:.2g})"
        return text

    def note(row) -> str:
        text = (f"{row['plan']}{'' if row['scope'] == 'all' else ' on ' + row['scope']}: "
                f"{ratio(row, 'accuracy')}, {ratio(row, 'loss')}; {row['runs_same']} + "
                f"{row['runs_different']} runs")
        if row["ratio_accuracy"] == 0 and row["ratio_loss"] == 0:
            text += "; 0: the same-seed runs were bit-identical on this machine"
        return textwrap.fill(text, 110)

    notes = [note(r) for _, r in ratios.iterrows()]
    _bar_panels(summary, [("sd_accuracy", "sd of test accuracy (%)", 100),
                          ("sd_loss", "sd of test loss", 1)],
                "Spread of test accuracy and loss over training runs\n"
                "ratio sd(same seed) / sd(different seeds):\n" + "\n".join(notes)
                + "\nMorin & Willetts, ResNet on GPU: accuracy 0.739, loss 0.872", out)


def plot_churn(summary: pd.DataFrame, out) -> None:
    """Churn, normalised weight distance and per-class accuracy spread per arm."""
    _bar_panels(summary, [
        ("churn", "churn (% test labels that differ, mean over pairs)", 100),
        ("weight_distance", "L2 distance of unit-normalised weights", 1),
        ("mean_sd_class_accuracy", "mean sd of per-class accuracy (%)", 100)],
        "Model stability under each source of noise", out)


def _seconds(value) -> str:
    return "?" if pd.isna(value) else f"{float(value):.2g} s"


def _percent(value) -> str:
    return "?" if pd.isna(value) else f"{100 * float(value):.0f} %"


def _model_timed(row) -> str:
    """What a determinism-cost row timed: its model, with the architecture and kernel size
    where the table has them (older tables do not)."""
    architecture = row.get("architecture")
    text = f"{row['model']}"
    if isinstance(architecture, str) and architecture and architecture != row["model"]:
        text += f" ({architecture}"
        kernel = row.get("kernel_size")
        text += f", {int(kernel)}x{int(kernel)} convolutions)" if pd.notna(kernel) else ")"
    return text


def _cost_label(row) -> str:
    """Three lines: plan, device and model; the arms' test accuracy; runs and epoch times."""
    arms = f"{_arm(row['arm_deterministic'])} vs {_arm(row['arm_default'])}"
    accuracy = ""
    if pd.notna(row.get("accuracy_deterministic", np.nan)):
        accuracy = (f"test accuracy {_percent(row['accuracy_deterministic'])} vs "
                    f"{_percent(row.get('accuracy_default'))}; ")
    flag = f" [{row['flag']}]" if isinstance(row.get("flag"), str) and row["flag"] else ""
    return (f"{row['plan']} on {row['device']}: {_model_timed(row)}{flag}\n"
            f"{arms}: {accuracy}n = {row.get('runs_deterministic', '?')} + "
            f"{row.get('runs_default', '?')} runs\nepoch "
            f"{_seconds(row.get('epoch_seconds_deterministic'))} vs "
            f"{_seconds(row.get('epoch_seconds_default'))}")


def plot_determinism_cost(cost: pd.DataFrame, out) -> None:
    """Overhead of deterministic training per plan (model, kernel size) and device: the
    deterministic arm's wall time as a percentage of the default arm's (log scale, 100 % =
    no cost). A ratio with a 95 % bootstrap interval over the arms' runs is a bar with its
    interval; one without (fewer than MIN_RUNS_FOR_INTERVAL runs in an arm) is a hollow
    grey point, and the title says that its noise is not measured. Each row names the model
    timed and its arms' test accuracy."""
    from bitdrift.studies.variance.stats import MIN_RUNS_FOR_INTERVAL

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 2.4 + 0.62 * max(len(cost), 1)),
                             sharey=True, layout="constrained")
    positions = np.arange(len(cost))
    labels = [_cost_label(row) for _, row in cost.iterrows()]
    with_interval = np.zeros(len(cost), dtype=bool)
    for ax, column, title in ((axes[0], "epoch_percent_of_default", "per epoch (mean)"),
                              (axes[1], "step_percent_of_default", "per step (median)")):
        if cost.empty:  # no scale to set on an empty axis
            ax.set_axis_off()
            continue
        # Zhuang et al.'s view: deterministic time as a percentage of the default time.
        values = cost[column].to_numpy(dtype=float)
        unit = column.split("_")[0]
        low = 100 * cost.get(f"{unit}_ratio_low", pd.Series(np.nan, index=cost.index)) \
            .to_numpy(dtype=float)
        high = 100 * cost.get(f"{unit}_ratio_high", pd.Series(np.nan, index=cost.index)) \
            .to_numpy(dtype=float)
        shown = np.isfinite(low) & np.isfinite(high)
        with_interval |= shown
        # A bar only where an interval says how far the run-to-run noise reaches
        # red: slower beyond the noise; green: faster; grey: the interval holds 100 %
        ax.barh(positions[shown], values[shown] - 100, left=100, height=0.5,
                color=np.where(low[shown] > 100, "tab:red",
                               np.where(high[shown] < 100, "tab:green", "0.7")))
        ax.errorbar(values[shown], positions[shown],
                    xerr=[values[shown] - low[shown], high[shown] - values[shown]],
                    fmt="none", ecolor="black", elinewidth=1, capsize=3)
        ax.plot(values[~shown], positions[~shown], "o", mfc="white", mec="0.45", mew=1.5,
                ms=8, ls="none")
        for position, value, interval, top in zip(positions, values, shown,
                                                  np.where(shown, high, values), strict=True):
            if np.isfinite(value):
                ax.text(max(top, value, 100 if interval else 0) * 1.12, position,
                        f"{value:.0f} %" + ("" if interval else " (noise unknown)"),
                        va="center", fontsize=7, color="black" if interval else "0.35")
        ax.axvline(100, color="black", linewidth=0.5)
        ax.set_xscale("log")
        finite = np.concatenate([values, low[shown], high[shown], [100.0]])
        finite = finite[np.isfinite(finite) & (finite > 0)]
        ax.set_xlim(min(finite.min() / 1.6, 50), max(finite.max() * 4, 200))
        ticks = [t for t in (10, 25, 50, 100, 200, 400, 800, 1600)
                 if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        ax.set_xticks(ticks, [f"{t} %" for t in ticks])
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_yticks(positions, labels, fontsize=7)
        ax.set_ylim(len(cost) - 0.5, -0.5)  # first row on top, half a row of room
        ax.set_xlabel("deterministic wall time, % of default (100 % = no cost; log scale)",
                      fontsize=8)
        ax.set_title(f"time of deterministic ops, {title}", fontsize=9)
    if cost.empty:
        takeaway = "Nothing to show: no pair of arms that differ only in op determinism."
    elif not with_interval.any():
        takeaway = (f"No finding: every pair has fewer than {MIN_RUNS_FOR_INTERVAL} runs per "
                    "arm, so each percentage compares single wall-clock measurements whose "
                    "run-to-run noise is not measured (on a busy machine one short epoch "
                    "can take twice another). "
                    f"{MIN_RUNS_FOR_INTERVAL} or more runs per arm give 95 % intervals.")
    elif not with_interval.all():
        takeaway = (f"Bars with 95 % bootstrap intervals over the arms' runs; hollow grey "
                    f"points: fewer than {MIN_RUNS_FOR_INTERVAL} runs per arm, one "
                    "measurement each, noise unknown, not a finding. Grey bar: its interval "
                    "holds 100 %, no cost beyond the noise.")
    else:
        takeaway = ("Error bars: 95 % bootstrap over the arms' runs (run-to-run variance "
                    "included); a grey bar's interval holds 100 %: no cost beyond the noise.")
    rows = ("Rows: plan on device: the model timed (Zhuang et al. vary the convolutions' "
            "kernel size, Figure 9b); the arms' test accuracy, deterministic vs default "
            "(a model that did not learn times nothing a user trains); runs; mean epoch.")
    fig.suptitle("Cost of deterministic ops (wall clock)\n" + textwrap.fill(takeaway, 130)
                 + ("" if cost.empty else "\n" + textwrap.fill(rows, 130)), fontsize=9)
    if cost.empty:
        axes[0].text(0.5, 0.5, "no pair of arms differing only in op determinism",
                     transform=axes[0].transAxes, ha="center")
    _save(fig, out)


def plot_ensemble_disagreement(summary: pd.DataFrame, out) -> None:
    """Fraction of test labels on which the ensemble's members disagree, one panel per SGD
    momentum side by side (the proposal reproduces Figure S4 with and without momentum),
    one bar per arm (fixed/random init x fixed/random batches, default or deterministic
    ops) and learning rate."""
    plt = _pyplot()
    rows = summary[summary["study"] == "ensemble"].copy()
    if "momentum" not in rows:  # tables from before momentum was recorded
        rows["momentum"] = 0.0
    momenta = sorted(rows["momentum"].unique()) or [0.0]
    bars = rows.drop_duplicates(["arm", "scope", "learning_rate"])
    fig, axes = plt.subplots(1, len(momenta), figsize=(4.6 * len(momenta) + 1.8,
                                                      1.4 + 0.3 * max(len(bars), 2)),
                             sharex=True, sharey=True, layout="constrained", squeeze=False)
    order = bars.sort_values(["learning_rate", "arm", "scope"])[["arm", "scope",
                                                                 "learning_rate"]]
    labels = [f"{arm.removesuffix('_deterministic').replace('_', ' ')}"
              f"{' (det. ops)' if arm.endswith('_deterministic') else ''}"
              f"{'' if scope == 'all' else ' @' + scope}, lr {rate:g}"
              for arm, scope, rate in order.itertuples(index=False)]
    for ax, momentum in zip(axes[0], momenta, strict=True):
        panel = rows[rows["momentum"] == momentum].set_index(["arm", "scope", "learning_rate"])
        for position, key in enumerate(order.itertuples(index=False)):
            if tuple(key) not in panel.index:
                ax.text(0.01, position, "not run at this momentum", va="center",
                        fontsize=6, color="0.5")
                continue
            row = panel.loc[tuple(key)]
            flag = row.get("flag", "")
            flag = flag if isinstance(flag, str) else ""
            ax.barh(position, row["disagreement"], color="tab:red" if flag else "tab:blue")
            step = key.learning_rate / (1 - momentum)  # SGD's effective step with momentum
            note = f" {row['disagreement']:.3f} (n={int(row['runs'])}, step {step:.3g}, acc "
            note += f"{row['mean_accuracy']:.2f})" + (f" {flag}: not a finding" if flag else "")
            ax.text(row["disagreement"], position, note, va="center", fontsize=6,
                    color="tab:red" if flag else "black")
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlim(0, 1)
        ax.set_xlabel("fraction of test labels the members disagree on", fontsize=8)
        ax.set_title(f"SGD momentum {momentum:g}", fontsize=9)
    if rows.empty:
        axes[0][0].text(0.5, 0.5, "no ensemble in the config", ha="center",
                        transform=axes[0][0].transAxes)
    fig.suptitle(("Nothing to show: no ensemble in the config\n" if rows.empty else "")
                 + "Ensemble disagreement with and without momentum (hardware proposal, "
                 "Figure S4)\nn = members, step = effective step lr / (1 - momentum), acc = "
                 "their mean test accuracy; the lr x (1 - m) plan has plain SGD's step",
                 fontsize=9)
    _save(fig, out)


def plot_divergent_examples(examples: pd.DataFrame, dataset_path, out, plan: str,
                            arm: str | None = None, k: int = 16) -> None:
    """The k most divergent test images of one group of ``plan``, each with its true label,
    the labels its runs predicted (label x count) and its divergence; beside them,
    divergence against the majority's confidence for every test example of the group."""
    from bitdrift.studies.variance.examples import gallery

    plt = _pyplot()
    group, picked, images, title = gallery(examples, dataset_path, plan, arm, k)
    columns = 4
    grid_rows = max(1, -(-len(picked) // columns))
    fig = plt.figure(figsize=(11, 1.9 * grid_rows + 1.2), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=[1.5, 1])
    if picked.empty:
        left.text(0.5, 0.5, f"{title}\nevery run predicts the same label on every test "
                  "example:\nno divergent example to show", ha="center", va="center",
                  fontsize=10)
    else:
        axes = left.subplots(grid_rows, columns, squeeze=False)
        for ax in axes.ravel():
            ax.axis("off")
        for ax, (_, row), image in zip(axes.ravel(), picked.iterrows(), images, strict=False):
            image = np.asarray(image, dtype=np.float64)
            span = np.ptp(image)
            image = (image - image.min()) / span if span else np.zeros_like(image)
            ax.imshow(image.squeeze(), cmap="gray" if image.squeeze().ndim == 2 else None)
            ax.set_title(f"test #{int(row['example'])}, true {int(row['label'])}, "
                         f"d={row['divergence']:.2f}\npredicted {row['predicted_labels']}",
                         fontsize=6.5,
                         color="black" if row["majority_correct"] else "tab:red")
        left.suptitle(f"{len(picked)} most divergent test examples of {title} "
                      "(red: the majority is wrong)", fontsize=8)
    ax = right.subplots()
    chosen = group["example"].isin(picked["example"])
    ax.scatter(group["majority_confidence"], group["divergence"], s=8, alpha=0.5,
               color="tab:blue", label="test examples")
    ax.scatter(group.loc[chosen, "majority_confidence"], group.loc[chosen, "divergence"],
               s=22, facecolors="none", edgecolors="tab:red", label="shown at left")
    ax.set_xlabel("majority's confidence (mean softmax of the majority label)", fontsize=8)
    ax.set_ylabel("divergence (share of runs off the majority)", fontsize=8)
    divergent = int((group["divergence"] > 0).sum())
    ax.set_title(f"{divergent} of {len(group)} examples diverge", fontsize=8)
    ax.legend(fontsize=7)
    _save(fig, out)


@outputs_together
def plot_divergent_examples_figure(table, dataset_file, plan, out, arm=None,
                                   top_k=16) -> None:
    """The gallery of the most divergent test images of a plan, with the labels the runs
    predicted, and divergence against the majority's confidence."""
    from bitdrift.atomic import read_table
    from bitdrift.studies.variance.examples import EXAMPLE_COLUMNS, EXAMPLE_EXTRA_COLUMNS
    from bitdrift.studies.variance.figures import plot_divergent_examples

    rows = read_table(table, EXAMPLE_COLUMNS + EXAMPLE_EXTRA_COLUMNS,
                      "bitdrift example-divergence")
    plot_divergent_examples(rows, dataset_file, out, plan, arm, top_k)
