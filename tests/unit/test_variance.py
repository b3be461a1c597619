"""Training-variance measures on hand-made predictions, plan resolution, run-file checks."""

import math

import h5py
import numpy as np
import pandas as pd
import pytest

from bitdrift.config import ConfigError, validate_config
from bitdrift.errors import StudyError
from bitdrift.studies.variance.plans import arm_switches, plan_runs, resolve_plans, run_seeds
from bitdrift.studies.variance.stats import (
    binary_rates,
    churn,
    determinism_cost,
    disagreement,
    normalised_weight_distance,
    per_class_accuracy,
    seed_ratio,
    training_tables,
)
from tests.utils import write_run


def test_churn_is_the_fraction_that_differs_averaged_over_pairs():
    predictions = np.array([[0, 1, 2, 3], [0, 1, 2, 0], [1, 1, 2, 0]])
    # pairs (0,1): 1/4, (0,2): 2/4, (1,2): 1/4
    assert churn(predictions) == pytest.approx((0.25 + 0.5 + 0.25) / 3)
    assert churn(np.array([[4, 5, 6], [4, 5, 6]])) == 0.0  # agreement would give 1
    assert math.isnan(churn(predictions[:1]))


def test_weight_distance_normalises_each_vector_to_unit_length():
    # Same direction, different scale: distance 0 (unnormalised it would be 5).
    assert normalised_weight_distance([np.array([3.0, 4.0]), np.array([6.0, 8.0])]) == 0.0
    # Orthogonal unit directions: sqrt(2), whatever the lengths.
    assert normalised_weight_distance([np.array([5.0, 0.0]), np.array([0.0, 0.1])]) == \
        pytest.approx(math.sqrt(2))
    three = [np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([2.0, 0.0])]
    assert normalised_weight_distance(three) == pytest.approx(2 * math.sqrt(2) / 3)
    with pytest.raises(StudyError, match="all zero"):
        normalised_weight_distance([np.zeros(2), np.ones(2)])


def test_per_class_accuracy_and_its_spread():
    labels = np.array([0, 0, 1, 1, 1, 3])
    run_a = np.array([0, 1, 1, 1, 0, 3])
    run_b = np.array([0, 0, 1, 0, 0, 0])
    a, b = per_class_accuracy(run_a, labels, 4), per_class_accuracy(run_b, labels, 4)
    np.testing.assert_allclose(a, [0.5, 2 / 3, np.nan, 1.0])
    np.testing.assert_allclose(b, [1.0, 1 / 3, np.nan, 0.0])
    spread = np.std(np.stack([a, b])[:, [0, 1, 3]], axis=0, ddof=1)
    np.testing.assert_allclose(spread, [0.5 / math.sqrt(2), (1 / 3) / math.sqrt(2),
                                                   1 / math.sqrt(2)])


def test_fpr_and_fnr_are_defined_on_the_true_class():
    labels = np.array([1, 1, 0, 0, 0])
    predictions = np.array([1, 0, 1, 0, 0])  # TP 1, FN 1, FP 1, TN 2
    rates = binary_rates(predictions, labels)
    assert rates == pytest.approx({"accuracy": 3 / 5, "fpr": 1 / 3, "fnr": 1 / 2})
    only_negatives = binary_rates(np.array([1, 0]), np.array([0, 0]))
    assert only_negatives["fpr"] == 0.5 and math.isnan(only_negatives["fnr"])


def test_disagreement_counts_examples_where_members_are_not_unanimous():
    assert disagreement(np.array([[0, 1, 2], [0, 1, 1], [0, 1, 2]])) == pytest.approx(1 / 3)
    assert disagreement(np.array([[0, 1], [0, 1], [0, 1]])) == 0.0


def test_arms_resolve_to_explicit_switches_and_seeds():
    assert arm_switches("impl", {}, True)["deterministic"] is False
    assert arm_switches("same", {}, True)["deterministic"] is True  # the plan's setting
    assert arm_switches("control", {"data_order": "per_run"}, False)["data_order"] == "per_run"
    with pytest.raises(ValueError, match="must set"):
        arm_switches("mine", {"init": "fixed"}, False)
    algo = arm_switches("algo", {}, False)
    assert run_seeds(algo, 7, 3) == {"init_seed": 10, "data_order_seed": 10,
                                     "augmentation_seed": 10, "dropout_seed": 10}
    assert set(run_seeds(arm_switches("control", {}, False), 7, 3).values()) == {7}
    different = [run_seeds(arm_switches("different", {}, False), 5, r)["init_seed"]
                 for r in range(4)]
    assert different == [5, 6, 7, 8]  # Morin & Willetts: seeds s..s+N-1


