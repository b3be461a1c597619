"""Training runs: augmentation, loss, and the refusal to train a GPU device on the CPU."""

import numpy as np
import pytest

from bitdrift.datasets import prepare_dataset
from bitdrift.variance_plans import ARMS
from bitdrift.variance_training import TrainingRunError, augment, cross_entropy, train_run


def test_augmentation_is_seeded_crop_and_flip():
    images = np.arange(2 * 4 * 4 * 1, dtype=np.float32).reshape(2, 4, 4, 1)
    first = augment(images, np.random.default_rng(5), crop=1, flip=True)
    again = augment(images, np.random.default_rng(5), crop=1, flip=True)
    other = [augment(images, np.random.default_rng(seed), crop=1, flip=True)
             for seed in range(6, 12)]
    np.testing.assert_array_equal(first, again)
    assert any(not np.array_equal(first, o) for o in other)
    assert first.shape == images.shape
    flipped = augment(images[:1], np.random.default_rng(0), crop=0, flip=True)
    assert np.array_equal(flipped[0], images[0]) or np.array_equal(flipped[0], images[0, :, ::-1])
    np.testing.assert_array_equal(augment(images, np.random.default_rng(0), 0, False), images)


def test_cross_entropy_of_logits():
    logits = np.array([[0.0, np.log(3.0)], [2.0, 2.0]], dtype=np.float32)
    # softmax: [1/4, 3/4] and [1/2, 1/2]
    assert cross_entropy(logits, np.array([1, 0])) == pytest.approx(
        -(np.log(0.75) + np.log(0.5)) / 2, rel=1e-6)


def test_gpu_device_without_gpu_fails_and_writes_nothing(tmp_path):
    dataset = tmp_path / "digits.h5"
    prepare_dataset("digits", {"source": "digits", "limit_train": 64, "limit_test": 8}, dataset)
    plan = {"study": "plan", "model": "small", "seed": 0, "runs": 1,
            "spec": {"architecture": "small_cnn", "dataset": "digits", "epochs": 1,
                     "batch_size": 32, "optimizer": "adam", "learning_rate": 0.001,
                     "momentum": 0.0, "augmentation": {}},
            "arms": {"control": ARMS["control"]}}
    log = tmp_path / "train.log"
    with open(log, "w") as handle, pytest.raises(TrainingRunError, match="training failed"):
        train_run(plan_name="p", plan=plan, arm="control", device_name="gpu0",
                  device={"accelerator": "gpu", "backend": "tensorflow", "threads": 1},
                  run=0, dataset_path=dataset, out_dir=tmp_path / "run", log=handle)
    assert "refusing to fall back to the CPU" in log.read_text()
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
    with pytest.raises(TrainingRunError, match="runs 0..0"):
        train_run(plan_name="p", plan=plan, arm="control", device_name="cpu",
                  device={"accelerator": "cpu", "backend": "tensorflow"}, run=1,
                  dataset_path=dataset, out_dir=tmp_path / "run")
