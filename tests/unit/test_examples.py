"""Which examples the noise hits: per-example divergence, overlap, subset accuracy and the
gallery, on hand-made label matrices with known answers and real run/dataset files."""

import h5py
import numpy as np
import pytest

from bitdrift.errors import StudyError
from bitdrift.inputs.datasets import load_digits, write_dataset
from bitdrift.studies.variance.examples import (
    example_divergence,
    example_tables,
    gallery,
    held_out_subset_accuracy,
    rank_correlation,
    subset_accuracy,
    top_k,
    top_k_jaccard,
)
from bitdrift.studies.variance.figures import plot_divergent_examples
from tests.utils import write_run


def test_divergence_entropy_and_majority_by_hand():
    predictions = np.array([[0, 1, 2], [0, 1, 1], [0, 2, 1], [1, 1, 1]])
    measures = example_divergence(predictions, np.array([0, 2, 1]), classes=3,
                                  true_probabilities=np.array([[0.9, 0.5, 0.1],
                                                               [0.7, 0.5, 0.1],
                                                               [0.8, 0.5, 0.1],
                                                               [0.8, 0.5, 0.1]]))
    assert measures["divergence"].tolist() == [0.25, 0.25, 0.25]
    entropy = -(0.75 * np.log2(0.75) + 0.25 * np.log2(0.25))
    assert measures["label_entropy"] == pytest.approx([entropy] * 3)
    assert measures["majority_label"].tolist() == [0, 1, 1]
    assert measures["majority_correct"].tolist() == [True, False, True]
    assert measures["sd_true_probability"] == pytest.approx(
        [np.std([0.9, 0.7, 0.8, 0.8], ddof=1), 0.0, 0.0])


def test_a_tie_goes_to_the_lowest_label_with_one_bit_of_entropy():
    measures = example_divergence(np.array([[3], [1]]), np.array([1]), classes=4)
    assert measures["majority_label"].tolist() == [1]
    assert measures["divergence"].tolist() == [0.5] and measures["label_entropy"][0] == 1.0
    assert np.isnan(measures["sd_true_probability"][0])  # no probabilities given


def test_top_k_only_divergent_examples_ties_by_entropy_then_confidence():
    divergence = np.array([0.0, 0.5, 0.25, 0.5, 0.25])
    entropy = np.array([0.0, 1.0, 0.8, 1.5, 0.8])
    assert top_k(divergence, 2, entropy).tolist() == [3, 1]
    assert top_k(divergence, 10, entropy).tolist() == [3, 1, 2, 4]
    assert top_k(np.zeros(5), 3).size == 0
    # equal divergence and entropy (3 runs, 2 against 1): the less confident first
    tied = np.full(4, 1 / 3)
    confidence = np.array([0.9, 0.4, 0.7, 0.5])
    assert top_k(tied, 4, np.ones(4), confidence).tolist() == [1, 3, 2, 0]


def test_top_k_accuracy_is_measured_on_runs_that_did_not_choose_it():
    """Four runs: runs 0-1 choose the top-k (examples 0 and 1 diverge there), runs 2-3 are
    evaluated on it. Example 0 is right in both evaluated runs, example 1 in one: 3 of 4.
    Example 2 diverges only in the evaluated runs, so it is in the rest (1 of 2 right)."""
    labels = np.array([0, 1, 2, 3])
    predictions = np.array([[0, 1, 2, 3], [5, 6, 2, 3], [0, 1, 2, 3], [0, 6, 7, 3]])
    probabilities = np.eye(10)[predictions] * 0.9 + 0.01
    result = held_out_subset_accuracy(probabilities, labels, k=2)
    assert (result["selection"], result["selection_runs"], result["evaluation_runs"]) == (
        "held-out runs", 2, 2)
    assert result["subset_examples"] == 2
    assert result["accuracy_top_k"] == pytest.approx(3 / 4)
    assert result["accuracy_rest"] == pytest.approx((1 / 2 + 1) / 2)  # examples 2 and 3
    two = held_out_subset_accuracy(probabilities[:2], labels, k=2)
    assert two["selection"] == "conditioned on selection" and two["evaluation_runs"] == 2
    assert two["accuracy_top_k"] == pytest.approx(0.5)


def test_top_k_jaccard_and_rank_correlation():
    a = np.array([0.0, 0.5, 0.25, 0.5])
    b = np.array([0.5, 0.5, 0.0, 0.0])
    assert top_k_jaccard(a, b, 2) == pytest.approx(1 / 3)  # {1, 3} vs {0, 1}
    assert top_k_jaccard(a, a, 2) == 1.0
    assert top_k_jaccard(a, np.zeros(4), 2) == 0.0
    assert np.isnan(top_k_jaccard(np.zeros(4), np.zeros(4), 2))
    rho, _ = rank_correlation(a, a)
    assert rho == pytest.approx(1.0)
    assert np.isnan(rank_correlation(a, np.zeros(4))[0])


