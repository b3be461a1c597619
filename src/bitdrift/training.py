"""Training one model with one seed: real Keras training with seed and determinism control."""

from __future__ import annotations

import csv
import time
from pathlib import Path

import h5py
import numpy as np

from bitdrift.atomic import atomic_output
from bitdrift.datasets import dataset_classes, read_dataset


def train_model(*, spec: dict, seed: int, dataset_path: str | Path, out_model: str | Path,
                out_history: str | Path, out_logits: str | Path, threads: int | None = None,
                log=None) -> None:
    """Train ``spec`` (a config model entry) with ``seed``; write model, history and logits.

    Seeds: keras.utils.set_random_seed seeds Python's random, NumPy and the backend, which
    covers weight init, the per-epoch shuffle of fit() and dropout. The data arrive in the
    dataset's recorded fixed order (seed 42). ``deterministic`` switches the backend's own
    op determinism on.
    """
    from bitdrift.devices import configure_determinism, configure_threads, import_keras
    from bitdrift.models import build_model

    settings = spec["train"]
    backend = settings["backend"]
    keras = import_keras(backend)
    configure_threads(backend, threads)
    configure_determinism(backend, settings["deterministic"])
    keras.utils.set_random_seed(seed)

    data = read_dataset(dataset_path)
    order = data["train_order"]
    x_train, y_train = data["x_train"][order], data["y_train"][order]
    classes = dataset_classes(data)
    model = build_model(keras, spec, x_train.shape[1:], classes)
    optimizer = (keras.optimizers.Adam(settings["learning_rate"]) if settings["optimizer"] == "adam"
                 else keras.optimizers.SGD(settings["learning_rate"]))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    rows = []
    for epoch in range(settings["epochs"]):
        start = time.perf_counter()
        history = model.fit(x_train, y_train, batch_size=settings["batch_size"], epochs=1,
                            shuffle=True, verbose=0)
        seconds = time.perf_counter() - start
        loss, accuracy = model.evaluate(data["x_test"], data["y_test"], verbose=0,
                                        batch_size=256)
        rows.append({"epoch": epoch + 1, "loss": history.history["loss"][0],
                     "accuracy": history.history["accuracy"][0], "test_loss": loss,
                     "test_accuracy": accuracy, "seconds": seconds})
        if log is not None:
            print(f"epoch {epoch + 1}: {rows[-1]}", file=log, flush=True)

    logits = keras.ops.convert_to_numpy(model.predict(data["x_test"], batch_size=256, verbose=0))
    with atomic_output(out_model) as tmp:
        model.save(tmp)
    with atomic_output(out_history) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["epoch", "loss", "accuracy", "test_loss",
                                                    "test_accuracy", "seconds"])
        writer.writeheader()
        writer.writerows(rows)
    with atomic_output(out_logits) as tmp, h5py.File(tmp, "w") as handle:
        handle.create_dataset("logits", data=logits)
        handle.create_dataset("labels", data=data["y_test"])
        handle.attrs.update({"seed": seed, "backend": backend,
                             "deterministic": settings["deterministic"],
                             "test_accuracy": float(np.mean(logits.argmax(1) == data["y_test"]))})
