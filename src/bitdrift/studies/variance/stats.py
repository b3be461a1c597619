"""Statistics over training runs: spread of accuracy and loss, churn, weight distance,
per-class and sub-group spread, ensemble disagreement, cost of determinism.

Definitions (Zhuang et al. 2022, Morin & Willetts 2020):
- churn of two models: the fraction of test examples on which their predicted labels
  *differ*; a group's churn is the mean over all pairs of runs;
- weight distance of two runs: ``|| w1/|w1| - w2/|w2| ||``, each run's trained weights
  as one vector normalised to unit length; mean over pairs;
- standard deviations are sample standard deviations (ddof=1) over the runs;
- for a binary task (label 1 = positive): FPR = FP / (FP + TN), the share of true
  negatives predicted positive; FNR = FN / (FN + TP), the share of true positives
  predicted negative;
- disagreement of an ensemble: the fraction of test examples on which its members do not
  all predict the same label (the hardware proposal's Figure S4).

Only NumPy, pandas and h5py: runs gathered elsewhere are analysed without a framework.
"""

from __future__ import annotations

import itertools
import json
import sys
import warnings
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

from bitdrift.commands.common import outputs_together
from bitdrift.errors import StudyError

RUN_KEYS = ("logits", "labels", "weights", "step_seconds", "epoch_seconds")
RUN_ATTRS = ("plan", "arm", "device", "run", "study", "model", "learning_rate", "switches",
             "deterministic", "test_accuracy", "test_loss", "dataset_sha256", "classes",
             "init_sha256")


# -- measures on hand-checkable arrays ------------------------------------------------------
def _pairs(items):
    return list(itertools.combinations(range(len(items)), 2))


def churn(predictions: np.ndarray) -> float:
    """Mean over pairs of runs of the fraction of examples whose predicted labels differ.
    ``predictions`` is (runs, examples) of labels; NaN for fewer than two runs."""
    pairs = _pairs(predictions)
    if not pairs:
        return float("nan")
    return float(np.mean([np.mean(predictions[i] != predictions[j]) for i, j in pairs]))


def normalised_weight_distance(weights: list[np.ndarray]) -> float:
    """Mean over pairs of runs of the L2 distance of the unit-normalised weight vectors."""
    pairs = _pairs(weights)
    if not pairs:
        return float("nan")
    units = []
    for vector in weights:
        vector = np.asarray(vector, dtype=np.float64).ravel()
        norm = np.linalg.norm(vector)
        if norm == 0:
            raise StudyError("a run's weights are all zero; cannot normalise them")
        units.append(vector / norm)
    return float(np.mean([np.linalg.norm(units[i] - units[j]) for i, j in pairs]))


def disagreement(predictions: np.ndarray) -> float:
    """Fraction of examples on which not all runs predict the same label."""
    if len(predictions) < 2:
        return float("nan")
    return float(np.mean((predictions != predictions[0]).any(axis=0)))


def per_class_accuracy(predictions: np.ndarray, labels: np.ndarray, classes: int) -> np.ndarray:
    """Accuracy on each class's test examples; NaN for a class absent from the test set."""
    correct = np.bincount(labels, weights=(predictions == labels), minlength=classes)
    counts = np.bincount(labels, minlength=classes).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, correct / counts, np.nan)


def binary_rates(predictions: np.ndarray, labels: np.ndarray) -> dict:
    """Accuracy, FPR = FP/(FP+TN) and FNR = FN/(FN+TP) of binary predictions (1 positive).
    A rate whose denominator is empty is NaN."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    positive, negative = labels == 1, labels == 0
    false_positive = np.sum(negative & (predictions == 1))
    false_negative = np.sum(positive & (predictions == 0))
    return {
        "accuracy": float(np.mean(predictions == labels)) if len(labels) else float("nan"),
        "fpr": float(false_positive / negative.sum()) if negative.any() else float("nan"),
        "fnr": float(false_negative / positive.sum()) if positive.any() else float("nan"),
    }


def sample_sd(values, axis=None):
    """Sample sd (ddof=1); NaN for one value. Deviations are taken from the first value
    (the same sd mathematically), so bit-identical runs give exactly 0, not rounding dust."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float("nan") if axis is None else np.full(values.shape[1:], np.nan)
    result = np.std(values - values[0], ddof=1, axis=axis)
    return float(result) if axis is None else result


