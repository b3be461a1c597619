"""The one training loop: real Keras training with one seed per source of randomness.

Both the spine's trained models (`bitdrift train`, rule `train_model`) and every run of the
training-variance study (:mod:`bitdrift.studies.variance`) train here.

Randomness, one seed per source:
- init: the initial weights are drawn by :func:`draw_initial_weights` with NumPy from the
  init seed, so a fixed init seed gives the same initial weights on every backend and
  device (Keras' own initialisers draw from the backend's RNG: TensorFlow and torch give
  unrelated weights for one seed). ``keras.utils.set_random_seed`` is set as well, so
  nothing the backend still draws is left unseeded;
- data order: a NumPy generator permuting the training set each epoch (fit's own shuffle
  is off);
- augmentation: a NumPy generator for random crops and flips (before each epoch);
- dropout: the seed of the Dropout layer (drawn by the backend: the same masks on one
  backend, not across backends; plans refuse that combination);
- op determinism: the backend's own switch, set by the caller before Keras runs.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bitdrift.atomic import atomic_output
from bitdrift.errors import BitdriftError
from bitdrift.progress import progress

SOURCES = ("init", "data_order", "augmentation", "dropout")
# Separate NumPy streams, so that fixing one source never ties another.
STREAMS = {"data_order": 1, "augmentation": 2, "init": 3}
HISTORY_COLUMNS = ("epoch", "loss", "accuracy", "test_loss", "test_accuracy", "seconds",
                   "mean_step_seconds")
# Recipe defaults for entries that do not give them (the spine's `train:` section).
RECIPE_DEFAULTS = {"optimizer": "adam", "learning_rate": 1e-3, "momentum": 0.0,
                   "lr_decay_every": None, "lr_decay_factor": 0.1, "augmentation": {}}


class InitialisationError(BitdriftError):
    """A weight whose initialiser cannot be drawn independently of the backend."""


# -- backend-independent initial weights ----------------------------------------------------
def _fans(shape) -> tuple[float, float]:
    """Keras' fan-in and fan-out of a weight shape (kernels: receptive field x channels)."""
    if len(shape) < 1:
        return 1.0, 1.0
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    if len(shape) == 2:
        return float(shape[0]), float(shape[1])
    receptive = math.prod(shape[:-2])
    return float(shape[-2] * receptive), float(shape[-1] * receptive)


def _truncated_normal(rng, shape, mean: float, stddev: float) -> np.ndarray:
    """Normal values redrawn until within two standard deviations (Keras' truncation)."""
    values = rng.standard_normal(shape)
    outside = np.abs(values) > 2
    while outside.any():
        values[outside] = rng.standard_normal(int(outside.sum()))
        outside = np.abs(values) > 2
    return mean + stddev * values


def initial_values(keras, initializer, shape, rng: np.random.Generator) -> np.ndarray:
    """What ``initializer`` draws for ``shape``, drawn from ``rng`` (float64)."""
    init = keras.initializers
    shape = tuple(int(s) for s in shape)
    if isinstance(initializer, init.VarianceScaling):
        fan_in, fan_out = _fans(shape)
        divisor = {"fan_in": fan_in, "fan_out": fan_out,
                   "fan_avg": (fan_in + fan_out) / 2}[initializer.mode]
        scale = initializer.scale / max(1.0, divisor)
        if initializer.distribution == "truncated_normal":
            return _truncated_normal(rng, shape, 0.0, math.sqrt(scale) / 0.87962566103423978)
        if initializer.distribution == "untruncated_normal":
            return rng.normal(0.0, math.sqrt(scale), shape)
        limit = math.sqrt(3.0 * scale)
        return rng.uniform(-limit, limit, shape)
    if isinstance(initializer, init.Zeros):
        return np.zeros(shape)
    if isinstance(initializer, init.Ones):
        return np.ones(shape)
    if isinstance(initializer, init.Constant):
        return np.full(shape, float(initializer.value))
    if isinstance(initializer, init.RandomUniform):
        return rng.uniform(initializer.minval, initializer.maxval, shape)
    if isinstance(initializer, init.TruncatedNormal):
        return _truncated_normal(rng, shape, initializer.mean, initializer.stddev)
    if isinstance(initializer, init.RandomNormal):
        return rng.normal(initializer.mean, initializer.stddev, shape)
    raise InitialisationError(
        f"initialiser {type(initializer).__name__} has no backend-independent draw in "
        "bitdrift.run.training.initial_values; add it there")