def test_subset_accuracy_is_the_runs_mean_accuracy_with_a_bootstrap_interval():
    correct = np.array([[1, 0, 1, 1, 0, 1], [1, 0, 0, 1, 1, 1]], dtype=bool)
    mean, low, high = subset_accuracy(correct, np.array([1, 2, 4]))
    # run 0: 1/3 right on the subset, run 1: 1/3 right -> 1/3
    assert mean == pytest.approx(1 / 3) and 0 <= low <= mean <= high <= 0.5
    assert subset_accuracy(correct, np.array([0, 3, 5])) == (1.0, 1.0, 1.0)
    assert all(np.isnan(subset_accuracy(correct, np.array([], dtype=int))))


def _runs(folder, plan, arm, predictions, labels, device="cpu"):
    return [write_run(folder / f"{plan}_{arm}_{device}_{run}.h5", plan=plan, arm=arm,
                      device=device, run=run, predictions=p, labels=labels,
                      weights=np.ones(4), classes=10,
                      switches={"init": "per_run", "data_order": "per_run",
                                "augmentation": "fixed", "dropout": "fixed",
                                "deterministic": False})
            for run, p in enumerate(predictions)]


@pytest.fixture
def digits_file(tmp_path):
    path = tmp_path / "digits.h5"
    write_dataset(load_digits(), "digits", "digits", path)
    with h5py.File(path, "r") as handle:
        labels = handle["y_test"][()]
    return path, labels


def test_tables_and_gallery_show_the_datasets_own_test_images(tmp_path, digits_file):
    path, labels = digits_file
    rng = np.random.default_rng(0)
    flipped = [5, 17, 40]  # the examples some runs get wrong
    predictions = np.tile(labels, (3, 1))
    predictions[1, flipped] = (labels[flipped] + 1) % 10
    predictions[2, flipped[0]] = (labels[flipped[0]] + 2) % 10
    impl = np.tile(labels, (3, 1))
    impl[1, rng.choice(len(labels), 4, replace=False)] = 0
    files = _runs(tmp_path, "noise", "algo", predictions, labels) + \
        _runs(tmp_path, "noise", "impl", impl, labels)
    tables = example_tables(files, k=2)
    examples = tables["examples"]
    algo = examples[examples["arm"] == "algo"].set_index("example")
    assert algo.loc[flipped[0], "divergence"] == pytest.approx(2 / 3)
    assert algo.loc[flipped[0], "predicted_labels"].count("x1") == 3
    assert (algo.drop(index=flipped)["divergence"] == 0).all()
    subset = tables["subset"].set_index("arm")
    assert subset.loc["algo", "subset_examples"] == 2
    # chosen on runs 0-1 (the three flipped examples tie; the first two by index), judged
    # on run 2, which gets flipped[0] wrong and flipped[1] right; the rest all right
    assert subset.loc["algo", "selection"] == "held-out runs"
    assert subset.loc["algo", "accuracy_top_k"] == pytest.approx(0.5)
    assert subset.loc["algo", "accuracy_rest"] == pytest.approx(1.0)
    overlap = tables["overlap"]
    assert overlap["comparison"].tolist() == ["arms"]
    classes = tables["groups"][(tables["groups"]["arm"] == "algo")]
    assert classes["divergent_examples"].sum() == len(flipped)
    assert classes["share_of_divergent"].sum() == pytest.approx(1.0)

    rows, picked, images, title = gallery(examples, path, "noise", None, k=16)
    assert picked["arm"].eq("algo").all() and len(rows) == len(labels)  # the most divergent
    assert picked["example"].tolist() == [flipped[0], flipped[1], flipped[2]]
    with h5py.File(path, "r") as handle:
        for image, example in zip(images, picked["example"], strict=True):
            assert np.array_equal(image, handle["x_test"][int(example)])
    out = tmp_path / "gallery.pdf"
    plot_divergent_examples(examples, path, out, "noise")
    assert out.stat().st_size > 0 and out.with_suffix(".png").exists()


def test_when_all_runs_agree_the_gallery_shows_no_images(tmp_path, digits_file):
    path, labels = digits_file
    files = _runs(tmp_path, "noise", "control", np.tile(labels, (3, 1)), labels)
    tables = example_tables(files)
    assert (tables["examples"]["divergence"] == 0).all()
    assert tables["subset"]["subset_examples"].tolist() == [0]
    _, picked, images, _ = gallery(tables["examples"], path, "noise")
    assert picked.empty and images.size == 0
    plot_divergent_examples(tables["examples"], path, tmp_path / "g.pdf", "noise")


def test_a_dataset_of_other_labels_is_refused_naming_it(tmp_path, digits_file):
    path, labels = digits_file
    wrong = (labels + 1) % 10
    predictions = np.tile(wrong, (2, 1))
    predictions[1, 0] = (wrong[0] + 1) % 10
    tables = example_tables(_runs(tmp_path, "noise", "algo", predictions, wrong))
    with pytest.raises(StudyError, match="digits.h5"):
        gallery(tables["examples"], path, "noise")
    with pytest.raises(StudyError, match="no per-example divergence"):
        gallery(tables["examples"], path, "other")