def steady_epochs(epoch_seconds: np.ndarray) -> np.ndarray:
    """Epoch times without the first when there are more: the first epoch also traces and
    compiles the step function, which is not the cost of an epoch."""
    return epoch_seconds[1:] if len(epoch_seconds) > 1 else epoch_seconds


def distinct_outputs(logits: list[np.ndarray]) -> int:
    """How many bit-distinct logit arrays the runs produced (1: all bit-identical)."""
    return len({np.ascontiguousarray(array).tobytes() for array in logits})


# -- run files ------------------------------------------------------------------------------
def read_run(path: str | Path) -> dict:
    """A run file written by bitdrift.studies.variance.runs, checked; errors name the file."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as handle:
            missing = [k for k in RUN_KEYS if k not in handle]
            missing += [k for k in RUN_ATTRS if k not in handle.attrs]
            if missing:
                raise StudyError(f"{path}: not a bitdrift run file (missing {missing})")
            run = {key: handle[key][()] for key in RUN_KEYS}
            run.update({key: handle.attrs[key] for key in RUN_ATTRS})
            # The recipe (optimizer, momentum, ...) of the run; older files lack it.
            run["spec"] = json.loads(handle.attrs["spec"]) if "spec" in handle.attrs else {}
            if "attributes" in handle:
                run["attributes"] = handle["attributes"][()]
                run["attribute_names"] = json.loads(handle.attrs["attribute_names"])
    except OSError as error:
        raise StudyError(f"{path}: cannot read run file ({error})") from error
    for key in ("plan", "arm", "device", "study", "model", "dataset_sha256", "init_sha256"):
        run[key] = str(run[key])
    run["run"], run["classes"] = int(run["run"]), int(run["classes"])
    run["switches"] = json.loads(run["switches"])
    run["path"] = str(path)
    if run["logits"].shape != (len(run["labels"]), run["classes"]):
        raise StudyError(f"{path}: logits {run['logits'].shape} do not match "
                         f"{len(run['labels'])} labels x {run['classes']} classes")
    return run


def _check_group(runs: list[dict]) -> None:
    first = runs[0]
    for run in runs[1:]:
        for key in ("model", "dataset_sha256", "classes"):
            if run[key] != first[key]:
                raise StudyError(f"{run['path']}: {key} {run[key]!r} differs from "
                                 f"{first['path']} ({first[key]!r}) in the same plan")
        if not np.array_equal(run["labels"], first["labels"]) or \
                run["weights"].shape != first["weights"].shape:
            raise StudyError(f"{run['path']}: test labels or weight shapes differ from "
                             f"{first['path']} in the same plan")
    if first["switches"]["init"] == "fixed":
        # "Same init" is a claim about the initial weights, checked by their digest.
        for run in runs[1:]:
            if run["init_sha256"] != first["init_sha256"]:
                raise StudyError(
                    f"{run['path']}: arm {run['arm']!r} fixes the init seed, but its initial "
                    f"weights (sha256 {run['init_sha256'][:12]}...) differ from "
                    f"{first['path']} ({first['init_sha256'][:12]}...): not the same init")
    seen = {}
    for run in runs:
        key = (run["device"], run["run"])
        if key in seen:
            raise StudyError(f"{run['path']}: the same run as {seen[key]}")
        seen[key] = run["path"]


def _groups(runs: list[dict]):
    """(plan, arm, scope) -> runs; scope is a device, or `all` over a plan's devices."""
    groups: dict[tuple, list] = {}
    for run in runs:
        groups.setdefault((run["plan"], run["arm"], run["device"]), []).append(run)
        groups.setdefault((run["plan"], run["arm"], "all"), []).append(run)
    devices = {}
    for run in runs:
        devices.setdefault((run["plan"], run["arm"]), set()).add(run["device"])
    return {key: sorted(members, key=lambda r: (r["device"], r["run"]))
            for key, members in groups.items()
            if key[2] != "all" or len(devices[key[:2]]) > 1}


