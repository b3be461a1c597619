"""Training-variance runs: the refusal to train a GPU device on the CPU."""

import pytest

from bitdrift.errors import AcceleratorMissing, TrainingRunError
from bitdrift.inputs.datasets import prepare_dataset
from bitdrift.studies.variance.plans import ARMS
from bitdrift.studies.variance.runs import train_run


def test_gpu_device_without_gpu_fails_and_writes_nothing(tmp_path):
    dataset = tmp_path / "digits.h5"
    prepare_dataset("digits", {"source": "digits", "limit_train": 64, "limit_test": 8}, dataset)
    plan = {"study": "plan", "model": "small", "seed": 0, "runs": 1,
            "spec": {"architecture": "small_cnn", "dataset": "digits", "epochs": 1,
                     "batch_size": 32, "optimizer": "adam", "learning_rate": 0.001,
                     "momentum": 0.0, "augmentation": {}},
            "arms": {"control": ARMS["control"]}}
    log = tmp_path / "train.log"
    with open(log, "w") as handle, pytest.raises(AcceleratorMissing, match="refusing to fall back"):
        train_run(plan_name="p", plan=plan, arm="control", device_name="gpu0",
                  device={"accelerator": "gpu", "backend": "tensorflow", "threads": 1},
                  run=0, dataset_path=dataset, out_dir=tmp_path / "run", log=handle)
    assert "refusing to fall back to the CPU" in log.read_text()
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    with pytest.raises(TrainingRunError, match="runs 0..0"):
        train_run(plan_name="p", plan=plan, arm="control", device_name="cpu",
                  device={"accelerator": "cpu", "backend": "tensorflow"}, run=1,
                  dataset_path=dataset, out_dir=tmp_path / "run")
