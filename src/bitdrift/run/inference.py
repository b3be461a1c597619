"""Per-device inference: every layer's output for the configured samples, repeated.

Each repeat runs in a process of its own with the device's environment, in which nothing has
run before it (the reference study's protocol: autotuning, thread pools and CPU dispatch are
decided per process): a fresh process, or for a runtime that allows it a child forked from a
parent that has only imported the framework (bitdrift.run.workers). A repeat's job and body
are bitdrift.run.repeat's; after the measured repeats, a traced one
(bitdrift.run.traced_repeat). This parent merges the repeats into one record
(bitdrift.record.repeats; the record: bitdrift.record.hdf5) a layer at a time, written
atomically, with its attributes (bitdrift.run.record_attrs).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np

from bitdrift.atomic import work_folder
from bitdrift.errors import InferenceError
from bitdrift.inputs.datasets import check_samples, test_image_shape
from bitdrift.inputs.models import model_digest, model_input_shape
from bitdrift.progress import progress
from bitdrift.record.hdf5 import DEPLOYED
from bitdrift.record.repeats import batch_key, merge_repeats
from bitdrift.record.writer import RecordWriter
from bitdrift.run.fork_server import repeat_workers
from bitdrift.run.record_attrs import record_attrs
from bitdrift.run.repeat import WORKER, RepeatJob
from bitdrift.run.selection import full_sample_list, selected_positions, traced_batch_numbers
from bitdrift.run.traced_repeat import traced_repeat


def check_before_repeats(model_path, dataset_path, samples: list[int], out) -> str:
    """What would otherwise fail only after the repeats' start-up: a missing model or
    dataset, a model of no format bitdrift reads, sample indices beyond the test set,
    inputs that do not fit the model, an output folder that cannot be written. Returns
    the model's format (bitdrift.formats)."""
    for kind, path in (("model", model_path), ("dataset", dataset_path)):
        if not Path(path).is_file():
            raise InferenceError(f"{path}: {kind} file does not exist")
    check_samples(dataset_path, samples)
    from bitdrift import formats

    format = formats.detect(model_path)
    if format != "keras":
        formats.check_inputs(dataset_path, model_path, format)
    expected = model_input_shape(model_path) if format == "keras" else None
    images = test_image_shape(dataset_path) if expected is not None else None
    if expected is not None and None not in expected and tuple(expected) != images:
        raise InferenceError(f"{dataset_path}: images of shape {images}, but model "
                             f"{model_path} takes inputs of shape {tuple(expected)}")
    folder = Path(out).resolve().parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InferenceError(f"{out}: cannot create its folder ({error})") from error
    if not os.access(folder, os.W_OK):
        raise InferenceError(f"{out}: folder {folder} is not writable")
    return format