def summarise(runs: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Per (plan, arm, scope): the summary table, the per-run table, the sub-group table."""
    if not runs:
        raise StudyError("no run files given")
    rows, subgroup_rows = [], []
    for (plan, arm, scope), members in _groups(runs).items():
        _check_group(members)
        predictions = np.stack([r["logits"].argmax(axis=1) for r in members])
        labels, classes = members[0]["labels"], members[0]["classes"]
        class_accuracy = np.stack([per_class_accuracy(p, labels, classes) for p in predictions])
        present = ~np.isnan(class_accuracy[0])  # classes with test examples
        class_sd = sample_sd(class_accuracy[:, present], axis=0)
        switches = members[0]["switches"]
        steps = np.concatenate([r["step_seconds"].ravel() for r in members])
        rows.append({
            "plan": plan, "arm": arm, "scope": scope, "study": members[0]["study"],
            "model": members[0]["model"], "learning_rate": float(members[0]["learning_rate"]),
            "momentum": float(members[0]["spec"].get("momentum", 0.0)),
            **{source: switches[source] for source in
               ("init", "data_order", "augmentation", "dropout")},
            "deterministic": bool(switches["deterministic"]), "runs": len(members),
            "mean_accuracy": float(np.mean([r["test_accuracy"] for r in members])),
            "sd_accuracy": sample_sd([r["test_accuracy"] for r in members]),
            "mean_loss": float(np.mean([r["test_loss"] for r in members])),
            "sd_loss": sample_sd([r["test_loss"] for r in members]),
            "churn": churn(predictions),
            "weight_distance": normalised_weight_distance([r["weights"] for r in members]),
            "disagreement": disagreement(predictions),
            "distinct_outputs": distinct_outputs([r["logits"] for r in members]),
            "mean_sd_class_accuracy": float(np.mean(class_sd)),
            "max_sd_class_accuracy": float(np.max(class_sd)),
            "mean_epoch_seconds": float(np.mean(np.concatenate(
                [steady_epochs(r["epoch_seconds"]) for r in members]))),
            "mean_step_seconds": float(np.nanmean(steps)) if steps.size else float("nan"),
            "median_step_seconds": float(np.nanmedian(steps)) if steps.size else float("nan"),
        })
        rows[-1]["flag"] = degenerate(rows[-1]["mean_accuracy"], rows[-1]["sd_accuracy"], classes)
        if "attributes" in members[0] and classes == 2:
            subgroup_rows += _subgroups(plan, arm, scope, members, predictions, labels)
    per_run = pd.DataFrame([{
        "plan": r["plan"], "arm": r["arm"], "device": r["device"], "run": r["run"],
        "test_accuracy": float(r["test_accuracy"]), "test_loss": float(r["test_loss"]),
        "total_seconds": float(np.sum(r["epoch_seconds"])),
        "mean_step_seconds": float(np.nanmean(r["step_seconds"])) if r["step_seconds"].size
        else float("nan"), "path": r["path"],
    } for r in sorted(runs, key=lambda r: (r["plan"], r["arm"], r["device"], r["run"]))])
    subgroup_columns = ["plan", "arm", "scope", "group", "examples", "positives", "runs",
                        *(f"{stat}_{m}" for m in ("accuracy", "fpr", "fnr")
                          for stat in ("mean", "sd"))]
    return (pd.DataFrame(rows), per_run,
            pd.DataFrame(subgroup_rows, columns=subgroup_columns))


def _subgroups(plan, arm, scope, members, predictions, labels) -> list[dict]:
    attributes, names = members[0]["attributes"], members[0]["attribute_names"]
    masks = {"all": np.ones(len(labels), dtype=bool)}
    for column, name in enumerate(names):
        masks[name] = attributes[:, column] == 1
        masks[f"not {name}"] = attributes[:, column] == 0
    rows = []
    for group, mask in masks.items():
        rates = [binary_rates(p[mask], labels[mask]) for p in predictions]
        row = {"plan": plan, "arm": arm, "scope": scope, "group": group,
               "examples": int(mask.sum()), "positives": int(labels[mask].sum()),
               "runs": len(members)}
        for measure in ("accuracy", "fpr", "fnr"):
            values = [r[measure] for r in rates]
            row[f"mean_{measure}"] = float(np.mean(values))
            row[f"sd_{measure}"] = sample_sd(values)
        rows.append(row)
    return rows


# A spread is a finding only between models that learned and trained stably.
UNSTABLE_SD_ACCURACY = 0.1


def degenerate(mean_accuracy: float, sd_accuracy: float, classes: int) -> str:
    """Why a group's spread is not a finding: ``at chance`` (mean test accuracy below
    1.5 / classes: the models did not learn), ``unstable`` (sd of test accuracy above 0.1:
    training diverged for some runs), or empty."""
    if mean_accuracy < 1.5 / classes:
        return "at chance"
    if sd_accuracy > UNSTABLE_SD_ACCURACY:
        return "unstable"
    return ""


def ratio_of_statistic_interval(slow, fast, statistic, confidence: float = 0.95):
    """Percentile bootstrap interval of statistic(slow) / statistic(fast), resampling each
    sample on its own (scipy.stats.bootstrap, 2,000 resamples, fixed seed). A resample
    whose denominator is 0 gives NaN; NaN with fewer than two values in a sample."""
    from scipy.stats import bootstrap

    slow, fast = (np.asarray(v, dtype=np.float64) for v in (slow, fast))
    slow, fast = slow[np.isfinite(slow)], fast[np.isfinite(fast)]
    if len(slow) < 2 or len(fast) < 2:
        return float("nan"), float("nan")
    if np.ptp(slow) == 0 and np.ptp(fast) == 0 and statistic(fast) != 0:
        value = float(statistic(slow) / statistic(fast))  # every resample gives it
        return value, value

    def ratio(a, b, axis=-1):
        numerator, denominator = statistic(a, axis=axis), statistic(b, axis=axis)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(denominator != 0, numerator / denominator, np.nan)

    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        # With few values many resamples repeat one; scipy then says the interval is
        # degenerate (and returns NaN), which the table shows as it is.
        warnings.simplefilter("ignore")
        result = bootstrap((slow, fast), ratio, n_resamples=2000, method="percentile",
                           confidence_level=confidence, random_state=np.random.default_rng(0))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def ratio_interval(same, different, confidence: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of sd(same) / sd(different), resampling the runs of
    each arm (:func:`ratio_of_statistic_interval`); NaN with fewer than two runs in an arm
    or when every resample of `different` has no spread."""
    same, different = (np.asarray(v, dtype=np.float64) for v in (same, different))
    if len(same) >= 2 and np.ptp(same) == 0 and np.ptp(different) > 0:
        return 0.0, 0.0  # bit-identical same-seed runs: every resample's ratio is 0
    return ratio_of_statistic_interval(same, different, _sample_sd, confidence)


