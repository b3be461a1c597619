"""One training run of a training-variance plan, in a fresh process on its device.

The parent (:func:`train_run`, called by the Snakemake job or ``bitdrift train-run``)
starts ``python -m bitdrift.variance_training JOB_JSON`` with the device's environment
(threads, oneDNN ISA, CUDA_VISIBLE_DEVICES), as inference does: a GPU device without a
GPU fails there, it never trains on the CPU instead.

Randomness, one seed per source (see bitdrift.variance_plans):
- init: ``keras.utils.set_random_seed`` (Python, NumPy and the backend's global seed)
  right before the model is built, so every initialiser draws from it;
- data order: a NumPy generator permuting the training set each epoch (fit's own shuffle
  is off);
- augmentation: a NumPy generator for random crops and flips (before each epoch);
- dropout: passed as the seed of the Dropout layer;
- op determinism: the backend's own switch (TF enable_op_determinism, torch
  use_deterministic_algorithms).

Outputs: ``model.keras``, ``history.csv`` (per epoch: loss, accuracy, test loss and
accuracy, seconds, mean step seconds) and ``run.h5`` (final test logits and labels, the
trained weights as one vector, per-step and per-epoch wall times, the seeds and device
fingerprint, and the test sub-group attributes when the dataset has them). The test
metrics are those of the final weights, taken from the logits stored with them.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from bitdrift.atomic import atomic_output
from bitdrift.variance_plans import STREAMS, run_seeds

RUN_FORMAT = 1


class TrainingRunError(RuntimeError):
    """A training run that failed; the message names the run and points at its log."""


def augment(images: np.ndarray, rng: np.random.Generator, crop: int, flip: bool) -> np.ndarray:
    """Random crop after zero padding by ``crop`` pixels, and random horizontal flips."""
    out = images
    if crop:
        padded = np.pad(images, ((0, 0), (crop, crop), (crop, crop), (0, 0)))
        offsets = rng.integers(0, 2 * crop + 1, size=(len(images), 2))
        height, width = images.shape[1:3]
        out = np.stack([padded[i, dy:dy + height, dx:dx + width]
                        for i, (dy, dx) in enumerate(offsets)])
    if flip:
        mirrored = rng.random(len(images)) < 0.5
        out = out.copy()
        out[mirrored] = out[mirrored, :, ::-1]
    return out


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Mean softmax cross-entropy of logits, in float64."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=1, keepdims=True)
    log_probabilities = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-log_probabilities[np.arange(len(labels)), labels].mean())


def _optimizer(keras, spec: dict):
    if spec["optimizer"] == "adam":
        return keras.optimizers.Adam(spec["learning_rate"])
    return keras.optimizers.SGD(spec["learning_rate"], momentum=spec["momentum"])


def _step_timer(keras):
    class StepTimer(keras.callbacks.Callback):
        """Wall time of every optimisation step (forward, backward, update)."""

        def __init__(self):
            super().__init__()
            self.seconds: list[float] = []

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds.append(time.perf_counter() - self._start)

    return StepTimer()


def run_worker(job: dict) -> None:
    """Inside the fresh process: train, then write model, history and run file."""
    from bitdrift.datasets import dataset_classes, read_dataset
    from bitdrift.devices import (
        check_accelerator,
        configure_determinism,
        configure_threads,
        fingerprint,
        import_keras,
        strategy_scope,
    )
    from bitdrift.models import build_model

    device, spec, switches = job["device"], job["spec"], job["switches"]
    seeds = run_seeds(switches, job["seed"], job["run"])
    keras = import_keras(device["backend"])
    configure_threads(device["backend"], device.get("threads"))
    configure_determinism(device["backend"], switches["deterministic"])
    accelerator = check_accelerator(job["device_name"], device)

    data = read_dataset(job["dataset_path"])
    x_train, y_train = data["x_train"], data["y_train"]
    classes = dataset_classes(data)
    keras.utils.set_random_seed(seeds["init_seed"])  # the global seed: nothing left unseeded
    with strategy_scope(accelerator):
        model = build_model(keras, spec, x_train.shape[1:], classes,
                            dropout_seed=seeds["dropout_seed"])
        model.compile(optimizer=_optimizer(keras, spec),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    order_rng = np.random.default_rng([seeds["data_order_seed"], STREAMS["data_order"]])
    augment_rng = np.random.default_rng([seeds["augmentation_seed"], STREAMS["augmentation"]])
    augmentation = spec.get("augmentation", {})

    rows, step_seconds = [], []
    for epoch in range(spec["epochs"]):
        if spec.get("lr_decay_every") and epoch and epoch % spec["lr_decay_every"] == 0:
            rate = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
            model.optimizer.learning_rate.assign(rate * spec["lr_decay_factor"])
        order = order_rng.permutation(len(x_train))
        images = augment(x_train[order], augment_rng, augmentation.get("crop", 0),
                         augmentation.get("flip", False))
        timer = _step_timer(keras)
        start = time.perf_counter()
        history = model.fit(images, y_train[order], batch_size=spec["batch_size"], epochs=1,
                            shuffle=False, verbose=0, callbacks=[timer])
        seconds = time.perf_counter() - start
        test_loss, test_accuracy = model.evaluate(data["x_test"], data["y_test"], verbose=0,
                                                  batch_size=256)
        step_seconds.append(timer.seconds)
        rows.append({"epoch": epoch + 1, "loss": history.history["loss"][0],
                     "accuracy": history.history["accuracy"][0], "test_loss": test_loss,
                     "test_accuracy": test_accuracy, "seconds": seconds,
                     "mean_step_seconds": float(np.mean(timer.seconds))})
        print(f"epoch {epoch + 1}: {rows[-1]}", file=sys.stderr, flush=True)

    logits = keras.ops.convert_to_numpy(model.predict(data["x_test"], batch_size=256, verbose=0))
    weights = np.concatenate([keras.ops.convert_to_numpy(w).ravel()
                              for w in model.trainable_weights])
    out = Path(job["out_dir"])
    with atomic_output(out / "model.keras") as tmp:
        model.save(tmp)
    with atomic_output(out / "history.csv") as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["epoch"])
        writer.writeheader()
        writer.writerows(rows)
    with atomic_output(out / "run.h5") as tmp, h5py.File(tmp, "w") as handle:
        handle.create_dataset("logits", data=logits)
        handle.create_dataset("labels", data=data["y_test"])
        handle.create_dataset("weights", data=weights, compression="gzip", compression_opts=1)
        steps = max((len(s) for s in step_seconds), default=0)
        handle.create_dataset("step_seconds", data=np.array(
            [s + [np.nan] * (steps - len(s)) for s in step_seconds], dtype=np.float64))
        handle.create_dataset("epoch_seconds", data=[r["seconds"] for r in rows])
        if "a_test" in data:
            handle.create_dataset("attributes", data=data["a_test"])
            handle.attrs["attribute_names"] = data["attrs"]["attribute_names"]
        handle.attrs.update({
            "format": RUN_FORMAT, "plan": job["plan"], "arm": job["arm"],
            "device": job["device_name"], "run": job["run"], "study": job["study"],
            "model": job["model"], "spec": json.dumps(spec, sort_keys=True),
            "learning_rate": spec["learning_rate"], "classes": classes,
            "switches": json.dumps(switches, sort_keys=True), "seeds": json.dumps(seeds),
            "deterministic": bool(switches["deterministic"]), "backend": device["backend"],
            "dataset": str(data["attrs"].get("name")),
            "dataset_sha256": str(data["attrs"].get("source_sha256")),
            "test_accuracy": float(np.mean(logits.argmax(1) == data["y_test"])),
            "test_loss": cross_entropy(logits, data["y_test"]),
            "fingerprint": json.dumps(fingerprint(device, accelerator)),
        })


def train_run(*, plan_name: str, plan: dict, arm: str, device_name: str, device: dict,
              run: int, dataset_path: str | Path, out_dir: str | Path, log=sys.stderr) -> None:
    """Train run ``run`` of ``arm`` of a resolved plan on ``device`` in a fresh process."""
    from bitdrift.devices import device_environment

    if arm not in plan["arms"]:
        raise TrainingRunError(f"plan {plan_name!r} has no arm {arm!r} ({sorted(plan['arms'])})")
    if not 0 <= run < plan.get("runs", run + 1):
        raise TrainingRunError(f"plan {plan_name!r} has runs 0..{plan['runs'] - 1}, not {run}")
    job = {"plan": plan_name, "arm": arm, "run": run, "seed": plan["seed"],
           "study": plan["study"], "model": plan["model"], "spec": plan["spec"],
           "switches": plan["arms"][arm], "device_name": device_name, "device": device,
           "dataset_path": str(dataset_path), "out_dir": str(out_dir)}
    print(f"bitdrift: {plan_name}/{arm} run {run} on {device_name} in a fresh process",
          file=log, flush=True)
    completed = subprocess.run([sys.executable, "-m", "bitdrift.variance_training",
                                json.dumps(job)], env=device_environment(device),
                               stdout=log, stderr=log)
    if completed.returncode != 0:
        raise TrainingRunError(f"plan {plan_name!r}, arm {arm!r}, device {device_name!r}, run "
                               f"{run}: training failed (exit {completed.returncode}); see log")


if __name__ == "__main__":
    run_worker(json.loads(sys.argv[1]))