def _config(**variance):
    return {"datasets": {"d": {"source": "digits"}},
            "models": {"m": {"architecture": "cifar10_small", "dataset": "d"}},
            "devices": {"cpu": {"accelerator": "cpu", "backend": "tensorflow"},
                        "far": {"accelerator": "cpu", "backend": "torch", "external": True}},
            "training_variance": {"models": {"small": {"architecture": "small_cnn",
                                                       "dataset": "d"}}, **variance}}


def test_plans_from_config_one_run_per_job():
    config = validate_config(_config(
        plans={"noise": {"model": "small", "runs": 2, "devices": ["cpu"],
                         "arms": {"algo_impl": None, "control": {}}}},
        ensemble={"model": "small", "learning_rates": [0.01, 0.1], "devices": ["cpu"]}))
    plans = resolve_plans(config)
    assert set(plans) == {"noise", "ensemble_lr_0.01_momentum_0", "ensemble_lr_0.1_momentum_0"}
    ensemble = plans["ensemble_lr_0.1_momentum_0"]
    assert ensemble["spec"]["optimizer"] == "sgd" and ensemble["spec"]["momentum"] == 0.0
    assert ensemble["spec"]["learning_rate"] == 0.1 and ensemble["runs"] == 3
    assert len(ensemble["arms"]) == 8  # {fixed, random} init x batches x {default, det} ops
    assert ensemble["arms"]["fixed_init_random_batches_deterministic"] == {
        "init": "fixed", "data_order": "per_run", "augmentation": "fixed", "dropout": "fixed",
        "deterministic": True}
    runs = plan_runs(plans)
    assert ("noise", "control", "cpu", 1) in runs and len(runs) == 4 + 2 * 8 * 3


def test_momentum_gets_a_plan_at_the_matched_effective_step():
    """SGD with momentum m steps lr / (1 - m): at lr 0.05 and m 0.9 that is 0.5, ten times
    plain SGD's. The matched plan runs m 0.9 at 0.05 x 0.1 = 0.005 (step 0.05)."""
    config = validate_config(_config(ensemble={
        "model": "small", "learning_rates": [0.05], "momentum": [0.0, 0.9],
        "deterministic": [False], "devices": ["cpu"]}))
    plans = resolve_plans(config)
    assert set(plans) == {"ensemble_lr_0.05_momentum_0", "ensemble_lr_0.05_momentum_0.9",
                          "ensemble_lr_0.005_momentum_0.9"}
    matched = plans["ensemble_lr_0.005_momentum_0.9"]["spec"]
    assert matched["learning_rate"] / (1 - matched["momentum"]) == pytest.approx(0.05)
    config["training_variance"]["ensemble"]["matched_step"] = False
    assert "ensemble_lr_0.005_momentum_0.9" not in resolve_plans(config)