def _sample_sd(values, axis=-1):
    # Centred on the first value first: the spread of nearly equal accuracies is tiny.
    return np.std(values - np.take(values, [0], axis=axis), ddof=1, axis=axis)


SEED_RATIO_COLUMNS = ["plan", "scope", "runs_same", "runs_different", "sd_accuracy_same",
                      "sd_accuracy_different", "ratio_accuracy", "ratio_accuracy_low",
                      "ratio_accuracy_high", "sd_loss_same", "sd_loss_different", "ratio_loss",
                      "ratio_loss_low", "ratio_loss_high"]


def seed_ratio(summary: pd.DataFrame, per_run: pd.DataFrame | None = None) -> pd.DataFrame:
    """Morin & Willetts' Table 1 per plan and scope: sd with the same seed, with different
    seeds, and same/different (0.739 for accuracy and 0.872 for loss in the paper), with a
    95 % bootstrap interval of the ratio when the per-run table is given."""
    rows = []
    for (plan, scope), group in summary.groupby(["plan", "scope"], sort=False):
        arms = group.set_index("arm")
        if not {"same", "different"} <= set(arms.index):
            continue
        row = {"plan": plan, "scope": scope, "runs_same": int(arms.loc["same", "runs"]),
               "runs_different": int(arms.loc["different", "runs"])}
        for measure in ("accuracy", "loss"):
            same = arms.loc["same", f"sd_{measure}"]
            different = arms.loc["different", f"sd_{measure}"]
            row[f"sd_{measure}_same"], row[f"sd_{measure}_different"] = same, different
            row[f"ratio_{measure}"] = same / different if different > 0 else float("nan")
            low = high = float("nan")
            if per_run is not None:
                runs = per_run[per_run["plan"] == plan]
                if scope != "all":
                    runs = runs[runs["device"] == scope]
                values = [runs[runs["arm"] == arm][f"test_{measure}"].to_numpy()
                          for arm in ("same", "different")]
                low, high = ratio_interval(*values)
            row[f"ratio_{measure}_low"], row[f"ratio_{measure}_high"] = low, high
        rows.append(row)
    return pd.DataFrame(rows, columns=SEED_RATIO_COLUMNS)