@contextlib.contextmanager
def terminate_cleanly():
    """SIGTERM (Snakemake, SLURM's scancel) raises SystemExit, so temporary files are
    removed on the way out instead of left behind."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def infer(*, model_name: str, device_name: str, device: dict, model_path: str | Path,
          dataset_path: str | Path, samples: list[int], out: str | Path,
          layers: bool = True, reference: str | Path | None = None,
          export: str | Path | None = None, kernels: bool = True, log=sys.stderr,
          deployed_export: str | Path | None = None, observe: bool = True,
          replay: dict | None = None, full_samples=None,
          layer_select: list[str] | None = None, traced_samples: str = "all",
          quantization: dict | None = None) -> None:
    """Run all repeats of one (model, device), each in a process of its own (fresh, or
    forked from a pre-imported parent: bitdrift.run.workers), and write the record.

    ``reference`` (bitdrift.backends.keras.export's reference.npz of the model): the device's
    classes of
    the first test images are compared with TensorFlow's, and a float32/float64 device
    that agrees on fewer than 99 % fails. ``export``: the exported file an exported
    runtime runs, ``deployed_export`` the model converted with its final output alone:
    each repeat also runs the model as deployed, and the record holds whether its final
    output equals the instrumented run's (bitdrift.analysis.observer; a Keras runtime needs no
    file; ``observe=False`` leaves the check out, for the studies that run many inputs
    on the outputs alone). ``kernels``: after the measured repeats, one traced repeat in
    a process of its own records which kernel ran in every layer (bitdrift.analysis.kernels), and
    for an exported runtime the deployed graph's kernels beside the instrumented graph's.
    ``replay``: the replay's settings (config analysis.replay, replay_positions,
    replay_samples; bitdrift.analysis.accumulation.replay.replay_layers), its defaults where None.
    ``full_samples`` (analysis.full_samples: None all, N the first N, or a list): the
    samples whose layers keep their values; the others' layers keep their digests only.
    ``layer_select`` (analysis.layer_select): the layers recorded, by name or Keras class
    (None: all). ``traced_samples`` (analysis.traced_samples): "all", or "full" for a
    traced repeat of the batches holding the full samples alone (traced_batch_numbers).
    ``quantization``: how the workflow quantized the model (bitdrift.plan.Plan.quantization),
    written into the record's fingerprint with the float model's digest.
    The record is written a layer at a time as the repeats are merged."""
    model_format = check_before_repeats(model_path, dataset_path, samples, out)
    from bitdrift import formats

    runtimes = formats.runtimes(model_format)
    if device["backend"] not in runtimes:
        raise InferenceError(f"device {device_name!r}: backend {device['backend']!r} cannot "
                             f"run {model_path} ({formats.get(model_format).WHAT}; runtimes "
                             f"that can: {', '.join(runtimes) or 'none yet'})")
    expected = None
    if reference:
        from bitdrift.backends.exported.expected import read_reference

        expected = read_reference(reference)
        if expected.model_sha256 != model_digest(model_path):
            raise InferenceError(f"{reference}: the export reference of another model than "
                                 f"{model_path}")
    metas, files, weights, classes, selected, deployed = [], [], {}, None, None, True
    full = full_sample_list(samples, full_samples)
    traced_batches = traced_batch_numbers(list(samples), full, device["batch_size"],
                                          traced_samples)
    with terminate_cleanly(), work_folder(out) as tmp, repeat_workers(
            WORKER, device, f"device {device_name!r}", log) as workers:
        how = workers.HOW
        # what every repeat's job says alike, the measured ones' and the traced one's (the
        # reference: the first repeat's classes are checked against it, and an exported
        # runtime maps its outputs to the layers by it)
        common = {"device": device, "device_name": device_name, "model_path": str(model_path),
                  "dataset_path": str(dataset_path), "samples": list(samples),
                  "full_samples": full, "layers": layers, "model_format": model_format,
                  "reference": str(reference) if reference else None,
                  "export": str(export) if export else None,
                  "deployed_export": str(deployed_export) if deployed_export else None}
        for repeat in progress(range(device["repeats"]), "repeats done", file=log):
            job = RepeatJob(**common, model_name=model_name,
                            out=str(Path(tmp) / f"repeat{repeat}.npz"),
                            fingerprint=repeat == 0, orders=repeat == 0 and kernels,
                            order_positions=(replay or {}).get("replay_positions"),
                            observe=observe,
                            error_file=str(Path(tmp) / f"repeat{repeat}.error"),
                            log_is_terminal=log is sys.__stderr__,
                            counted_as=f"repeat {repeat + 1}/{device['repeats']}")
            print(f"bitdrift: {model_name} on {device_name}: repeat {repeat + 1}/"
                  f"{device['repeats']} in {how}", file=log, flush=True)
            status = workers.run(job.as_dict())
            if status != 0:
                raise InferenceError(f"device {device_name!r}, model {model_name!r}: repeat "
                                     f"{repeat + 1} failed (exit {status}){_why(job)}")
            with np.load(job.out) as data:  # lazy: the outputs stay on disk
                metas.append(json.loads(str(data["meta"])))
                deployed = deployed and batch_key(DEPLOYED, 0) in data.files
                if repeat == 0:
                    weights = {k: data[k] for k in data.files if k.startswith("weights/")}
                    classes = data["argmax"] if "argmax" in data.files else None
                    # a selection naming no layer is refused before the other repeats run
                    selected = selected_positions(metas[0]["layers"], layer_select,
                                                  model_name) if layers else set()
            files.append(job.out)
        traced = None
        if kernels:
            traced_job = RepeatJob(**common, out=str(Path(tmp) / "traced.npz"),
                                   fingerprint=False, trace=True, batches=traced_batches)
            traced = traced_repeat(model_name, device_name, device, metas[0], traced_job,
                                   Path(tmp) / "trace.txt", workers, how, log)
        with RecordWriter(out) as writer:
            match = merge_repeats(writer, files, metas[0], list(samples), full, selected,
                                  device["batch_size"], deployed,
                                  Path(traced_job.out) if traced and traced["traced"]
                                  else None, traced_batches)
            if metas[0].get("quantization"):
                writer.set_quantization(metas[0]["quantization"], list(samples))
            if traced and traced["traced"]:
                traced["outputs_match"] = match
                if not match:
                    print(f"bitdrift: warning: device {device_name!r}: the traced repeat's "
                          "outputs differ from the measured majority; the record keeps the "
                          "measured ones", file=log, flush=True)
            attrs = record_attrs(writer, metas[0], weights, classes, expected, full, selected,
                                 deployed, model_name=model_name, device_name=device_name,
                                 device=device, model_path=model_path,
                                 dataset_path=dataset_path, samples=samples, layers=layers,
                                 export=export, deployed_export=deployed_export,
                                 replay=replay, quantization=quantization, log=log)
            writer.set_attrs(attrs)
            if traced is not None:
                writer.set_kernels(traced)


def _why(job: RepeatJob) -> str:
    """': <the worker's one-line error>' (bitdrift.run.workers writes it beside the job's
    files), else '; see log'."""
    path = Path(job.error_file or "")
    if not path.is_file():
        return "; see log"
    return f": {path.read_text(errors='replace').strip()}"