@pytest.mark.parametrize(("change", "key"), [
    ({"plans": {"p": {"model": "nope", "runs": 2, "devices": ["cpu"], "arms": {"algo": {}}}}},
     "training_variance.plans.p.model"),
    ({"plans": {"p": {"model": "small", "runs": 2, "devices": ["gpu9"], "arms": {"algo": {}}}}},
     "training_variance.plans.p.devices"),
    ({"plans": {"p": {"model": "small", "runs": 2, "devices": ["far"], "arms": {"algo": {}}}}},
     "training_variance.plans.p.devices"),
    ({"plans": {"p": {"model": "small", "runs": 2, "devices": ["cpu"],
                      "arms": {"mine": {"init": "fixed"}}}}},
     "training_variance.plans.p.arms.mine"),
    ({"plans": {"p": {"model": "small", "runs": 2, "devices": ["cpu"],
                      "arms": {"algo": {"init": "sometimes"}}}}},
     "training_variance.plans.p.arms.algo.init"),
    ({"plans": {"p": {"model": "small", "runs": 0, "devices": ["cpu"], "arms": {"algo": {}}}}},
     "training_variance.plans.p.runs"),
])
def test_bad_plans_name_their_key(change, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(_config(**change))


def test_tables_from_run_files(tmp_path):
    labels = np.array([0, 1, 1, 0])
    det = {"init": "fixed", "data_order": "fixed", "augmentation": "fixed", "dropout": "fixed",
           "deterministic": True}
    files = [
        write_run(tmp_path / "s0.h5", arm="same", run=0, predictions=[0, 1, 1, 0], labels=labels,
                  weights=[1, 0], accuracy=0.80, loss=0.50, seconds=2.0),
        write_run(tmp_path / "s1.h5", arm="same", run=1, predictions=[0, 1, 1, 1], labels=labels,
                  weights=[1, 0.1], accuracy=0.82, loss=0.52, seconds=2.0),
        write_run(tmp_path / "d0.h5", arm="different", run=0, predictions=[1, 1, 1, 0],
                  labels=labels, weights=[0, 1], accuracy=0.80, loss=0.50, switches=det,
                  seconds=3.0),
        write_run(tmp_path / "d1.h5", arm="different", run=1, predictions=[0, 0, 1, 1],
                  labels=labels, weights=[1, 1], accuracy=0.84, loss=0.56, switches=det,
                  seconds=3.0),
    ]
    tables = training_tables(files)
    summary = tables["summary"].set_index("arm")
    assert summary.loc["same", "sd_accuracy"] == pytest.approx(np.std([0.80, 0.82], ddof=1))
    assert summary.loc["same", "churn"] == pytest.approx(0.25)
    assert summary.loc["different", "churn"] == pytest.approx(0.75)
    assert summary.loc["same", "distinct_outputs"] == 2
    ratio = tables["seed_ratio"].iloc[0]
    assert ratio["ratio_accuracy"] == pytest.approx(0.02 / 0.04)
    assert ratio["ratio_loss"] == pytest.approx(0.02 / 0.06)
    cost = tables["determinism_cost"].iloc[0]
    assert (cost["arm_default"], cost["arm_deterministic"]) == ("same", "different")
    assert cost["epoch_overhead"] == pytest.approx(0.5)
    # Zhuang et al. report deterministic time as a percentage of the default time
    assert cost["epoch_ratio"] == pytest.approx(1.5)
    assert cost["epoch_percent_of_default"] == pytest.approx(150.0)
    # two runs per arm: too few to bootstrap over runs, so no interval is drawn
    assert np.isnan(cost["epoch_ratio_low"]) and np.isnan(cost["step_ratio_high"])
    assert len(tables["runs"]) == 4 and tables["subgroups"].empty


def test_determinism_cost_interval_resamples_runs(tmp_path):
    """Three runs per arm. The default arm's epochs vary inside each run but every run has
    the same mean; the deterministic arm's runs differ from one another. The interval must
    follow the runs: between the slowest and fastest run's ratio, not collapsed to the
    ratio (as a bootstrap over one arm's pooled epochs, 9 equal-ish values, would be)."""
    det = {"init": "fixed", "data_order": "fixed", "augmentation": "fixed",
           "dropout": "fixed", "deterministic": True}
    files = []
    for run, (fast_epochs, slow_mean) in enumerate(zip(
            ([1.0, 0.5, 1.5], [1.0, 1.5, 0.5], [1.0, 1.0, 1.0]), (1.4, 2.0, 2.6), strict=True)):
        for arm, switches in (("fast", None), ("slow", det)):
            path = write_run(tmp_path / f"{arm}{run}.h5", arm=arm, run=run, predictions=[0, 1],
                             labels=[0, 1], weights=[1, 0], switches=switches)
            epochs = [9.0, *fast_epochs] if arm == "fast" else [9.0, slow_mean, slow_mean]
            with h5py.File(path, "r+") as handle:
                del handle["epoch_seconds"], handle["step_seconds"]
                handle["epoch_seconds"] = np.asarray(epochs)
                handle["step_seconds"] = np.asarray([epochs[1:]] * 2)
            files.append(path)
    cost = training_tables(files)["determinism_cost"].iloc[0]
    assert cost["runs_default"] == 3 and cost["runs_deterministic"] == 3
    # first epoch left out: run means 1.0 (default) and 1.4, 2.0, 2.6 (deterministic)
    assert cost["epoch_ratio"] == pytest.approx(2.0)
    low, high = cost["epoch_ratio_low"], cost["epoch_ratio_high"]
    assert 1.4 - 1e-9 <= low < 2.0 < high <= 2.6 + 1e-9
    assert high - low > 0.5  # the spread between runs, not that of one run's epochs


def test_determinism_cost_interval_brackets_the_ratio():
    from bitdrift.studies.variance.stats import ratio_of_statistic_interval

    slow, fast = [2.0, 2.4, 1.8, 2.2, 2.1], [1.0, 1.1, 0.9, 1.05, 1.0]
    low, high = ratio_of_statistic_interval(slow, fast, np.mean)
    assert low < np.mean(slow) / np.mean(fast) < high
    assert 1.5 < low and high < 2.8
    assert all(np.isnan(ratio_of_statistic_interval([2.0], fast, np.mean)))


def test_subgroup_rates_and_cross_device_scope(tmp_path):
    labels = np.array([1, 1, 0, 0])
    male = [[1], [0], [1], [0]]
    files = [write_run(tmp_path / f"{device}.h5", device=device, predictions=predictions,
                       labels=labels, weights=[1, 2], attributes=male)
             for device, predictions in (("cpu", [1, 0, 1, 0]), ("gpu", [1, 1, 0, 0]))]
    tables = training_tables(files)
    assert set(tables["summary"]["scope"]) == {"cpu", "gpu", "all"}
    across = tables["summary"].set_index("scope").loc["all"]
    assert across["runs"] == 2 and across["churn"] == pytest.approx(0.5)
    rows = tables["subgroups"].set_index(["scope", "group"])
    # cpu run on males (examples 0, 2): TP on 0, FP on 2 -> FPR 1, FNR 0
    assert rows.loc[("cpu", "Male"), "mean_fpr"] == 1.0
    assert rows.loc[("cpu", "not Male"), "mean_fnr"] == 1.0
    assert rows.loc[("all", "Male"), "sd_fpr"] == pytest.approx(np.std([1.0, 0.0], ddof=1))


def test_mismatched_or_corrupt_runs_are_refused_by_name(tmp_path):
    good = write_run(tmp_path / "a.h5", predictions=[0, 1], labels=[0, 1], weights=[1, 0])
    other = write_run(tmp_path / "b.h5", run=1, predictions=[0, 1], labels=[1, 0],
                      weights=[1, 0])
    with pytest.raises(StudyError, match="b.h5"):
        training_tables([good, other])
    broken = tmp_path / "c.h5"
    broken.write_bytes(b"not hdf5")
    with pytest.raises(StudyError, match="c.h5"):
        training_tables([good, broken])
    with h5py.File(tmp_path / "d.h5", "w") as handle:
        handle["logits"] = np.zeros((2, 2))
    with pytest.raises(StudyError, match="d.h5: not a bitdrift run file"):
        training_tables([tmp_path / "d.h5"])


def test_seed_ratio_and_cost_need_their_pairs():
    summary = pd.DataFrame([{"plan": "p", "scope": "cpu", "arm": "same", "runs": 2,
                             "sd_accuracy": 0.1, "sd_loss": 0.1}])
    assert seed_ratio(summary).empty
    lone = pd.DataFrame([{"plan": "p", "scope": "cpu", "arm": "impl", "deterministic": False,
                          "init": "fixed", "data_order": "fixed", "augmentation": "fixed",
                          "dropout": "fixed", "model": "m", "mean_epoch_seconds": 1.0,
                          "median_step_seconds": 0.1}])
    assert determinism_cost(lone).empty


def test_runs_with_a_fixed_init_but_other_initial_weights_are_refused(tmp_path):
    """A fixed init seed is a claim that the initial weights are the same; the run files'
    digests decide it (before the fix, TF and torch runs of one seed were compared as
    'same init' while their initial weights were unrelated)."""
    common = {"arm": "control", "predictions": [0, 1], "labels": [0, 1], "weights": [1, 0]}
    same = [write_run(tmp_path / "tf.h5", device="tf", **common),
            write_run(tmp_path / "torch.h5", device="torch", **common)]
    assert training_tables(same)["summary"]["runs"].max() == 2
    other = write_run(tmp_path / "torch_other.h5", device="torch", init_sha256="f" * 64,
                      **common)
    with pytest.raises(StudyError, match=r"torch_other\.h5: arm 'control' fixes the init seed"):
        training_tables([same[0], other])
    per_run = {"init": "per_run", "data_order": "fixed", "augmentation": "fixed",
               "dropout": "fixed", "deterministic": False}
    different = [write_run(tmp_path / f"r{run}.h5", run=run, switches=per_run, **common)
                 for run in (0, 1)]
    assert training_tables(different)["summary"]["runs"].max() == 2  # digests may differ


def test_fixed_dropout_across_backends_is_refused():
    config = _config(
        models={"small": {"architecture": "small_cnn", "dataset": "d", "dropout": 0.5}},
        plans={"p": {"model": "small", "runs": 2, "arms": {"control": {}},
                     "devices": ["cpu", "torch"]}})
    config["devices"]["torch"] = {"accelerator": "cpu", "backend": "torch"}
    with pytest.raises(ConfigError, match="dropout masks differ"):
        validate_config(config)
    config["training_variance"]["plans"]["p"]["arms"] = {"algo": {}}  # dropout per run
    validate_config(config)


def test_degenerate_groups_are_flagged_not_drawn_as_findings(tmp_path):
    from bitdrift.studies.variance.stats import degenerate

    assert degenerate(0.12, 0.01, classes=10) == "at chance"
    assert degenerate(0.6, 0.33, classes=10) == "unstable"
    assert degenerate(0.9, 0.02, classes=10) == ""
    labels = np.arange(10) % 10
    files = [write_run(tmp_path / f"r{run}.h5", run=run, predictions=np.zeros(10, int),
                       labels=labels, weights=[1, run], accuracy=0.1) for run in (0, 1)]
    assert training_tables(files)["summary"]["flag"].eq("at chance").all()


def test_seed_ratio_interval_brackets_the_ratio():
    from bitdrift.studies.variance.stats import ratio_interval

    rng = np.random.default_rng(3)
    same, different = rng.normal(0.8, 0.01, 12), rng.normal(0.8, 0.03, 12)
    ratio = np.std(same, ddof=1) / np.std(different, ddof=1)
    low, high = ratio_interval(same, different)
    assert low <= ratio <= high and 0 < low < high
    assert ratio_interval(np.full(4, 0.7), different[:4]) == (0.0, 0.0)  # no spread: 0
    assert all(np.isnan(ratio_interval([0.5], different)))


def test_determinism_cost_names_the_model_timed_and_how_well_it_learned(tmp_path):
    """Each cost row carries the plan's architecture and kernel size (from the run files'
    spec) and each arm's mean test accuracy, and the figure shows them: a model that
    learned nothing (issue 64: kernel 1 at 27-35 %) is seen on the row that times it."""
    from bitdrift.studies.variance.figures import plot_determinism_cost
    from tests.utils import figure_text

    spec = {"architecture": "medium_cnn", "kernel_size": 3, "width": 0.25}
    det = {"init": "fixed", "data_order": "fixed", "augmentation": "fixed",
           "dropout": "fixed", "deterministic": True}
    labels = [0, 1, 1, 0]
    files = [write_run(tmp_path / "fast.h5", plan="kernel_3", arm="algo_impl", spec=spec,
                       predictions=[0, 1, 1, 0], labels=labels, weights=[1, 0]),
             write_run(tmp_path / "slow.h5", plan="kernel_3", arm="algo", spec=spec,
                       predictions=[0, 1, 0, 0], labels=labels, weights=[1, 0], switches=det,
                       seconds=2.0)]
    cost = training_tables(files)["determinism_cost"]
    row = cost.iloc[0]
    assert (row["architecture"], row["kernel_size"]) == ("medium_cnn", 3)
    # accuracies counted by hand: 4 of 4 and 3 of 4 predictions equal the labels
    assert (row["accuracy_default"], row["accuracy_deterministic"]) == (1.0, 0.75)
    text = figure_text(plot_determinism_cost, cost, folder=tmp_path)
    assert "kernel_3 on cpu: small (medium_cnn, 3x3 convolutions)" in text
    assert "ALGO vs ALGO+IMPL: test accuracy 75 % vs 100 %; n = 1 + 1 runs" in text
    assert "Nothing to show" in figure_text(plot_determinism_cost, cost.iloc[:0],
                                            folder=tmp_path)


def test_spread_figures_name_the_devices_of_a_cross_device_row(tmp_path):
    """A row pooling a plan's devices names them ("devices: CONTROL" named none); with no
    group of two runs the title says there is nothing to show."""
    from bitdrift.studies.variance.figures import plot_churn
    from tests.utils import figure_text

    common = {"arm": "control", "plan": "devices", "labels": [0, 1], "weights": [1, 0]}
    files = [write_run(tmp_path / f"{device}.h5", device=device, predictions=predictions,
                       **common)
             for device, predictions in (("tf_a", [0, 1]), ("tf_b", [1, 1]))]
    summary = training_tables(files)["summary"]
    text = figure_text(plot_churn, summary, folder=tmp_path)
    assert "devices: CONTROL on 2 devices:\ntf_a, tf_b" in text
    assert "Nothing to show" not in text
    alone = summary[summary["scope"] != "all"]  # one run per group: no spread
    assert "Nothing to show" in figure_text(plot_churn, alone, folder=tmp_path)
    from bitdrift.studies.variance.figures import plot_ensemble_disagreement

    assert "Nothing to show: no ensemble" in figure_text(plot_ensemble_disagreement, summary,
                                                         folder=tmp_path)
