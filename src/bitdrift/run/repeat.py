"""One repeat of a device: its job (RepeatJob, written by the parent, bitdrift.run.inference)
and its body (run_repeat), run in a process of its own with the device's environment (a
fresh process, a forked child or a fork server's child: bitdrift.run.workers,
bitdrift.run.fork_server). The outputs go to the repeat's own file
(bitdrift.record.repeats), which the parent merges into the record.

    python -m bitdrift.run.repeat JOB_JSON   # one repeat in a fresh process
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass

import numpy as np

from bitdrift.errors import InferenceError
from bitdrift.inputs.datasets import count_test_images, read_test_images
from bitdrift.progress import progress
from bitdrift.record.hdf5 import DEPLOYED
from bitdrift.record.repeats import RepeatWriter
from bitdrift.run.orders import reveal_orders
from bitdrift.run.selection import batch_indices
from bitdrift.run.workers import worker_main

# What the worker processes run for a repeat (module:function)
WORKER = "bitdrift.run.repeat:run_repeat"


@dataclass(frozen=True)
class RepeatJob:
    """What one repeat runs, as the parent hands it to the worker: the device, the model
    and its inputs, the repeat's output file, and what this repeat does beyond the
    outputs. It travels as a JSON object (as_dict; from_dict reads it back in the
    worker), the dict the runtimes' ``open_session(job, name)`` read (bitdrift.backends).
    The defaults are a worker's for a key a job leaves out."""

    device: dict  # the device's config entry (bitdrift.config)
    device_name: str
    model_path: str
    dataset_path: str
    samples: list[int]
    layers: bool  # whether the layers are recorded, or the final output alone
    out: str  # the repeat's file (bitdrift.record.repeats)
    model_name: str | None = None  # None: the model named by its path in the log
    full_samples: list[int] | None = None  # analysis.full_samples as a list; None: all
    model_format: str = "keras"  # bitdrift.formats
    # the first repeat's: the machine's fingerprint, the reference's classes, and the
    # summation orders revealed (bitdrift.run.orders) at this many positions
    fingerprint: bool = True
    orders: bool = False
    order_positions: int | None = None
    reference: str | None = None  # bitdrift.backends.exported.expected's file
    export: str | None = None  # the file an exported runtime runs
    deployed_export: str | None = None  # the model as deployed (the observer check)
    observe: bool = True  # whether the model as deployed also runs (the observer check)
    # a failure's one line goes to error_file (bitdrift.run.workers), and to the log too
    # unless the log is the terminal the parent reports on
    error_file: str | None = None
    log_is_terminal: bool = False
    # the traced repeat (bitdrift.run.traced_repeat): the libraries log their kernels; it
    # runs the batches numbered in ``batches`` alone (None: every batch)
    trace: bool = False
    batches: list[int] | None = None
    # what the job's progress lines call a measured repeat ("repeat 1/3": bitdrift.progress)
    counted_as: str = "repeat"

    def as_dict(self) -> dict:
        """The job as the worker gets it. A measured repeat's and the traced repeat's
        carry the keys each always had: the traced one has no model_name, orders,
        order_positions, observe, error_file or log_is_terminal (so it runs the model as
        deployed where the runtime has it, whatever ``observe``: its kernels are compared
        with the instrumented graph's, bitdrift.analysis.observer.compare_kernels)."""
        job = {"device": self.device, "device_name": self.device_name,
               "model_path": self.model_path, "dataset_path": self.dataset_path,
               "samples": list(self.samples), "full_samples": self.full_samples,
               "layers": self.layers, "out": self.out, "fingerprint": self.fingerprint,
               "reference": self.reference, "export": self.export,
               "deployed_export": self.deployed_export, "model_format": self.model_format}
        if self.trace:
            return {**job, "trace": True, "batches": self.batches}
        return {**job, "model_name": self.model_name, "orders": self.orders,
                "order_positions": self.order_positions, "observe": self.observe,
                "error_file": self.error_file, "log_is_terminal": self.log_is_terminal,
                "counted_as": self.counted_as}

    @classmethod
    def from_dict(cls, job: dict) -> RepeatJob:
        """The job a worker was handed; one line naming a key that is no job's, or a
        required key left out."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(job) - known)
        required = [field.name for field in dataclasses.fields(cls)
                    if field.default is dataclasses.MISSING and field.name not in job]
        if unknown or required:
            said = ([f"unknown key(s) {', '.join(unknown)}"] if unknown else []) + (
                [f"missing key(s) {', '.join(required)}"] if required else [])
            raise InferenceError(f"repeat job: {'; '.join(said)}")
        return cls(**job)


def run_repeat(sent: dict) -> None:
    """One repeat inside its own process: load, cast, run, save outputs to the job's
    ``out`` (``sent``: the job as the worker got it, RepeatJob.as_dict)."""
    from bitdrift import backends
    from bitdrift.inputs.models import numpy_dtype
    from bitdrift.run.devices import fingerprint

    job = RepeatJob.from_dict(sent)
    device, name = job.device, job.device_name
    # the runtimes read the job as it came (bitdrift.backends: open_session(job, name))
    session = backends.open_session(sent, name)
    first = job.fingerprint
    indices = batch_indices(job.samples, device["batch_size"],
                            count_test_images(job.dataset_path))
    dtype = numpy_dtype(device["precision"])
    images = read_test_images(job.dataset_path, indices)
    if job.model_format == "keras":
        images = images.astype(dtype)
    # a model of another format takes its inputs as its signature says (checked before
    # the repeats: bitdrift.formats.check_inputs)
    batch = device["batch_size"]
    out = RepeatWriter(job.out)
    # Each batch's outputs go to the file as they come (the filler rows left out): the
    # worker holds one batch of the model's layers, not every sample's. A sample outside
    # analysis.full_samples leaves its layers' digests only (its final output in full).
    keep = set(job.samples if job.full_samples is None else job.full_samples)
    # a traced repeat of analysis.traced_samples: full runs some batches alone, numbered
    # as in the measured repeats (the same rows and filler in each)
    count = -(-len(indices) // batch)
    numbers = job.batches or range(count)
    seconds = []
    which = "traced repeat" if job.trace else job.counted_as
    for number in progress(numbers, f"{which}: batches run"):
        start = number * batch
        names = job.samples[start:start + batch]
        began = time.perf_counter()
        outputs = session.run(images[start:start + batch])
        for position, value in enumerate(outputs):
            out.add_batch(position, number, np.asarray(value)[:len(names)], names,
                          None if position == len(outputs) - 1 else keep)
        del outputs
        seconds.append(time.perf_counter() - began)
    print(batch_seconds_line("instrumented", seconds, batch), file=sys.stderr, flush=True)
    if session.deployed is not None and job.observe:
        # the observer check (bitdrift.analysis.observer): the model as deployed, after the
        # instrumented run in the same process, on the same batches
        seconds = []
        for number in progress(numbers, f"{which}: batches run as deployed"):
            start = number * batch
            names = job.samples[start:start + batch]
            began = time.perf_counter()
            out.add_batch(DEPLOYED, number, np.asarray(session.deployed(
                images[start:start + batch]))[:len(names)], names, None)
            seconds.append(time.perf_counter() - began)
        print(batch_seconds_line("deployed", seconds, batch), file=sys.stderr, flush=True)
    arrays = {}
    # The first repeat also classifies the reference's test images (the argmax check
    # against TensorFlow, see bitdrift.backends.keras.export) and describes the machine;
    # py-cpuinfo takes about a second per call, so the other repeats skip both.
    if first and job.reference:
        from bitdrift.backends.exported.expected import read_reference

        reference = read_reference(job.reference)
        test = read_test_images(job.dataset_path, reference.argmax_indices).astype(dtype)
        arrays["argmax"] = np.concatenate([
            np.argmax(np.asarray(session.final(test[start:start + device["batch_size"]]))
                      .astype(np.float64), axis=-1)
            for start in range(0, len(test), device["batch_size"])])
    weights = {f"weights/{layer}/{index}": np.asarray(value).astype(np.float64)
               for layer, (_, values) in session.checked.items()
               for index, value in enumerate(values)}
    meta = {"layers": session.layers, "unmapped": session.unmapped,
            "checked": {layer: spec for layer, (spec, _) in session.checked.items()},
            "fingerprint": fingerprint(device, session.accelerator) if first else None,
            "bfloat16": device["precision"] == "bfloat16",
            "deployed_program": session.deployed_program}
    if session.quantization:  # a quantized model's integer layers' scales, zero points
        meta["quantization"] = session.quantization
    if session.kernels is not None:  # an exported runtime's description of its graph
        meta["runtime_kernels"] = session.kernels
    # and of its deployed graph (bitdrift.analysis.observer)
    if session.deployed_kernels is not None:
        meta["deployed_kernels"] = session.deployed_kernels
    if job.orders and (session.order_probe is not None or session.unrevealed):
        meta["orders"] = {layer: {"error": reason} for layer, reason in session.unrevealed.items()}
        if session.order_probe is not None:
            # a line per layer in the job's log (the worker's stderr): a large model's
            # search takes minutes
            model = job.model_path if job.model_name is None else job.model_name
            meta["orders"].update(reveal_orders(
                session, device, job.order_positions, log=sys.stderr,
                what=f"{model} on {name}"))
    meta["outputs"] = out.positions
    meta["shapes"] = out.shapes
    meta["batches"] = count
    # The libraries' kernel lines of a traced repeat are flushed by the worker's exit
    # (bitdrift.run.workers.exit_now), fresh or forked.
    for key, value in {"meta": np.asarray(json.dumps(meta)), **arrays, **weights}.items():
        out.add(key, value)
    out.close()


def batch_seconds_line(run: str, seconds: list[float], batch: int) -> str:
    """The job log's line of one pass over the batches: the first batch apart (it
    compiles and warms caches), so that the others give what a further sample costs
    (benchmarks/per_sample.py reads these lines; docs/benchmarks.md)."""
    later = seconds[1:]
    each = f", then {sum(later) / len(later):.3f} s per batch" if later else ""
    return (f"bitdrift: {run} run of {len(seconds)} batches of {batch}: "
            f"{sum(seconds):.3f} s, the first {seconds[0] if seconds else 0:.3f} s{each}")


if __name__ == "__main__":
    worker_main(run_repeat)
