"""Per-device inference: every layer's output for the configured samples, repeated.

Each repeat runs in a process of its own with the device's environment, in which nothing has
run before it (the reference study's protocol: autotuning, thread pools and CPU dispatch are
decided per process): a fresh process, or for a runtime that allows it a child forked from a
parent that has only imported the framework (bitdrift.run.workers).
The parent merges the repeats into one record (see bitdrift.record.hdf5) a layer at a time, written
atomically.

    python -m bitdrift.run.inference WORKER_JSON   # one repeat; used by infer()
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from bitdrift.analysis.effective_precision import describe_reduced
from bitdrift.atomic import work_folder
from bitdrift.errors import InferenceError
from bitdrift.inputs.datasets import (
    check_samples,
    count_test_images,
    file_digest,
    input_sha256,
    read_test_images,
    test_image_shape,
)
from bitdrift.inputs.models import model_digest, model_input_shape
from bitdrift.progress import progress
from bitdrift.record.hdf5 import DEPLOYED, OUTPUT, RecordWriter, output_digest
from bitdrift.run.fork_server import repeat_workers
from bitdrift.run.workers import worker_main


def batch_indices(samples: list[int], batch_size: int, n_test: int) -> list[int]:
    """Samples first, then the following test images not among them, up to a whole batch.

    A device's batch size changes the kernels chosen (GEMM shapes), so the padding is part
    of the device; the filler images are fixed, so every device sees the same inputs.
    """
    total = -(-len(samples) // batch_size) * batch_size
    chosen = set(samples)
    filler = [i for i in range(n_test) if i not in chosen][: total - len(samples)]
    if len(samples) + len(filler) < total:
        raise InferenceError(f"test set too small for batch size {batch_size}")
    return list(samples) + filler


def run_repeat(job: dict) -> None:
    """One repeat inside its own process: load, cast, run, save outputs to job['out']."""
    from bitdrift import backends
    from bitdrift.inputs.models import numpy_dtype
    from bitdrift.run.devices import fingerprint

    device, name = job["device"], job["device_name"]
    session = backends.open_session(job, name)
    first = job.get("fingerprint", True)
    indices = batch_indices(job["samples"], device["batch_size"],
                            count_test_images(job["dataset_path"]))
    dtype = numpy_dtype(device["precision"])
    images = read_test_images(job["dataset_path"], indices)
    if job.get("model_format", "keras") == "keras":
        images = images.astype(dtype)
    # a model of another format takes its inputs as its signature says (checked before
    # the repeats: bitdrift.formats.check_inputs)
    batch = device["batch_size"]
    out = RepeatWriter(job["out"])
    # Each batch's outputs go to the file as they come (the filler rows left out): the
    # worker holds one batch of the model's layers, not every sample's. A sample outside
    # analysis.full_samples leaves its layers' digests only (its final output in full).
    keep = set(job.get("full_samples", job["samples"]))
    # a traced repeat of analysis.traced_samples: full runs some batches alone, numbered
    # as in the measured repeats (the same rows and filler in each)
    count = -(-len(indices) // batch)
    numbers = job.get("batches") or range(count)
    seconds = []
    for number in numbers:
        start = number * batch
        names = job["samples"][start:start + batch]
        began = time.perf_counter()
        outputs = session.run(images[start:start + batch])
        for position, value in enumerate(outputs):
            out.add_batch(position, number, np.asarray(value)[:len(names)], names,
                          None if position == len(outputs) - 1 else keep)
        del outputs
        seconds.append(time.perf_counter() - began)
    print(batch_seconds_line("instrumented", seconds, batch), file=sys.stderr, flush=True)
    if session.deployed is not None and job.get("observe", True):
        # the observer check (bitdrift.analysis.observer): the model as deployed, after the
        # instrumented run in the same process, on the same batches
        seconds = []
        for number in numbers:
            start = number * batch
            names = job["samples"][start:start + batch]
            began = time.perf_counter()
            out.add_batch(DEPLOYED, number, np.asarray(session.deployed(
                images[start:start + batch]))[:len(names)], names, None)
            seconds.append(time.perf_counter() - began)
        print(batch_seconds_line("deployed", seconds, batch), file=sys.stderr, flush=True)
    arrays = {}
    # The first repeat also classifies the reference's test images (the argmax check
    # against TensorFlow, see bitdrift.backends.keras.export) and describes the machine; py-cpuinfo
    # takes about a second per call, so the other repeats skip both.
    if first and job.get("reference"):
        from bitdrift.backends.exported.expected import read_reference

        reference = read_reference(job["reference"])
        test = read_test_images(job["dataset_path"], reference.argmax_indices).astype(dtype)
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
    if session.kernels is not None:  # an exported runtime's description of its graph
        meta["runtime_kernels"] = session.kernels
    # and of its deployed graph (bitdrift.analysis.observer)
    if session.deployed_kernels is not None:
        meta["deployed_kernels"] = session.deployed_kernels
    if job.get("orders") and (session.order_probe is not None or session.unrevealed):
        meta["orders"] = {layer: {"error": reason} for layer, reason in session.unrevealed.items()}
        if session.order_probe is not None:
            # a line per layer in the job's log (the worker's stderr): a large model's
            # search takes minutes
            meta["orders"].update(reveal_orders(
                session, device, job.get("order_positions"), log=sys.stderr,
                what=f"{job.get('model_name', job['model_path'])} on {name}"))
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


def batch_key(position: int | str, batch: int) -> str:
    """The key of one batch of one output (a layer's position, or DEPLOYED) in a repeat's
    file: the values of the rows it keeps (RepeatWriter.add_batch)."""
    return f"{position}_batch{batch}"


def digest_key(position: int | str, batch: int) -> str:
    """The key of the digests of one batch's rows of one output."""
    return f"{position}_digests{batch}"


def _raw(values: np.ndarray) -> np.ndarray:
    """bfloat16 as its raw bits (uint16): numpy's files hold no bfloat16."""
    return values.view(np.uint16) if values.dtype.name == "bfloat16" else values


class RepeatWriter:
    """A repeat's outputs as an .npz written one array at a time (numpy.savez's layout:
    np.load reads it, lazily per key), so that the worker need not hold them all."""

    def __init__(self, path: str | Path):
        import zipfile

        self._zip = zipfile.ZipFile(path, "w", allowZip64=True)
        # per output (a layer's position, or DEPLOYED): [shape of one sample's, dtype]
        self.shapes: dict[str, list] = {}

    @property
    def positions(self) -> int:
        """How many outputs (layer positions) were added."""
        return sum(1 for key in self.shapes if key.isdigit())

    def add_batch(self, position: int | str, number: int, values: np.ndarray,
                  samples: list[int], keep: set[int] | None) -> None:
        """One batch of one output: each row's digest (bitdrift.record.hdf5.output_digest), and
        the values of the rows whose sample is in ``keep`` (None: every row)."""
        values = _raw(np.asarray(values))
        float_format = "bfloat16" if values.dtype == np.uint16 else values.dtype.name
        self.shapes.setdefault(str(position), [list(values.shape[1:]), values.dtype.str])
        self.add(digest_key(position, number), np.array(
            [np.frombuffer(output_digest(row, float_format), np.uint8) for row in values],
            np.uint8).reshape(len(values), 32))
        chosen = [row for row, sample in enumerate(samples) if keep is None or sample in keep]
        self.add(batch_key(position, number), values[chosen])

    def add(self, key: str, value: np.ndarray) -> None:
        with self._zip.open(f"{key}.npy", "w", force_zip64=True) as handle:
            np.lib.format.write_array(handle, _raw(np.asanyarray(value)), allow_pickle=False)

    def close(self) -> None:
        self._zip.close()


WORKER = "bitdrift.run.inference:run_repeat"


def reveal_orders(session, device: dict, positions: int | None = None, *,
                  reuse: bool = True, log=None, what: str = "") -> dict:
    """{layer: {"trees", ...} or {"error"}}: the order each Dense and Conv2D layer sums in,
    revealed through this runtime at the layer's shapes and the device's batch size
    (bitdrift.analysis.accumulation): at every batch row and, for a Conv2D, every output pixel of
    a grid of at most ``positions`` (analysis.replay_positions; None: its default), else
    at the replay's sample of that many; in every format a device runs (float16 and
    bfloat16 with the probe values they hold).

    A layer whose probe is the same program as an earlier layer's (probe_key: its spec,
    the batch, the precision, the positions) takes that layer's entry with
    ``searched_at`` naming it, instead of a search of its own: the probe replaces the
    weights and runs on ones, so its calls, and thus what the search finds, are the
    same (``reuse=False`` searches every layer). ``log``: a line per layer, ``what``
    (model on device) first."""
    import time

    from bitdrift.analysis.accumulation.names import order_name
    from bitdrift.analysis.accumulation.probes import PROBE_VALUES, conv_grid
    from bitdrift.analysis.accumulation.replay import REPLAY_POSITIONS, conv_border
    from bitdrift.analysis.accumulation.reveal import reveal_places
    from bitdrift.analysis.accumulation.trees import OrderError, from_flat

    orders, searched = {}, {}  # searched: {probe key: the layer searched with it}
    computes = session.accelerator.get("inference_precision") or device["precision"]
    count = len(session.order_layers)
    for number, (layer, spec) in enumerate(session.order_layers.items(), start=1):
        started = time.perf_counter()
        key = probe_key(spec, device["batch_size"], device["precision"], computes,
                        positions or REPLAY_POSITIONS)
        terms, units, use_bias = spec["terms"], spec["units"], spec["use_bias"]
        if reuse and key in searched:
            first = searched[key]
            orders[layer] = {**orders[first], "searched_at": first}
            said = f"the same probe as {first}, reused"
        elif device["precision"] not in PROBE_VALUES:
            orders[layer] = {"error": f"{device['precision']}: no probe for this format"}
        elif computes in ("bfloat16", "float16") and computes != device["precision"]:
            # OpenVINO's bfloat16 default: ones are not exact there, nothing swamps alike
            orders[layer] = {"error": f"the runtime computes in {computes}"}
        else:
            grid, live = conv_grid(spec) if spec["class_name"] == "Conv2D" else ((1, 1), None)
            try:
                found = reveal_places(session.order_probe(spec, device["batch_size"]),
                                      terms, units, device["precision"], use_bias,
                                      device["batch_size"], grid, live,
                                      positions=positions or REPLAY_POSITIONS,
                                      border=conv_border(spec["config"], spec["kernel_shape"]))
                orders[layer] = found.entry(terms + (1 if use_bias else 0), use_bias)
            except OrderError as error:
                orders[layer] = {"error": str(error)}
            searched[key] = layer
        if "searched_at" not in orders[layer]:
            entry = orders[layer]
            said = (f"not revealed ({entry['error']})" if "error" in entry else order_name(
                [from_flat(tree, entry["terms"]) for tree in entry["trees"]],
                entry["places"], use_bias)) + f", {time.perf_counter() - started:.1f} s"
        if log is not None:
            print(f"bitdrift: {what}: order of {layer} ({number}/{count}): {said}", file=log,
                  flush=True)
    return orders


def probe_key(spec: dict, batch: int, precision: str, computes: str, positions: int) -> str:
    """What an order probe's calls depend on, as text: the layer's probe spec (its shapes
    and settings; an ONNX file's node by name, whose probe is that node cut from the
    file), the batch, the device's precision and the runtime's, and the positions
    searched; two layers of one key get bit-identical probe calls."""
    return json.dumps({"spec": spec, "batch": batch, "precision": precision,
                       "computes": computes, "positions": positions}, sort_keys=True)


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
          layer_select: list[str] | None = None, traced_samples: str = "all") -> None:
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
        for repeat in progress(range(device["repeats"]), f"{model_name} on {device_name}: "
                               "repeats", file=log):
            job = {"device": device, "device_name": device_name, "model_path": str(model_path),
                   "model_name": model_name, "dataset_path": str(dataset_path),
                   "samples": list(samples),
                   "full_samples": full, "layers": layers,
                   "out": str(Path(tmp) / f"repeat{repeat}.npz"),
                   "fingerprint": repeat == 0, "orders": repeat == 0 and kernels,
                   "order_positions": (replay or {}).get("replay_positions"),
                   "reference": str(reference) if reference else None,
                   "export": str(export) if export else None,
                   "deployed_export": str(deployed_export) if deployed_export else None,
                   "observe": observe, "model_format": model_format,
                   "error_file": str(Path(tmp) / f"repeat{repeat}.error"),
                   "log_is_terminal": log is sys.__stderr__}
            print(f"bitdrift: {model_name} on {device_name}: repeat {repeat + 1}/"
                  f"{device['repeats']} in {how}", file=log, flush=True)
            status = workers.run(job)
            if status != 0:
                raise InferenceError(f"device {device_name!r}, model {model_name!r}: repeat "
                                     f"{repeat + 1} failed (exit {status}){_why(job)}")
            with np.load(job["out"]) as data:  # lazy: the outputs stay on disk
                metas.append(json.loads(str(data["meta"])))
                deployed = deployed and batch_key(DEPLOYED, 0) in data.files
                if repeat == 0:
                    weights = {k: data[k] for k in data.files if k.startswith("weights/")}
                    classes = data["argmax"] if "argmax" in data.files else None
                    # a selection naming no layer is refused before the other repeats run
                    selected = selected_positions(metas[0]["layers"], layer_select,
                                                  model_name) if layers else set()
            files.append(job["out"])
        traced = traced_repeat(model_name, device_name, device, metas[0], {
            "device": device, "device_name": device_name, "model_path": str(model_path),
            "dataset_path": str(dataset_path), "samples": list(samples), "layers": layers,
            "full_samples": full, "out": str(Path(tmp) / "traced.npz"), "fingerprint": False,
            # an exported runtime maps its outputs to the layers by the reference
            "reference": str(reference) if reference else None,
            "export": str(export) if export else None, "trace": True,
            "model_format": model_format, "batches": traced_batches,
            "deployed_export": str(deployed_export) if deployed_export else None},
            Path(tmp) / "trace.txt", workers, how, log) if kernels else None
        with RecordWriter(out) as writer:
            match = merge_repeats(writer, files, metas[0], list(samples), full, selected,
                                  device["batch_size"], deployed,
                                  Path(tmp) / "traced.npz" if traced and traced["traced"]
                                  else None, traced_batches)
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
                                 replay=replay, log=log)
            writer.set_attrs(attrs)
            if traced is not None:
                writer.set_kernels(traced)


