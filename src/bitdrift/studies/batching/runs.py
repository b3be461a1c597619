"""One device's batch-invariance run, in one process of its own with the device's
environment (threads, ISA, runtime options, as every record's repeats):

    python -m bitdrift.studies.batching.runs WORKER_JSON

The parent (:func:`run_device`) writes what the worker measured as one JSON file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from bitdrift.analysis.remaining_precision import MANTISSA_BITS, remaining_precision
from bitdrift.atomic import atomic_output, work_folder
from bitdrift.errors import InferenceError

PAD = 0  # the padding token (the grammar's <pad>)
POSITIONS = ("first", "middle", "last")
WORKER = "bitdrift.studies.batching.runs:run_worker"


def position_index(position: str, batch_size: int) -> int:
    return {"first": 0, "middle": batch_size // 2, "last": batch_size - 1}[position]


def batch_settings(batch_sizes: list[int], positions: list[str], neighbour_sets: int,
                   padded_length: int | None) -> list[dict]:
    """Every way the study runs an input: alone first (the baseline), then each batch size
    at each position (neighbour set 0), each further neighbour set at the first position,
    and alone padded to ``padded_length``."""
    settings = [{"name": "alone", "batch_size": 1, "position": 0, "neighbours": 0,
                 "padded": False}]
    for size in batch_sizes:
        for index in dict.fromkeys(position_index(p, size) for p in positions):
            settings.append({"name": f"batch{size}_at{index}", "batch_size": size,
                             "position": index, "neighbours": 0, "padded": False})
        for neighbours in range(1, neighbour_sets):
            settings.append({"name": f"batch{size}_neighbours{neighbours}",
                             "batch_size": size, "position": 0, "neighbours": neighbours,
                             "padded": False})
    if padded_length:
        settings.append({"name": f"padded{padded_length}", "batch_size": 1, "position": 0,
                         "neighbours": 0, "padded": True})
    return settings


def build_batch(target: np.ndarray, pool: np.ndarray, setting: dict,
                length: int | None = None) -> np.ndarray:
    """The batch ``setting`` puts ``target`` (one token sequence) in: neighbours drawn
    from ``pool`` (never the target) by a generator seeded with the neighbour set, the
    target at its position; every row cut or padded (token PAD, after the sequence) to
    ``length`` (default the target's). Float32 token ids, as the models take."""
    length = length or len(target)
    size = setting["batch_size"]
    rng = np.random.default_rng([setting["neighbours"], size])
    rows = [pool[index] for index in rng.choice(len(pool), size - 1, replace=False)] \
        if size > 1 else []
    rows.insert(setting["position"], target)
    batch = np.full((size, length), PAD, dtype=np.float32)
    for row, tokens in enumerate(rows):
        tokens = np.resize(tokens, length) if row != setting["position"] else tokens
        batch[row, :len(tokens)] = tokens[:length]
    return batch


def compare(alone: np.ndarray, other: np.ndarray) -> dict:
    """One layer's output of one input in a setting against its batch-of-1 output: bit
    equal, else the remaining precision (mantissa bits the two agree on) and the share of
    elements that differ. The format is the outputs' dtype (ml_dtypes names bfloat16's)."""
    float_format = alone.dtype.name
    if alone.shape == other.shape and alone.tobytes() == other.tobytes():
        return {"equal": True, "remaining_precision": MANTISSA_BITS[float_format],
                "differing_share": 0.0}
    result = remaining_precision([alone, other], float_format)
    return {"equal": False, "remaining_precision": result["remaining_precision_uncapped"],
            "differing_share": result["deviating_fraction"]}


def layer_verdicts(run, layers: list[str], inputs: list[int], test: np.ndarray,
                   settings: list[dict], padded_length: int | None = None) -> list[dict]:
    """Rows (setting, input, layer, equal, remaining_precision, differing_share) for every
    test sequence of index ``inputs`` in every setting (neighbours: the other test
    sequences), ``run(batch)`` giving the recorded layers' outputs in ``layers``' order.
    A padded setting's outputs are cut back to the input's own positions (causal
    attention: later positions must not matter)."""
    rows = []
    for index in inputs:
        tokens, pool = test[index], np.delete(test, index, axis=0)
        baseline = None
        for setting in settings:
            length = padded_length if setting["padded"] else len(tokens)
            outputs = run(build_batch(tokens, pool, setting, length))
            mine = [np.asarray(value)[setting["position"]] for value in outputs]
            if setting["padded"]:
                mine = [value[:len(tokens)] if value.ndim and value.shape[0] == length
                        else value for value in mine]
            if baseline is None:
                baseline = mine
            for layer, alone, other in zip(layers, baseline, mine, strict=True):
                rows.append({"setting": setting["name"], "input": index, "layer": layer,
                             **compare(alone, other)})
    return rows


def greedy_decode(final, prompt: list[int], tokens: int, pool: np.ndarray, setting: dict,
                  window: int) -> tuple[list[int], np.ndarray]:
    """``tokens`` tokens generated greedily after ``prompt`` in the batch of ``setting``,
    each step running the whole sequence (no cache) right-padded to ``window`` tokens
    (constant shapes; causal attention ignores the padding); ``final(batch)`` gives the
    logits (batch, length, vocabulary). Ties go to the lowest token id. Returns the
    tokens and each step's logits (steps x vocabulary, float64)."""
    sequence = np.full(window, PAD, dtype=np.float32)
    sequence[:len(prompt)] = prompt
    generated, step_logits = [], []
    for step in range(tokens):
        batch = build_batch(sequence, pool, setting, window)
        logits = np.asarray(final(batch))[setting["position"], len(prompt) + step - 1]
        step_logits.append(logits.astype(np.float64))
        token = int(np.argmax(step_logits[-1]))
        sequence[len(prompt) + step] = token
        generated.append(token)
    return generated, np.stack(step_logits)


def first_divergence(reference: list[int], tokens: list[int]) -> int | None:
    """1-based index of the first generated token that differs, None if none does."""
    for index, (a, b) in enumerate(zip(reference, tokens, strict=True), start=1):
        if a != b:
            return index
    return None


def decoding_entry(alone: tuple[list[int], np.ndarray],
                   mine: tuple[list[int], np.ndarray]) -> dict:
    """How close a setting's decoding came to leaving the batch-of-1 text: the largest
    change of any logit against alone over the steps whose prefix is still the same (up to
    and including the first divergent step), and the smallest gap between alone's two
    highest logits (the closest decision). A token flips only where a change reaches a
    gap."""
    (alone_tokens, alone_logits), (tokens, logits) = alone, mine
    steps = first_divergence(alone_tokens, tokens) or len(tokens)
    top = np.sort(alone_logits, axis=1)[:, -2:]
    return {"tokens": tokens,
            "largest_logit_change": float(np.max(np.abs(logits[:steps]
                                                        - alone_logits[:steps]))),
            "smallest_margin": float(np.min(top[:, 1] - top[:, 0]))}


def run_worker(job: dict) -> None:
    """Inside the device's process: open the model on the runtime, measure, save JSON."""
    from bitdrift import backends
    from bitdrift.inputs.datasets import read_test_images

    device, name = job["device"], job["device_name"]
    session = backends.get(device["backend"]).open_session(job, name)
    test = read_test_images(job["dataset_path"], list(range(job["n_test"])))
    settings = batch_settings(job["batch_sizes"], job["positions"], job["neighbour_sets"],
                              job["padded_length"])
    layers = [layer for layer, _ in session.layers]
    verdicts = layer_verdicts(session.run, layers, job["inputs"], test, settings,
                              job["padded_length"])
    decoding = []
    for prompt_index, prompt in enumerate(job["prompts"]):
        window = len(prompt) + job["tokens"]
        alone = None
        for setting in settings:
            length = job["padded_length"] if setting["padded"] else window
            mine = greedy_decode(session.final, prompt, job["tokens"], test, setting, length)
            alone = alone or mine  # the first setting is the input alone
            decoding.append({"prompt": prompt_index, "setting": setting["name"],
                             **decoding_entry(alone, mine)})
    with open(job["out"], "w") as handle:
        json.dump({"layers": session.layers, "unmapped": session.unmapped,
                   "settings": settings, "verdicts": verdicts, "decoding": decoding}, handle)


def run_device(*, model_name: str, device_name: str, device: dict, model_path, dataset_path,
               inputs: list[int], batch_sizes: list[int], positions: list[str],
               neighbour_sets: int, padded_length: int | None, prompts: list[list[int]],
               tokens: int, out, reference=None, export=None, log=sys.stderr) -> None:
    """Run the study on one device in a process of its own and write ``out`` (JSON)."""
    from bitdrift.inputs.datasets import count_test_images, test_image_shape
    from bitdrift.run.fork_server import repeat_workers
    from bitdrift.run.inference import check_before_repeats, terminate_cleanly

    check_before_repeats(model_path, dataset_path, inputs, out)
    n_test = count_test_images(dataset_path)
    length = test_image_shape(dataset_path)[0]
    if max(batch_sizes, default=1) > n_test:
        raise InferenceError(f"{dataset_path}: batch size {max(batch_sizes)} is above the "
                             f"test set's {n_test} sequences")
    if padded_length and padded_length < length:
        raise InferenceError(f"padded length {padded_length} is shorter than the test "
                             f"sequences ({length} tokens)")
    job = {"device": device, "device_name": device_name, "model_path": str(model_path),
           "dataset_path": str(dataset_path), "layers": True, "fingerprint": False,
           "reference": str(reference) if reference else None,
           "export": str(export) if export else None, "n_test": n_test,
           "inputs": list(inputs), "batch_sizes": list(batch_sizes),
           "positions": list(positions), "neighbour_sets": neighbour_sets,
           "padded_length": padded_length, "prompts": [list(p) for p in prompts],
           "tokens": tokens}
    with terminate_cleanly(), work_folder(out) as tmp, repeat_workers(
            WORKER, device, f"device {device_name!r}", log) as workers:
        job["out"] = str(Path(tmp) / "result.json")
        print(f"bitdrift: {model_name} on {device_name}: batch settings", file=log, flush=True)
        status = workers.run(job)
        if status != 0:
            raise InferenceError(f"device {device_name!r}, model {model_name!r}: the "
                                 f"batch-invariance run failed (exit {status}); see log")
        result = json.loads(Path(job["out"]).read_text())
    result.update({"model": model_name, "device": device_name, "backend": device["backend"],
                   "precision": device["precision"], "inputs": list(inputs),
                   "prompts": [list(p) for p in prompts]})
    with atomic_output(out) as tmp, open(tmp, "w") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    from bitdrift.run.workers import worker_main

    worker_main(run_worker)