def _sublayers_own_every_weight(layer) -> bool:
    own = [*getattr(layer, "_trainable_variables", []),
           *getattr(layer, "_non_trainable_variables", [])]
    subs = [sub for sub in layer._flatten_layers(include_self=False) if sub.weights]
    return bool(layer.weights) and not own and \
        sum(len(sub.weights) for sub in subs) == len(layer.weights)


def _layers(model):
    for layer in model.layers:
        if hasattr(layer, "layers") and layer.layers:  # a nested model
            yield from _layers(layer)
        elif _sublayers_own_every_weight(layer):
            # MultiHeadAttention's weights live in its query, key, value and output
            # projections, each with its own initialiser.
            yield from (sub for sub in layer._flatten_layers(include_self=False)
                        if sub.weights)
        else:
            yield layer


def draw_initial_weights(keras, model, seed: int) -> str:
    """Set every weight of ``model`` to values drawn with NumPy from ``seed``, each from
    its own layer's initialiser; return their SHA-256 (the same on every backend)."""
    rng = np.random.default_rng([seed, STREAMS["init"]])
    digest = hashlib.sha256()
    for layer in _layers(model):
        for variable in layer.weights:
            name = variable.name.split("/")[-1].split(":")[0]
            initializer = getattr(layer, f"{name}_initializer", None)
            if initializer is None:
                raise InitialisationError(
                    f"layer {layer.name!r} has no initialiser for its weight {name!r}")
            values = initial_values(keras, initializer, variable.shape, rng)
            values = values.astype(keras.backend.standardize_dtype(variable.dtype))
            variable.assign(values)
            digest.update(f"{tuple(values.shape)}|{values.dtype.str}\n".encode())
            digest.update(np.ascontiguousarray(values).tobytes())
    return digest.hexdigest()


# -- one training run -----------------------------------------------------------------------
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


def run_seeds(switches: dict, seed: int, run: int) -> dict:
    """The seed of each source of randomness in run ``run``: ``fixed`` sources take
    ``seed``, ``per_run`` ones ``seed + run``."""
    return {f"{source}_seed": seed if switches[source] == "fixed" else seed + run
            for source in SOURCES}


@dataclass
class TrainedModel:
    """A model after training, with what the run files record about it."""

    model: object
    history: list[dict]
    step_seconds: list[list[float]]
    logits: np.ndarray
    init_sha256: str
    weights: np.ndarray = field(repr=False)


def _optimizer(keras, recipe: dict):
    if recipe["optimizer"] == "adam":
        return keras.optimizers.Adam(recipe["learning_rate"])
    return keras.optimizers.SGD(recipe["learning_rate"], momentum=recipe["momentum"])


def _step_timer(keras, counted=None):
    class StepTimer(keras.callbacks.Callback):
        """Wall time of every optimisation step (forward, backward, update), each step
        counted by ``counted`` (a bitdrift.progress bar) if given."""

        def __init__(self):
            super().__init__()
            self.seconds: list[float] = []

        def on_train_batch_begin(self, batch, logs=None):
            self._start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.seconds.append(time.perf_counter() - self._start)
            if counted is not None:
                counted.update()

    return StepTimer()