def full_sample_list(samples: list[int], full_samples) -> list[int]:
    """The samples whose layers keep their values (analysis.full_samples): None all, an
    integer N the first N of ``samples``, a list those of ``samples`` it names."""
    if full_samples is None:
        return list(samples)
    if isinstance(full_samples, int) and not isinstance(full_samples, bool):
        return list(samples)[:full_samples]
    unknown = [sample for sample in full_samples if sample not in samples]
    if unknown:
        raise InferenceError(f"config key analysis.full_samples: {unknown} not among the "
                             f"samples {list(samples)}")
    return [sample for sample in samples if sample in set(full_samples)]


def traced_batch_numbers(samples: list[int], full: list[int], batch_size: int,
                         traced_samples: str) -> list[int] | None:
    """The batches a traced repeat runs (analysis.traced_samples): None for every batch
    ("all"); for "full" those holding a full sample, the first batch where there is none.
    Every batch of a device has one shape (the last is filled up: batch_indices), so
    these run the kernels the others do; their samples alone are checked against the
    measured repeats (merge_repeats)."""
    if traced_samples == "all":
        return None
    if traced_samples != "full":
        raise InferenceError(f"config key analysis.traced_samples: {traced_samples!r} is "
                             "neither 'all' nor 'full'")
    rows = [samples.index(sample) for sample in full] or [0]
    return sorted({row // batch_size for row in rows})


def selected_positions(model_layers: list, layer_select, model_name: str) -> set[int]:
    """Positions of the layers analysis.layer_select names (by layer name or Keras class);
    None selects all. A name that is no layer or class of the model is refused in one line."""
    if layer_select is None:
        return set(range(len(model_layers)))
    names = {name for name, _ in model_layers} | {cls for _, cls in model_layers}
    unknown = [name for name in layer_select if name not in names]
    if unknown:
        raise InferenceError(
            f"config key analysis.layer_select: {', '.join(map(repr, unknown))} names no "
            f"layer or layer class of model {model_name!r} (classes: "
            f"{', '.join(sorted({cls for _, cls in model_layers}))})")
    return {position for position, (name, cls) in enumerate(model_layers)
            if name in layer_select or cls in layer_select}


def merge_repeats(writer: RecordWriter, files: list, meta: dict, samples: list[int],
                  full: list[int], selected: set[int], batch_size: int, deployed: bool,
                  traced: Path | None, traced_batches: list[int] | None = None) -> bool:
    """The repeats' files merged into the record a layer at a time: per layer, each
    repeat's batches read in turn (np.load reads one key at a time) and each sample's row
    added to its tensor, which keeps a repeat identical to one already written as its
    digest only. Memory: one batch of one layer. Returns whether the traced repeat's
    outputs equal the measured majority bit for bit (True without a traced repeat), on
    its batches (``traced_batches``; None: every batch)."""
    bfloat16 = bool(meta["bfloat16"])
    layer_entries = meta["layers"]
    last = meta["outputs"] - 1
    keep = set(full)
    match = True
    with contextlib.ExitStack() as stack:
        repeats = [stack.enter_context(np.load(path)) for path in files]
        traced_data = stack.enter_context(np.load(traced)) if traced else None

        def rows(data, position, numbers=None):
            """(row, digest, values or None where the repeat kept the digest only)."""
            for number in range(meta["batches"]) if numbers is None else numbers:
                digests, values = data[digest_key(position, number)], \
                    data[batch_key(position, number)]
                kept = iter(values)
                for offset, digest in enumerate(digests):
                    row = number * batch_size + offset
                    whole = position in (last, DEPLOYED) or samples[row] in keep
                    yield row, digest.tobytes(), next(kept) if whole else None
                del values

        outputs = [(position, position in selected) for position in range(last + 1)
                   if position in selected or position == last]
        if deployed:
            outputs.append((DEPLOYED, False))
        for position, is_layer in outputs:
            tensors: list[list] = [[] for _ in samples]
            for row, sample in enumerate(samples):
                if is_layer:
                    name, layer_class = layer_entries[position]
                    tensors[row].append(writer.tensor(sample, name, position=position,
                                                      class_name=layer_class,
                                                      values=sample in keep,
                                                      bfloat16=bfloat16))
                if position == last:
                    tensors[row].append(writer.tensor(sample, OUTPUT, final=True,
                                                      bfloat16=bfloat16))
                elif position == DEPLOYED:
                    tensors[row].append(writer.tensor(sample, DEPLOYED, final=True,
                                                      bfloat16=bfloat16))
            shape, dtype = meta["shapes"][str(position)]
            for data in repeats:
                for row, digest, values in rows(data, position):
                    for tensor in tensors[row]:
                        if values is None:
                            tensor.add_digest(digest, shape, dtype)
                        else:
                            tensor.add(values)
            if traced_data is not None and position != DEPLOYED:
                for row, digest, _ in rows(traced_data, position, traced_batches):
                    # the majority of the measured repeats, a tie to the first seen
                    majority = Counter(tensors[row][0].digests).most_common(1)[0][0]
                    match = match and majority == digest
            for found in tensors:
                for tensor in found:
                    tensor.close()
    return match


class _FirstRepeats(Mapping):
    """{layer: repeat 0 of every full sample, stacked}, each read from the record being
    written when asked (the replay takes a layer and its input at a time)."""

    def __init__(self, writer: RecordWriter, names: list[str], samples: list[int]):
        self._writer, self._names, self._samples = writer, names, samples

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(name)
        return np.stack([self._writer.read(sample, name).values[0]
                         for sample in self._samples])

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


def record_attrs(writer: RecordWriter, meta: dict, weights: dict, classes, expected,
                 full: list[int], selected: set[int], deployed: bool, *, model_name,
                 device_name, device, model_path, dataset_path, samples, layers, export,
                 deployed_export, replay, log) -> dict:
    """The record's root attributes, the checks among them made from the values the
    record holds (read back from ``writer``, a layer at a time)."""
    layer_names = [name for position, (name, _) in enumerate(meta["layers"])
                   if position in selected]
    sample_images = read_test_images(dataset_path, list(samples))
    full_images = sample_images[[list(samples).index(sample) for sample in full]]
    # no check without a sample whose layers keep their values (analysis.full_samples: 0):
    # the record then says unchecked (bitdrift.analysis.effective_precision.unchecked_reason)
    effective = check_effective_precision(
        meta.get("checked", {}), weights, lambda sample, name: writer.read(
            sample, name).values if name in layer_names else None,
        full, full_images, device["precision"]) if layers and full else None
    orders = meta.get("orders")
    if orders:
        from bitdrift.analysis.accumulation.replay import replay_layers

        # Every revealed order is named; without recorded layers there is nothing to
        # replay it against, and replay_layers says so per layer
        first = _FirstRepeats(writer, layer_names if full else [], full)

        def report(layer, number, count, entry, seconds):  # a line per layer: minutes in all
            said = "none, its order not revealed" if entry["order"] == "not revealed" \
                else entry["replay"]
            print(f"bitdrift: {model_name} on {device_name}: replay of {layer} ({number}/"
                  f"{count}): {said}, {seconds:.1f} s", file=log, flush=True)

        orders = replay_layers(orders, meta.get("checked", {}) if layers else {}, weights,
                               first, device["precision"], full_images.astype(np.float32),
                               **(replay or {}), report=report)
    finding = describe_reduced(effective or {}, device, device_name, model_name)
    if finding:
        print(finding, file=log, flush=True)
    from bitdrift.run.devices import emulation_host

    attrs = {
        "model": model_name, "device": device_name, "backend": device["backend"],
        "precision": device["precision"], "fingerprint": emulation_host(meta["fingerprint"]),
        "model_sha256": model_digest(model_path), "input_sha256": input_sha256(sample_images),
        "accelerator": device["accelerator"], "batch_size": device["batch_size"],
        "repeats": device["repeats"], "device_config": json.dumps(device, sort_keys=True),
        # the rows the samples ran in (the record lists them sorted): bitdrift.run.repro
        "samples_order": json.dumps([int(sample) for sample in samples]),
    }
    if list(full) != list(samples):
        attrs["full_samples"] = json.dumps([int(sample) for sample in full])
    if effective is not None:
        attrs["effective_precision"] = json.dumps(effective, sort_keys=True)
    if meta.get("unmapped"):
        attrs["unmapped_layers"] = json.dumps(meta["unmapped"])
    if orders:
        attrs["accumulation_orders"] = json.dumps(orders, sort_keys=True)
    if export:
        attrs["export_sha256"] = file_digest(export)
    if deployed:
        from bitdrift.analysis.observer import observer_check

        bfloat16 = bool(meta["bfloat16"])
        check = observer_check({sample: {
            OUTPUT: writer.read(sample, OUTPUT, final=True).values,
            DEPLOYED: writer.read(sample, DEPLOYED, final=True).values,
            "bfloat16": bfloat16} for sample in samples}, meta.get("deployed_program", ""))
        attrs["observer_check"] = json.dumps(check, sort_keys=True)
        if deployed_export:
            attrs["deployed_export_sha256"] = file_digest(deployed_export)
        if not check["equal"]:
            print(f"bitdrift: warning: device {device_name!r}: {check['summary']}", file=log,
                  flush=True)
    if expected is not None and classes is not None:
        reduced = bool(finding) or (meta["fingerprint"] or {}).get("accelerator", {}).get(
            "final_output_mapping") == "reduced"
        agreement = check_agreement(classes, expected, device, device_name, model_name,
                                    reduced=reduced)
        attrs["argmax_agreement"] = json.dumps(agreement, sort_keys=True)
    return attrs


def _why(job: dict) -> str:
    """': <the worker's one-line error>' (bitdrift.run.workers writes it beside the job's
    files), else '; see log'."""
    path = Path(job.get("error_file") or "")
    if not path.is_file():
        return "; see log"
    return f": {path.read_text(errors='replace').strip()}"


def traced_repeat(model_name: str, device_name: str, device: dict, meta: dict, job: dict,
                  trace_path: Path, workers, how: str, log) -> dict:
    """One more repeat with the libraries' kernel logging on (the runtime's
    trace_environment), its C-level stdout in ``trace_path``, its outputs in job["out"];
    the kernels per layer. Whether its outputs equal the measured majority bit for bit
    (logging must not change what is computed; the record keeps the measured outputs
    either way) is found as the repeats are merged (merge_repeats: outputs_match)."""
    from dataclasses import asdict

    from bitdrift import backends
    from bitdrift.analysis.kernels import DEPLOYED_LAYER, KernelCall, layer_kernels, parse_trace

    layer_classes = {name: layer_class for name, layer_class in meta["layers"]}
    environment = backends.get(device["backend"]).trace_environment(device)
    if environment is None:
        return {"traced": False, "layer_classes": layer_classes, "order": list(layer_classes),
                "reason": f"backend {device['backend']!r} logs no kernel per call",
                "layers": {name: {"signature": "untraced", "calls": []}
                           for name in layer_classes}}
    size, numbers = device["batch_size"], job.get("batches")
    # analysis.traced_samples: full runs the batches of the full samples alone
    traced_samples = None if numbers is None else [
        sample for number in numbers for sample in job["samples"][number * size:
                                                                 (number + 1) * size]]
    which = "" if traced_samples is None else (
        f" on the batches of samples {traced_samples} alone (analysis.traced_samples: full)")
    print(f"bitdrift: {model_name} on {device_name}: traced repeat (kernel logs) in "
          f"{how}{which}", file=log, flush=True)
    with open(trace_path, "w") as stdout:
        status = workers.run(job, stdout=stdout, environment=environment)
    if status != 0:
        raise InferenceError(f"device {device_name!r}, model {model_name!r}: the traced "
                             f"repeat failed (exit {status}); see log")
    with np.load(job["out"]) as data:
        traced_meta = json.loads(str(data["meta"]))
        described = traced_meta.get("runtime_kernels")
    trace = parse_trace(trace_path.read_text(errors="replace"))
    # the deployed run's kernels, logged apart (bitdrift.backends.keras.common)
    deployed_calls = trace.layers.pop(DEPLOYED_LAYER, None)
    if described is not None:  # the exported runtimes describe their compiled graph
        trace.layers = {layer: [KernelCall(**call) for call in calls]
                        for layer, calls in described.items()}
        trace.header["source"] = f"{device['backend']}'s description of its compiled graph"
    found = layer_kernels(trace, meta["layers"], device["backend"], device["accelerator"])
    unknown = [name for name, entry in found.items() if entry["signature"] == "unknown"]
    if unknown:
        print(f"bitdrift: warning: device {device_name!r}: no kernel logged for "
              f"{', '.join(unknown)} (recorded as unknown)", file=log, flush=True)
    gpu_calls = [call for entry in found.values() for call in entry["calls"]
                 if call["library"] in ("cudnn", "cublaslt")]
    if device["accelerator"] == "gpu" and described is None and found and not gpu_calls:
        raise InferenceError(f"device {device_name!r}: its traced repeat logged no cuDNN or "
                             f"cuBLASLt call ({', '.join(sorted(environment))} set): the GPU "
                             "libraries are not logging, or the work did not run on the GPU")
    traced = {"traced": True, "outputs_match": True, "environment": environment,
              "header": trace.header, "raw": trace.raw, "outside": trace.outside,
              "layers": found, "layer_classes": layer_classes, "order": list(layer_classes)}
    if traced_samples is not None:
        traced["samples"] = [int(sample) for sample in traced_samples]
    graphs = traced_meta.get("deployed_kernels")
    if deployed_calls is not None and described is None:
        graphs = {"deployed": [asdict(call) for call in deployed_calls],
                  "instrumented": [call for name, _ in meta["layers"]
                                   for call in found[name]["calls"]]}
    if graphs:
        from bitdrift.analysis.observer import compare_kernels

        traced["deployed"] = compare_kernels(graphs)
    return traced


def check_agreement(classes, reference, device: dict, device_name: str,
                    model_name: str, reduced: bool = False) -> dict:
    """The device's agreement with TensorFlow's classes; a float32 or float64 device below
    ARGMAX_AGREEMENT is a bug in a runtime or an export, not a class of its own. A device
    found computing in a narrower format (``reduced``) must still reach
    ARGMAX_AGREEMENT_REDUCED: a wrong export classes near chance."""
    from bitdrift.backends.keras.export import (
        ARGMAX_AGREEMENT,
        ARGMAX_AGREEMENT_REDUCED,
        argmax_agreement,
    )

    agreement = argmax_agreement(classes, reference)
    floor = ARGMAX_AGREEMENT_REDUCED if reduced else ARGMAX_AGREEMENT
    if device["precision"] in ("float32", "float64") and agreement["share"] < floor:
        computed = " (it computes in a narrower format)" if reduced else ""
        raise InferenceError(
            f"device {device_name!r}, model {model_name!r}: its class agrees with "
            f"TensorFlow's on {agreement['agreeing']} of {agreement['images']} test images "
            f"({agreement['share']:.1%}, below {floor:.0%}{computed}): a bug in the runtime "
            "or the export, not a class of its own")
    return agreement


def check_effective_precision(checked: dict, weights: dict, read, samples: list[int],
                              sample_images: np.ndarray, precision: str) -> dict:
    """{layer: effective-precision result} over ``samples`` (the worst), from the record's
    own activations (see bitdrift.analysis.effective_precision): ``read(sample, layer)`` gives a
    layer's (repeats, ...) values, None where the layer is not recorded."""
    from bitdrift.analysis.effective_precision import check_layer, merge
    from bitdrift.inputs.models import numpy_dtype

    def as_float(values):
        return values.view(numpy_dtype("bfloat16")) if precision == "bfloat16" else values

    images = sample_images.astype(numpy_dtype(precision))
    results = {}
    for row, sample in enumerate(samples):
        for name, spec in checked.items():
            outputs = read(sample, name)
            if outputs is None:
                continue
            if spec["inbound"]:
                inputs = read(sample, spec["inbound"])
                if inputs is None:
                    results.setdefault(name, []).append({"unchecked": (
                        f"its input {spec['inbound']} is not recorded (analysis.layer_select)")})
                    continue
            else:
                inputs = np.repeat(images[row][None], outputs.shape[0], axis=0)
            kernel = weights[f"weights/{name}/0"]
            bias = weights.get(f"weights/{name}/1") if spec["use_bias"] else None
            results.setdefault(name, []).append(check_layer(
                spec, as_float(inputs), as_float(outputs), kernel, bias, precision))
    return {name: merge(parts) for name, parts in results.items()}


if __name__ == "__main__":
    worker_main(run_repeat)
