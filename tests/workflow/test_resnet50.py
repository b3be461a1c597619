"""The design's headline model end to end at its smallest: the real keras.applications
ResNet-50 trained 2 times with the same seed and 2 times with different seeds."""

import shutil

import h5py
import pandas as pd
import pytest

from tests.utils import ROOT, snakemake

pytestmark = pytest.mark.workflow


def test_resnet50_same_and_different_seeds(tmp_path):
    config = tmp_path / "config.yaml"
    shutil.copy(ROOT / "tests/config/resnet50.yaml", config)
    snakemake(tmp_path, "results/tables/seed_ratio.csv", configfile=config)
    summary = pd.read_csv(tmp_path / "results/tables/training_variance.csv").set_index("arm")
    assert summary.loc["same", "runs"] == 2 and summary.loc["different", "runs"] == 2
    assert summary.loc["same", "distinct_outputs"] == 1  # fixed seeds on a CPU: identical
    assert summary.loc["same", "sd_loss"] == 0
    assert summary.loc["different", "distinct_outputs"] == 2
    assert summary.loc["different", "sd_loss"] > 0
    ratio = pd.read_csv(tmp_path / "results/tables/seed_ratio.csv").iloc[0]
    assert ratio["ratio_loss"] == 0 and ratio["runs_same"] == 2
    run = tmp_path / "results/training/resnet50_seeds/same/torch_1thread/run_0/run.h5"
    with h5py.File(run) as handle:
        assert handle["weights"].shape[0] > 23_000_000  # ResNet-50's trainable weights
        assert handle["logits"].shape == (16, 10)