SWITCH_COLUMNS = ["init", "data_order", "augmentation", "dropout"]


DETERMINISM_COST_COLUMNS = [
    "plan", "device", "model", "arm_default", "arm_deterministic", "runs_default",
    "runs_deterministic", "flag", "epoch_seconds_default",
    "epoch_seconds_deterministic", "epoch_ratio", "epoch_percent_of_default", "epoch_overhead",
    "step_seconds_default", "step_seconds_deterministic", "step_ratio",
    "step_percent_of_default", "step_overhead",
    # 95 % percentile bootstrap of the ratio over the arms' runs (each run's mean steady
    # epoch, median step), so run-to-run variance is in it; NaN (no interval) with fewer
    # than MIN_RUNS_FOR_INTERVAL runs in an arm.
    "epoch_ratio_low", "epoch_ratio_high", "step_ratio_low", "step_ratio_high",
    # What was timed, so a reader sees that the models learned: the plan's architecture
    # and kernel size (from the run files' spec; empty and NaN where they do not say) and
    # each arm's mean test accuracy
    "architecture", "kernel_size", "accuracy_default", "accuracy_deterministic"]
# Fewer runs than this per arm: no interval (a bootstrap over 2 values has 3 outcomes).
MIN_RUNS_FOR_INTERVAL = 3


def _timings(runs) -> dict:
    """(plan, device, arm) -> (each run's mean steady epoch, each run's median step): one
    value per run, so a bootstrap over them resamples runs, not epochs of one run."""
    timings: dict[tuple, tuple[list, list]] = {}
    for run in runs or []:
        epochs, steps = timings.setdefault((run["plan"], run["device"], run["arm"]), ([], []))
        epochs.append(float(np.mean(steady_epochs(run["epoch_seconds"]))))
        steps.append(float(np.median(np.asarray(run["step_seconds"]).ravel())))
    return timings


