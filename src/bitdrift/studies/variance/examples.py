"""Which test examples the noise hits (hardware proposal: "isolate examples with high
predictive divergence between members of the ensemble ... visually inspect these images,
as well as measure average test set accuracy for this subset").

Per test example, over the runs of one group (plan, arm, scope):
- divergence: the share of runs whose predicted label differs from the majority label
  (the most frequent one; a tie goes to the lowest label);
- label_entropy: the entropy, in bits, of the distribution of predicted labels;
- sd_true_probability: the sample standard deviation (ddof=1) over runs of the softmax
  probability of the true label;
- majority_correct: whether the majority label is the true one.

An example *diverges* when its divergence is above 0. The top-k of a group are its k most
divergent examples (ties: higher label entropy, then lower majority confidence, the mean
probability the runs give the majority label; the index only last), among the divergent
ones only: a group where every run agrees has an empty top-k, never arbitrary examples.

The top-k's accuracy is measured on runs that did not choose it: the examples are selected
on the first half of the runs (rounded up) and their accuracy is that of the other runs;
with fewer than 3 runs there is no other half, and the table says the accuracy is
conditioned on the selection.
"""

from __future__ import annotations

import itertools
import sys

import numpy as np
import pandas as pd

from bitdrift.commands.common import outputs_together
from bitdrift.errors import StudyError

EXAMPLE_COLUMNS = ["plan", "arm", "scope", "example", "label", "divergence", "label_entropy",
                   "sd_true_probability", "majority_correct"]
# After the contract's columns: what the gallery and the confidence panel need.
EXAMPLE_EXTRA_COLUMNS = ["runs", "majority_label", "majority_confidence", "predicted_labels"]
OVERLAP_COLUMNS = ["plan", "comparison", "a", "b", "k", "divergent_a", "divergent_b",
                   "top_k_jaccard", "spearman_rho", "spearman_p", "examples"]
GROUP_SHARE_COLUMNS = ["plan", "arm", "scope", "kind", "group", "examples",
                       "divergent_examples", "share_of_divergent", "divergent_rate"]
SUBSET_COLUMNS = ["plan", "arm", "scope", "runs", "k", "subset_examples",
                  "accuracy_top_k", "accuracy_top_k_low", "accuracy_top_k_high",
                  "accuracy_rest", "accuracy_rest_low", "accuracy_rest_high",
                  "selection", "selection_runs", "evaluation_runs"]
HELD_OUT, CONDITIONED = "held-out runs", "conditioned on selection"