def fit(keras, architecture: dict, recipe: dict, data: dict, classes: int, seeds: dict, *,
        scope=None, log=sys.stderr) -> TrainedModel:
    """Train ``architecture`` (a model entry for :func:`bitdrift.inputs.models.build_model`) with
    ``recipe`` (epochs, batch size, optimizer...) on ``data`` (:func:`read_dataset`);
    ``seeds`` from :func:`run_seeds`. Test metrics are those of the final weights."""
    from bitdrift.inputs.models import build_model

    recipe = {**RECIPE_DEFAULTS, **recipe}
    x_train, y_train = data["x_train"], data["y_train"]
    keras.utils.set_random_seed(seeds["init_seed"])  # nothing the backend draws is unseeded
    with scope or contextlib.nullcontext():
        model = build_model(keras, architecture, x_train.shape[1:], classes,
                            dropout_seed=seeds["dropout_seed"])
        init_sha256 = draw_initial_weights(keras, model, seeds["init_seed"])
        model.compile(optimizer=_optimizer(keras, recipe),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    order_rng = np.random.default_rng([seeds["data_order_seed"], STREAMS["data_order"]])
    augment_rng = np.random.default_rng([seeds["augmentation_seed"], STREAMS["augmentation"]])
    augmentation = recipe["augmentation"] or {}

    rows, step_seconds = [], []
    steps = -(-len(x_train) // recipe["batch_size"])
    for epoch in progress(range(recipe["epochs"]), "epochs done", file=log):
        if recipe["lr_decay_every"] and epoch and epoch % recipe["lr_decay_every"] == 0:
            rate = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
            model.optimizer.learning_rate.assign(rate * recipe["lr_decay_factor"])
        order = order_rng.permutation(len(x_train))
        images = augment(x_train[order], augment_rng, augmentation.get("crop", 0),
                         augmentation.get("flip", False))
        start = time.perf_counter()
        with progress(None, f"epoch {epoch + 1}: batches trained", total=steps,
                      file=log) as trained:
            timer = _step_timer(keras, trained)
            history = model.fit(images, y_train[order], batch_size=recipe["batch_size"],
                                epochs=1, shuffle=False, verbose=0, callbacks=[timer])
        seconds = time.perf_counter() - start
        test_loss, test_accuracy = model.evaluate(data["x_test"], data["y_test"], verbose=0,
                                                  batch_size=256)
        step_seconds.append(timer.seconds)
        rows.append({"epoch": epoch + 1, "loss": history.history["loss"][0],
                     "accuracy": history.history["accuracy"][0], "test_loss": test_loss,
                     "test_accuracy": test_accuracy, "seconds": seconds,
                     "mean_step_seconds": float(np.mean(timer.seconds))})
        print(f"epoch {epoch + 1}: {rows[-1]}", file=log, flush=True)

    logits = keras.ops.convert_to_numpy(model.predict(data["x_test"], batch_size=256, verbose=0))
    weights = np.concatenate([keras.ops.convert_to_numpy(w).ravel()
                              for w in model.trainable_weights])
    return TrainedModel(model=model, history=rows, step_seconds=step_seconds, logits=logits,
                        init_sha256=init_sha256, weights=weights)


def save_model_and_history(trained: TrainedModel, model_path, history_path) -> None:
    """The trained model (.keras) and its per-epoch history (CSV), each written atomically."""
    with atomic_output(model_path) as tmp:
        trained.model.save(tmp)
    with atomic_output(history_path) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(HISTORY_COLUMNS))
        writer.writeheader()
        writer.writerows(trained.history)


# -- the spine's trained model --------------------------------------------------------------
def train_model(*, spec: dict, seed: int, dataset_path: str | Path, out_model: str | Path,
                out_history: str | Path, out_logits: str | Path, threads: int | None = None,
                log=sys.stderr) -> None:
    """Train ``spec`` (a config model entry) with ``seed`` for every source of randomness;
    write model, history and test logits. ``train.deterministic`` switches the backend's
    own op determinism on."""
    import h5py

    from bitdrift.inputs.datasets import dataset_classes, read_dataset
    from bitdrift.run.devices import configure_determinism, configure_threads, import_keras

    settings = spec["train"]
    backend = settings["backend"]
    keras = import_keras(backend)
    configure_threads(backend, threads)
    configure_determinism(backend, settings["deterministic"])
    data = read_dataset(dataset_path)
    seeds = run_seeds(dict.fromkeys(SOURCES, "fixed"), seed, 0)
    trained = fit(keras, spec, settings, data, dataset_classes(data), seeds, log=log)
    save_model_and_history(trained, out_model, out_history)
    with atomic_output(out_logits) as tmp, h5py.File(tmp, "w") as handle:
        handle.create_dataset("logits", data=trained.logits)
        handle.create_dataset("labels", data=data["y_test"])
        handle.attrs.update({
            "seed": seed, "backend": backend, "deterministic": settings["deterministic"],
            "init_sha256": trained.init_sha256,
            "test_accuracy": float(np.mean(trained.logits.argmax(-1) == data["y_test"]))})