def determinism_cost(summary: pd.DataFrame, runs: list[dict] | None = None) -> pd.DataFrame:
    """Cost of deterministic training: for two arms of one plan on one device whose
    switches are equal except op determinism, the wall-clock time of the deterministic arm
    relative to the default one, per epoch (mean, first epoch left out) and per step
    (median). Three views of one number: ``ratio`` = deterministic / default;
    ``percent_of_default`` = 100 x ratio, as Zhuang et al. report it (101 % = no overhead,
    746 % = 7.46x); ``overhead`` = ratio - 1. Wall clock, not GPU kernel time. With the
    ``runs`` (read_run dicts), each ratio gets a bootstrap interval over the arms' runs
    (at least MIN_RUNS_FOR_INTERVAL each; else none: the runs' own epochs would show the
    timing noise of one process, not the variance between runs). Each row also names what
    was timed (architecture, kernel size, from the runs) and how well the arms' models
    learned (mean test accuracy): the time of a model that learned nothing measures nothing
    a user trains."""
    rows = []
    timings = _timings(runs)
    specs = {run["plan"]: run.get("spec") or {} for run in runs or []}
    devices = summary[summary["scope"] != "all"]
    for (plan, scope), group in devices.groupby(["plan", "scope"], sort=False):
        for _, fast in group[~group["deterministic"]].iterrows():
            match = group[group["deterministic"]]
            for column in SWITCH_COLUMNS:
                match = match[match[column] == fast[column]]
            for _, slow in match.iterrows():
                row = {"plan": plan, "device": scope, "model": fast["model"],
                       "arm_default": fast["arm"], "arm_deterministic": slow["arm"],
                       "runs_default": int(fast["runs"]),
                       "runs_deterministic": int(slow["runs"]),
                       "flag": fast["flag"] or slow["flag"],
                       "architecture": specs.get(plan, {}).get("architecture", ""),
                       "kernel_size": specs.get(plan, {}).get("kernel_size", np.nan),
                       "accuracy_default": fast.get("mean_accuracy", np.nan),
                       "accuracy_deterministic": slow.get("mean_accuracy", np.nan)}
                for unit, column in (("epoch", "mean_epoch_seconds"),
                                     ("step", "median_step_seconds")):
                    ratio = slow[column] / fast[column]
                    row.update({f"{unit}_seconds_default": fast[column],
                                f"{unit}_seconds_deterministic": slow[column],
                                f"{unit}_ratio": ratio, f"{unit}_percent_of_default": 100 * ratio,
                                f"{unit}_overhead": ratio - 1})
                slow_times = timings.get((plan, scope, slow["arm"]), ([], []))
                fast_times = timings.get((plan, scope, fast["arm"]), ([], []))
                enough = min(len(slow_times[0]), len(fast_times[0])) >= MIN_RUNS_FOR_INTERVAL
                for index, unit in enumerate(("epoch", "step")):
                    low, high = ratio_of_statistic_interval(
                        slow_times[index], fast_times[index], np.mean) if enough else (
                        float("nan"), float("nan"))
                    row.update({f"{unit}_ratio_low": low, f"{unit}_ratio_high": high})
                rows.append(row)
    return pd.DataFrame(rows, columns=DETERMINISM_COST_COLUMNS)


def training_tables(paths) -> dict[str, pd.DataFrame]:
    """Every table of the training-variance study from a set of run files."""
    runs = [read_run(path) for path in paths]
    summary, per_run, subgroups = summarise(runs)
    return {"summary": summary, "runs": per_run, "subgroups": subgroups,
            "seed_ratio": seed_ratio(summary, per_run),
            "determinism_cost": determinism_cost(summary, runs)}


@outputs_together
def write_training_tables(files, out_dir) -> None:
    """Spread, churn, weight distance, sub-groups and determinism cost from run files."""
    from bitdrift.atomic import write_tables
    from bitdrift.studies.variance.paths import TRAINING_TABLES
    from bitdrift.studies.variance.stats import training_tables

    tables = training_tables(files)
    write_tables(tables, TRAINING_TABLES, out_dir)
    print(f"bitdrift: {len(tables['runs'])} runs in {len(tables['summary'])} groups -> "
          f"{out_dir}", file=sys.stderr)