# -- measures on hand-checkable arrays ------------------------------------------------------
def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def example_divergence(predictions: np.ndarray, labels: np.ndarray, classes: int,
                       true_probabilities: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-example measures of ``predictions`` (runs, examples) of labels.

    ``true_probabilities`` (runs, examples) is each run's probability of the true label;
    without it sd_true_probability is NaN.
    """
    predictions = np.asarray(predictions)
    runs, examples = predictions.shape
    counts = np.zeros((examples, classes), dtype=np.int64)
    for run in predictions:
        counts[np.arange(examples), run] += 1
    majority = counts.argmax(axis=1)  # argmax takes the lowest label among ties
    shares = counts / runs
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.sum(np.where(shares > 0, shares * np.log2(shares), 0.0), axis=1)
    if true_probabilities is None or runs < 2:
        sd_true = np.full(examples, np.nan)
    else:
        sd_true = np.std(np.asarray(true_probabilities, dtype=np.float64), axis=0, ddof=1)
    return {"divergence": 1.0 - counts[np.arange(examples), majority] / runs,
            "label_entropy": entropy + 0.0,  # no -0.0 in the table
            "sd_true_probability": sd_true, "majority_label": majority,
            "majority_correct": majority == np.asarray(labels)}


def top_k(divergence: np.ndarray, k: int, entropy: np.ndarray | None = None,
          confidence: np.ndarray | None = None) -> np.ndarray:
    """Indices of the k most divergent examples, among those with divergence > 0; ties by
    higher entropy, then lower majority confidence, then the index."""
    divergence = np.asarray(divergence, dtype=float)
    entropy = np.zeros_like(divergence) if entropy is None else np.asarray(entropy, float)
    confidence = np.zeros_like(divergence) if confidence is None else \
        np.asarray(confidence, float)
    # lexsort sorts by the last key first: divergence, then entropy (both descending),
    # then confidence (ascending), then the index (ascending).
    order = np.lexsort((np.arange(len(divergence)), confidence, -entropy, -divergence))
    return order[divergence[order] > 0][:k]


def held_out_subset_accuracy(probabilities: np.ndarray, labels: np.ndarray, k: int) -> dict:
    """Top-k accuracy where the runs that choose the top-k are not the ones evaluated on
    it: selected on the first ceil(runs / 2) runs (divergence, entropy and majority
    confidence of those runs only), evaluated on the rest (runs >= 3); with fewer runs,
    selected and evaluated on all of them and labelled so. ``probabilities`` is
    (runs, examples, classes)."""
    probabilities = np.asarray(probabilities)
    predictions = probabilities.argmax(axis=2)
    runs, _, classes = probabilities.shape
    correct = predictions == np.asarray(labels)
    half = -(-runs // 2)
    if runs >= 3:
        chosen_on, evaluated_on, selection = slice(0, half), slice(half, runs), HELD_OUT
    else:
        chosen_on, evaluated_on, selection = slice(0, runs), slice(0, runs), CONDITIONED
    measures = example_divergence(predictions[chosen_on], labels, classes)
    confidence = probabilities[chosen_on][:, np.arange(len(labels)),
                                          measures["majority_label"]].mean(axis=0)
    chosen = top_k(measures["divergence"], k, measures["label_entropy"], confidence)
    rest = np.setdiff1d(np.arange(len(labels)), chosen)
    top = subset_accuracy(correct[evaluated_on], chosen)
    others = subset_accuracy(correct[evaluated_on], rest)
    return {"subset_examples": len(chosen), "accuracy_top_k": top[0],
            "accuracy_top_k_low": top[1], "accuracy_top_k_high": top[2],
            "accuracy_rest": others[0], "accuracy_rest_low": others[1],
            "accuracy_rest_high": others[2], "selection": selection,
            "selection_runs": len(range(runs)[chosen_on]),
            "evaluation_runs": len(range(runs)[evaluated_on])}


def top_k_jaccard(a: np.ndarray, b: np.ndarray, k: int) -> float:
    """Jaccard index of the top-k sets of two groups' divergences; NaN when neither has a
    divergent example (nothing to compare), 0 when only one has."""
    first, second = set(top_k(a, k).tolist()), set(top_k(b, k).tolist())
    if not first and not second:
        return float("nan")
    return len(first & second) / len(first | second)


def rank_correlation(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Spearman's rho and its p-value between two groups' divergences (scipy.stats);
    NaN when either is constant (e.g. no divergent example: nothing to rank)."""
    from scipy import stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan"), float("nan")
    result = stats.spearmanr(a, b)
    return float(result.statistic), float(result.pvalue)


def subset_accuracy(correct: np.ndarray, subset: np.ndarray,
                    confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean accuracy of the runs on ``subset`` of the examples, with a percentile
    bootstrap interval over the examples (scipy.stats.bootstrap, fixed seed).

    ``correct`` is (runs, examples) of booleans. The mean over runs of each run's accuracy
    on the subset equals the mean over the subset of each example's share of correct runs,
    which is what is resampled. NaN for an empty subset; no interval for one example.
    """
    from scipy import stats

    per_example = np.asarray(correct, dtype=float)[:, subset].mean(axis=0)
    if per_example.size == 0:
        return float("nan"), float("nan"), float("nan")
    mean = float(per_example.mean())
    if per_example.size < 2:
        return mean, float("nan"), float("nan")
    if np.ptp(per_example) == 0:  # every resample has the same mean
        return mean, mean, mean
    interval = stats.bootstrap((per_example,), np.mean, confidence_level=confidence,
                               method="percentile", n_resamples=2000,
                               random_state=np.random.default_rng(0)).confidence_interval
    return mean, float(interval.low), float(interval.high)


# -- tables over run files ------------------------------------------------------------------
def _group_measures(members: list[dict]) -> dict:
    labels, classes = members[0]["labels"], members[0]["classes"]
    logits = np.stack([r["logits"] for r in members])
    predictions = logits.argmax(axis=2)
    probabilities = softmax(logits)
    true_probabilities = probabilities[:, np.arange(len(labels)), labels]
    measures = example_divergence(predictions, labels, classes, true_probabilities)
    majority = measures["majority_label"]
    measures["majority_confidence"] = probabilities[:, np.arange(len(labels)),
                                                    majority].mean(axis=0)
    measures["predictions"] = predictions
    measures["probabilities"] = probabilities
    return measures


def _predicted_labels(predictions: np.ndarray) -> list[str]:
    """Per example, the labels the runs predicted with their counts: `3x4 5x1`."""
    out = []
    for column in predictions.T:
        values, counts = np.unique(column, return_counts=True)
        order = np.argsort(-counts, kind="stable")
        out.append(" ".join(f"{values[i]}x{counts[i]}" for i in order))
    return out


def example_tables(paths, k: int = 16) -> dict[str, pd.DataFrame]:
    """The tables of :func:`divergence_tables` from run files (run.h5)."""
    from bitdrift.studies.variance.stats import _check_group, _groups, read_run

    runs = [read_run(path) for path in paths]
    if not runs:
        raise StudyError("no run files given")
    groups = _groups(runs)
    for members in groups.values():
        _check_group(members)
    return divergence_tables(groups, k)


def divergence_tables(groups: dict, k: int = 16) -> dict[str, pd.DataFrame]:
    """The per-example, overlap, group-share and subset-accuracy tables.

    ``groups`` maps (plan, arm, scope) to its run dicts (as stats._groups gives them,
    checked); groups of fewer than two runs have no divergence and are left out.
    """
    measures = {key: _group_measures(members) for key, members in groups.items()
                if len(members) >= 2}
    example_rows, share_rows, subset_rows = [], [], []
    for (plan, arm, scope), m in measures.items():
        members = groups[(plan, arm, scope)]
        labels = members[0]["labels"]
        example_rows.append(pd.DataFrame({
            "plan": plan, "arm": arm, "scope": scope, "example": np.arange(len(labels)),
            "label": labels, "divergence": m["divergence"], "label_entropy": m["label_entropy"],
            "sd_true_probability": m["sd_true_probability"],
            "majority_correct": m["majority_correct"], "runs": len(members),
            "majority_label": m["majority_label"],
            "majority_confidence": m["majority_confidence"],
            "predicted_labels": _predicted_labels(m["predictions"])}))
        divergent = m["divergence"] > 0
        share_rows += _group_shares(plan, arm, scope, members[0], divergent)
        subset_rows.append({"plan": plan, "arm": arm, "scope": scope, "runs": len(members),
                            "k": k, **held_out_subset_accuracy(m["probabilities"], labels,
                                                               k)})
    examples = (pd.concat(example_rows, ignore_index=True) if example_rows
                else pd.DataFrame(columns=EXAMPLE_COLUMNS + EXAMPLE_EXTRA_COLUMNS))
    return {"examples": examples[EXAMPLE_COLUMNS + EXAMPLE_EXTRA_COLUMNS],
            "overlap": pd.DataFrame(_overlap_rows(measures, groups, k),
                                    columns=OVERLAP_COLUMNS),
            "groups": pd.DataFrame(share_rows, columns=GROUP_SHARE_COLUMNS),
            "subset": pd.DataFrame(subset_rows, columns=SUBSET_COLUMNS)}


def _group_shares(plan, arm, scope, run: dict, divergent: np.ndarray) -> list[dict]:
    """Per class (and per sub-group where the dataset has attributes): how many of the
    divergent examples fall in it, and how often its examples diverge."""
    masks = [("class", str(label), run["labels"] == label)
             for label in range(run["classes"])]
    if "attributes" in run:
        for column, name in enumerate(run["attribute_names"]):
            masks.append(("subgroup", name, run["attributes"][:, column] == 1))
            masks.append(("subgroup", f"not {name}", run["attributes"][:, column] == 0))
    total = int(divergent.sum())
    rows = []
    for kind, group, mask in masks:
        if not mask.any():
            continue
        hits = int((divergent & mask).sum())
        rows.append({"plan": plan, "arm": arm, "scope": scope, "kind": kind, "group": group,
                     "examples": int(mask.sum()), "divergent_examples": hits,
                     "share_of_divergent": hits / total if total else float("nan"),
                     "divergent_rate": hits / int(mask.sum())})
    return rows


def _name(key) -> str:
    plan, arm, scope = key
    return f"{plan}/{arm}/{scope}"


def _overlap_rows(measures: dict, groups: dict, k: int) -> list[dict]:
    """Pairs of groups on the same test set: arms of a plan (per scope), devices of an arm
    (per-device scopes), and across plans of one model (IMPL from one plan against ALGO
    from another: on one CPU, implementation noise is only found across devices)."""
    pairs = []
    keys = list(measures)
    for a, b in itertools.combinations(keys, 2):
        same_plan = a[0] == b[0]
        if same_plan and a[2] == b[2] and a[1] != b[1]:
            pairs.append(("arms", a, b))
        elif same_plan and a[1] == b[1] and "all" not in (a[2], b[2]):
            pairs.append(("devices", a, b))
        elif not same_plan and _overall(a, keys) and _overall(b, keys):
            first, second = groups[a][0], groups[b][0]
            if first["study"] == second["study"] == "plan" and \
                    first["model"] == second["model"] and \
                    first["dataset_sha256"] == second["dataset_sha256"]:
                pairs.append(("plans", a, b))
    rows = []
    for comparison, a, b in pairs:
        if len(measures[a]["divergence"]) != len(measures[b]["divergence"]):
            raise StudyError(f"{_name(a)} and {_name(b)}: different test sets")
        rho, p_value = rank_correlation(measures[a]["divergence"], measures[b]["divergence"])
        rows.append({"plan": a[0] if a[0] == b[0] else f"{a[0]} vs {b[0]}",
                     "comparison": comparison, "a": _name(a), "b": _name(b), "k": k,
                     "divergent_a": int((measures[a]["divergence"] > 0).sum()),
                     "divergent_b": int((measures[b]["divergence"] > 0).sum()),
                     "top_k_jaccard": top_k_jaccard(measures[a]["divergence"],
                                                    measures[b]["divergence"], k),
                     "spearman_rho": rho, "spearman_p": p_value,
                     "examples": len(measures[a]["divergence"])})
    return rows


def _overall(key, keys) -> bool:
    """The group that stands for its (plan, arm): `all` devices, or its only device."""
    plan, arm, scope = key
    return scope == "all" or (plan, arm, "all") not in keys


# -- the gallery ----------------------------------------------------------------------------
def gallery(examples: pd.DataFrame, dataset_path, plan: str, arm: str | None = None,
            k: int = 16) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray, str]:
    """The k most divergent examples of one group of ``plan`` with their test images.

    ``arm`` None picks the arm with the most divergent examples. The group is the plan's
    all-devices scope where it has one, else its only device. Returns (the group's rows,
    the k rows shown, their images, title); the rows shown (and images) are empty when no
    example diverges. The images are the
    dataset file's test images at the rows' indices; labels are checked against it.
    """
    from bitdrift.inputs.datasets import read_test_images

    rows = examples[examples["plan"] == plan]
    if rows.empty:
        raise StudyError(f"plan {plan!r} has no per-example divergence (plans with two "
                         f"runs or more: {sorted(examples['plan'].unique())})")
    if arm is None:
        divergent = rows[rows["divergence"] > 0].groupby("arm").size()
        arm = divergent.idxmax() if not divergent.empty else rows["arm"].iloc[0]
    rows = rows[rows["arm"] == arm]
    if rows.empty:
        raise StudyError(f"plan {plan!r} has no arm {arm!r} with two runs or more")
    scope = "all" if (rows["scope"] == "all").any() else rows["scope"].iloc[0]
    rows = rows[rows["scope"] == scope].reset_index(drop=True)
    chosen = top_k(rows["divergence"].to_numpy(), k, rows["label_entropy"].to_numpy(),
                   rows["majority_confidence"].to_numpy())
    title = f"{plan} / {arm} / {scope}: {int(rows['runs'].iloc[0])} runs"
    picked = rows.iloc[chosen].reset_index(drop=True)
    if picked.empty:
        return rows, picked, np.empty((0,)), title
    images = read_test_images(dataset_path, picked["example"].astype(int).tolist())
    import h5py

    with h5py.File(dataset_path, "r") as handle:
        labels = np.asarray([handle["y_test"][i] for i in picked["example"].astype(int)])
    if not np.array_equal(labels, picked["label"].to_numpy()):
        raise StudyError(f"{dataset_path}: test labels at the gallery's examples differ from "
                         "those recorded in the run files: not the runs' test set")
    return rows, picked, images, title


@outputs_together
def write_example_tables(files, out_dir, top_k=16) -> None:
    """Per-example divergence, its overlap between arms/devices/plans, its share per class
    and sub-group, and the runs' accuracy on the most divergent examples, from run files."""
    from bitdrift.atomic import write_tables
    from bitdrift.studies.variance.examples import example_tables
    from bitdrift.studies.variance.paths import EXAMPLE_TABLES

    tables = example_tables(files, top_k)
    write_tables(tables, EXAMPLE_TABLES, out_dir)
    divergent = tables["examples"][tables["examples"]["divergence"] > 0]
    print(f"bitdrift: {len(divergent)} divergent (group, example) pairs in "
          f"{len(tables['subset'])} groups -> {out_dir}", file=sys.stderr)
