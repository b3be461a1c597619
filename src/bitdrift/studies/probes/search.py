"""The probe search: candidates evaluated on the search devices, scored by the number of
bitwise classes they split those devices into.

Generation 0 is the natural test samples. Later generations move the best candidates
toward a decision boundary (blends with a sample the devices classify differently),
raise their dynamic range (contrast about 0.5) and add small noise; every candidate
stays an image of the model's input shape with values in [0, 1]. The probes are then
chosen greedily: each next probe separates the most device pairs the earlier ones left
together. Only the search devices are ever run or read here.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

from bitdrift.atomic import atomic_output
from bitdrift.errors import StudyError
from bitdrift.inputs.datasets import file_digest, read_dataset
from bitdrift.inputs.models import model_digest
from bitdrift.record.hdf5 import OUTPUT
from bitdrift.record.reader import Record

PROBE_SOURCE = "probes"
# A device whose batch size exceeds one pads its last batch with test images not run
# (bitdrift.run.selection.batch_indices): files that run every row end with these many
# copies of the first test images.
PADDING_ROWS = 64


def write_images(images: np.ndarray, out: Path, *, labels=None, attrs=None,
                 outputs: dict | None = None) -> None:
    """A dataset file whose test set is ``images``, no training set: the form `bitdrift
    infer` and the workflow read. ``outputs``: {device: outputs of the images} kept in
    group search_outputs."""
    labels = np.zeros(len(images), np.int64) if labels is None else np.asarray(labels)
    with atomic_output(out) as tmp, h5py.File(tmp, "w") as handle:
        handle.create_dataset("x_train", data=np.zeros((0, *images.shape[1:]), np.float32))
        handle.create_dataset("y_train", data=np.zeros(0, np.int64))
        handle.create_dataset("x_test", data=images.astype(np.float32))
        handle.create_dataset("y_test", data=labels)
        handle.create_dataset("train_order", data=np.zeros(0, np.int64))
        handle.attrs.update(attrs or {})
        for device, values in (outputs or {}).items():
            handle.create_dataset(f"search_outputs/{device}", data=values)


def evaluate(natural: np.ndarray, candidates: np.ndarray | None, *, model_name: str,
             model_path, devices: dict, inputs: dict, work: Path, log=sys.stderr) -> dict:
    """{device: outputs (n, ...)} of the candidates (None: of the natural test images),
    every device given running them all batched in one inference job (the core's `infer`,
    output only). The file run is the natural test set, then the candidates: a device's
    batch is padded with the first test images, and the export reference's checks read
    the test images at their own indices, as in every other record."""
    from bitdrift.run.inference import infer

    work.mkdir(parents=True, exist_ok=True)
    images = natural if candidates is None else np.concatenate([natural, candidates])
    rows = list(range(len(natural))) if candidates is None else \
        list(range(len(natural), len(images)))
    path = work / "candidates.h5"
    write_images(np.concatenate([images, natural[:PADDING_ROWS]]), path,
                 attrs={"name": "candidates", "source": "candidates"})
    outputs = {}
    for name, device in devices.items():
        record = work / f"{name}.h5"
        record.unlink(missing_ok=True)
        infer(model_name=model_name, device_name=name, device={**device, "repeats": 1},
              model_path=model_path, dataset_path=path, samples=rows, out=record,
              layers=False, kernels=False, export=inputs.get(name, {}).get("export"),
              reference=inputs.get(name, {}).get("reference"), log=log, observe=False)
        with Record(record) as opened:
            outputs[name] = np.stack([opened.tensor(row, OUTPUT).values[0] for row in rows])
    return outputs


def partition(outputs: dict, devices: list[str], rows: list[int]) -> list[list[str]]:
    """Devices grouped by equal outputs (bit for bit) on every row together."""
    groups: dict[tuple, list[str]] = {}
    for device in devices:
        key = tuple(outputs[device][row].tobytes() for row in rows)
        groups.setdefault(key, []).append(device)
    return list(groups.values())


def classes_per_input(outputs: dict, devices: list[str]) -> np.ndarray:
    """Per input row, the number of bitwise classes among ``devices``."""
    n = len(next(iter(outputs.values())))
    return np.array([len(partition(outputs, devices, [row])) for row in range(n)])


def spread(outputs: dict, devices: list[str]) -> np.ndarray:
    """Per input row, over its output elements, the distinct values among the devices
    beyond the first: how much of the output the devices disagree on. Once every search
    device is apart (classes saturate), a larger spread is an input more sensitive to
    the arithmetic, so more likely to part devices the search never ran."""
    n = len(next(iter(outputs.values())))
    stacked = np.stack([np.ascontiguousarray(outputs[d]).reshape(n, -1) for d in devices])
    raw = stacked.view(np.uint8).reshape(len(devices), n, stacked.shape[2], -1)
    per_element = [[len({raw[k, row, e].tobytes() for k in range(len(devices))})
                    for e in range(raw.shape[2])] for row in range(n)]
    return np.array(per_element).sum(axis=1) - raw.shape[2]


def margins(outputs: dict, devices: list[str]) -> np.ndarray:
    """Per input row, the smallest gap between the two largest outputs over the devices:
    near 0 the input sits on a decision boundary."""
    stacked = np.stack([outputs[d].reshape(len(outputs[d]), -1).astype(np.float64)
                        for d in devices])
    top = np.sort(stacked, axis=-1)[..., -2:]
    return (top[..., 1] - top[..., 0]).min(axis=0)


def greedy_order(outputs: dict, devices: list[str], rows: list[int], count: int) -> list[int]:
    """``count`` rows, each separating the most device pairs the earlier ones left
    together (ties: the row with more classes on its own, then the larger spread, then
    the earlier row)."""
    signature = {d: () for d in devices}
    chosen: list[int] = []
    subset = {d: np.stack([outputs[d][row] for row in rows]) for d in devices}
    own = dict(zip(rows, classes_per_input(subset, devices), strict=True))
    spreads = dict(zip(rows, spread(subset, devices), strict=True))

    def together(row, signature):
        keys = {d: (*signature[d], outputs[d][row].tobytes()) for d in devices}
        return sum(keys[a] == keys[b] for i, a in enumerate(devices) for b in devices[i + 1:])

    for _ in range(min(count, len(rows))):
        best = min((row for row in rows if row not in chosen),
                   key=lambda row: (together(row, signature), -own[row], -spreads[row], row))
        chosen.append(best)
        signature = {d: (*signature[d], outputs[d][best].tobytes()) for d in devices}
    return chosen


def _next_generation(rng, pool: np.ndarray, labels: np.ndarray, parents: np.ndarray,
                     population: int, noise: float) -> tuple[np.ndarray, list[str]]:
    """Children of the best candidates: blends toward a differently classified pool
    image (toward a boundary), contrast raised about 0.5, small uniform noise."""
    children, origins = [], []
    for k in range(population):
        parent_index = k % len(parents)
        parent = parents[parent_index]
        kind = k // len(parents) % 3
        if kind == 0:  # toward the boundary with an image of another class
            parent_label = labels[parent_index]
            others = np.flatnonzero(labels != parent_label) if len(labels) else []
            other = pool[rng.choice(others)] if len(others) else pool[rng.integers(len(pool))]
            t = rng.uniform(0.05, 0.5)
            child, origin = (1 - t) * parent + t * other, f"blend t={t:.3f}"
        elif kind == 1:  # dynamic range: larger intermediate sums
            gain = rng.uniform(1.2, 3.0)
            child, origin = 0.5 + gain * (parent - 0.5), f"contrast x{gain:.2f}"
        else:
            child, origin = parent + rng.uniform(-noise, noise, parent.shape), \
                f"noise {noise:g}"
        children.append(np.clip(child, 0.0, 1.0).astype(np.float32))
        origins.append(origin)
    return np.stack(children), origins


def search_probes(*, model_name: str, model_path, dataset_path, devices: dict,
                  inputs: dict | None = None, probes: int = 3, seed: int = 0,
                  generations: int = 2, population: int = 96, pool: int | None = None,
                  noise: float = 0.05, out, log=sys.stderr) -> dict:
    """Search probes on ``devices`` (name -> spec: the search devices only) and write the
    probe file ``out``. Returns the probe file's provenance."""
    if len(devices) < 2:
        raise StudyError(f"probe search needs at least two devices (got {sorted(devices)})")
    inputs = inputs or {}
    names = list(devices)
    data = read_dataset(dataset_path, splits=("test",))
    test = data["x_test"]
    natural = test if pool is None else test[:pool]
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="bitdrift-probes-") as tmp:
        work = Path(tmp)
        images, origins = natural, [f"test sample {i}" for i in range(len(natural))]
        # the whole test set (the reference's checks read it), the pool kept
        outputs = evaluate(test, None, model_name=model_name, model_path=model_path,
                           devices=devices, inputs=inputs, work=work / "g0", log=log)
        outputs = {d: values[: len(natural)] for d, values in outputs.items()}
        scores = classes_per_input(outputs, names)
        print(f"bitdrift: probes: generation 0 (natural test samples): best "
              f"{scores.max()} classes of {len(names)} search devices", file=log, flush=True)
        if scores.max() == 1:
            raise StudyError(f"the search devices {names} give one class on all {len(natural)} "
                             "natural test samples: there is nothing to separate")
        history = [(0, int(scores.max()))]
        for generation in range(1, generations + 1):
            # parents: most classes, then the largest spread, then nearest a boundary
            best = np.lexsort((margins(outputs, names), -spread(outputs, names),
                               -scores))[: max(4, population // 12)]
            labels = np.argmax(outputs[names[0]].reshape(len(images), -1), axis=1)
            children, child_origins = _next_generation(
                rng, images, labels[best], images[best], population, noise)
            child_origins = [f"{o} of {origins[i]}" for o, i in
                             zip(child_origins, np.resize(best, population), strict=True)]
            child_outputs = evaluate(test, children, model_name=model_name,
                                     model_path=model_path, devices=devices, inputs=inputs,
                                     work=work / f"g{generation}", log=log)
            images = np.concatenate([images, children])
            origins += child_origins
            outputs = {d: np.concatenate([outputs[d], child_outputs[d]]) for d in names}
            scores = np.concatenate([scores, classes_per_input(child_outputs, names)])
            history.append((generation, int(scores[-population:].max())))
            print(f"bitdrift: probes: generation {generation}: best child "
                  f"{history[-1][1]} classes", file=log, flush=True)
    crafted = list(range(len(natural), len(images)))
    order = greedy_order(outputs, names, crafted or list(range(len(images))), probes)
    provenance = {
        "model": model_name, "model_sha256": model_digest(model_path),
        "dataset_sha256": file_digest(dataset_path), "seed": seed, "devices": names,
        "generations": generations, "population": population, "noise": noise,
        "natural_pool": len(natural), "scores": [int(scores[r]) for r in order],
        "origins": [origins[r] for r in order], "history": history,
        "input_shape": list(images.shape[1:]),
    }
    labels = np.array([int(np.argmax(outputs[names[0]][r])) for r in order])
    write_images(images[order], out, labels=labels, attrs={
        "name": f"{model_name}_probes", "source": PROBE_SOURCE,
        "source_description": f"probes for {model_name} searched on {', '.join(names)}",
        "source_sha256": provenance["dataset_sha256"], "shuffle_seed": -1,
        "class_names": data["attrs"]["class_names"],
        "probe_provenance": json.dumps(provenance)},
        outputs={d: outputs[d][order] for d in names})
    return provenance
