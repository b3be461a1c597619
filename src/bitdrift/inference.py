"""Per-device inference: every layer's output for the configured samples, repeated.

Each repeat runs in a process of its own with the device's environment, in which nothing has
run before it (the reference study's protocol: autotuning, thread pools and CPU dispatch are
decided per process): a fresh process, or for a runtime that allows it a child forked from a
parent that has only imported the framework (bitdrift.prefork).
The parent merges the repeats into one record (see bitdrift.record) written atomically.

    python -m bitdrift.inference WORKER_JSON   # one repeat; used by infer()
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np

from bitdrift.atomic import work_folder
from bitdrift.datasets import (
    check_samples,
    count_test_images,
    file_digest,
    read_test_images,
    test_image_shape,
)
from bitdrift.effective_precision import describe_reduced
from bitdrift.errors import InferenceError
from bitdrift.forkserver import repeat_workers
from bitdrift.models import model_digest, model_input_shape
from bitdrift.prefork import worker_main
from bitdrift.progress import progress
from bitdrift.provenance import input_sha256
from bitdrift.record import DEPLOYED, OUTPUT, write_record


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
    from bitdrift.devices import fingerprint
    from bitdrift.models import numpy_dtype

    device, name = job["device"], job["device_name"]
    session = backends.get(device["backend"]).open_session(job, name)
    first = job.get("fingerprint", True)
    indices = batch_indices(job["samples"], device["batch_size"],
                            count_test_images(job["dataset_path"]))
    dtype = numpy_dtype(device["precision"])
    images = read_test_images(job["dataset_path"], indices).astype(dtype)
    results: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(indices), device["batch_size"]):
        for position, value in enumerate(session.run(images[start:start + device["batch_size"]])):
            results.setdefault(str(position), []).append(np.asarray(value))
    if session.deployed is not None and job.get("observe", True):
        # the observer check (bitdrift.observer): the model as deployed, after the
        # instrumented run in the same process, on the same batches
        results[DEPLOYED] = [np.asarray(session.deployed(images[start:start + device[
            "batch_size"]])) for start in range(0, len(indices), device["batch_size"])]
    arrays = {}
    for position, parts in results.items():
        stacked = np.concatenate(parts)[: len(job["samples"])]
        if stacked.dtype.name == "bfloat16":
            stacked = stacked.view(np.uint16)
        arrays[position] = stacked
    # The first repeat also classifies the reference's test images (the argmax check
    # against TensorFlow, see bitdrift.export) and describes the machine; py-cpuinfo
    # takes about a second per call, so the other repeats skip both.
    if first and job.get("reference"):
        from bitdrift.reference import read_reference

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
    if session.deployed_kernels is not None:  # and of its deployed graph (bitdrift.observer)
        meta["deployed_kernels"] = session.deployed_kernels
    if job.get("orders") and session.order_probe is not None:
        meta["orders"] = reveal_orders(session, device)
    # The libraries' kernel lines of a traced repeat are flushed by the worker's exit
    # (bitdrift.prefork.exit_now), fresh or forked.
    np.savez(job["out"], meta=json.dumps(meta), **arrays, **weights)


WORKER = "bitdrift.inference:run_repeat"


def reveal_orders(session, device: dict) -> dict:
    """{layer: {"trees", ...} or {"error"}}: the order each Dense and Conv2D layer sums in,
    revealed through this runtime at the layer's shapes and the device's batch size
    (bitdrift.accumulation): at every batch row and, for a Conv2D, every output pixel;
    in every format a device runs (float16 and bfloat16 with the probe values they hold)."""
    from bitdrift.accumulation import PROBE_VALUES, OrderError, conv_grid, reveal_places

    orders = {}
    computes = session.accelerator.get("inference_precision") or device["precision"]
    for layer, spec in session.order_layers.items():
        terms, units, use_bias = spec["terms"], spec["units"], spec["use_bias"]
        if device["precision"] not in PROBE_VALUES:
            orders[layer] = {"error": f"{device['precision']}: no probe for this format"}
            continue
        if computes in ("bfloat16", "float16") and computes != device["precision"]:
            # OpenVINO's bfloat16 default: ones are not exact there, nothing swamps alike
            orders[layer] = {"error": f"the runtime computes in {computes}"}
            continue
        grid, live = conv_grid(spec) if spec["class_name"] == "Conv2D" else ((1, 1), None)
        try:
            found = reveal_places(session.order_probe(spec, device["batch_size"]), terms,
                                  units, device["precision"], use_bias,
                                  device["batch_size"], grid, live)
            orders[layer] = found.entry(terms + (1 if use_bias else 0), use_bias)
        except OrderError as error:
            orders[layer] = {"error": str(error)}
    return orders


def check_before_repeats(model_path, dataset_path, samples: list[int], out) -> None:
    """What would otherwise fail only after the repeats' start-up: a missing model or
    dataset, sample indices beyond the test set, an output folder that cannot be written."""
    for kind, path in (("model", model_path), ("dataset", dataset_path)):
        if not Path(path).is_file():
            raise InferenceError(f"{path}: {kind} file does not exist")
    check_samples(dataset_path, samples)
    expected = model_input_shape(model_path)
    images = test_image_shape(dataset_path)
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
          replay: dict | None = None) -> None:
    """Run all repeats of one (model, device), each in a process of its own (fresh, or
    forked from a pre-imported parent: bitdrift.prefork), and write the record.

    ``reference`` (bitdrift.export's reference.npz of the model): the device's classes of
    the first test images are compared with TensorFlow's, and a float32/float64 device
    that agrees on fewer than 99 % fails. ``export``: the exported file an exported
    runtime runs, ``deployed_export`` the model converted with its final output alone:
    each repeat also runs the model as deployed, and the record holds whether its final
    output equals the instrumented run's (bitdrift.observer; a Keras runtime needs no
    file; ``observe=False`` leaves the check out, for the studies that run many inputs
    on the outputs alone). ``kernels``: after the measured repeats, one traced repeat in
    a process of its own records which kernel ran in every layer (bitdrift.kernels), and
    for an exported runtime the deployed graph's kernels beside the instrumented graph's.
    ``replay``: the replay's settings (config analysis.replay, replay_positions,
    replay_samples; bitdrift.accumulation.replay_layers), its defaults where None."""
    check_before_repeats(model_path, dataset_path, samples, out)
    expected = None
    if reference:
        from bitdrift.reference import read_reference

        expected = read_reference(reference)
        if expected.model_sha256 != model_digest(model_path):
            raise InferenceError(f"{reference}: the export reference of another model than "
                                 f"{model_path}")
    repeats, deployed, weights, classes = [], [], {}, None
    with terminate_cleanly(), work_folder(out) as tmp, repeat_workers(
            WORKER, device, f"device {device_name!r}", log) as workers:
        how = workers.HOW
        for repeat in progress(range(device["repeats"]), f"{model_name} on {device_name}: "
                               "repeats", file=log):
            job = {"device": device, "device_name": device_name, "model_path": str(model_path),
                   "dataset_path": str(dataset_path), "samples": list(samples),
                   "layers": layers, "out": str(Path(tmp) / f"repeat{repeat}.npz"),
                   "fingerprint": repeat == 0, "orders": repeat == 0 and kernels,
                   "reference": str(reference) if reference else None,
                   "export": str(export) if export else None,
                   "deployed_export": str(deployed_export) if deployed_export else None,
                   "observe": observe, "error_file": str(Path(tmp) / f"repeat{repeat}.error"),
                   "log_is_terminal": log is sys.__stderr__}
            print(f"bitdrift: {model_name} on {device_name}: repeat {repeat + 1}/"
                  f"{device['repeats']} in {how}", file=log, flush=True)
            status = workers.run(job)
            if status != 0:
                raise InferenceError(f"device {device_name!r}, model {model_name!r}: repeat "
                                     f"{repeat + 1} failed (exit {status}){_why(job)}")
            with np.load(job["out"]) as data:
                meta = json.loads(str(data["meta"]))
                if repeat == 0:
                    weights = {k: data[k] for k in data.files if k.startswith("weights/")}
                    classes = data["argmax"] if "argmax" in data.files else None
                repeats.append((meta, {k: data[k] for k in data.files
                                       if k.isdigit()}))
                deployed.append(data[DEPLOYED] if DEPLOYED in data.files else None)
        traced = traced_repeat(model_name, device_name, device, repeats, {
            "device": device, "device_name": device_name, "model_path": str(model_path),
            "dataset_path": str(dataset_path), "samples": list(samples), "layers": layers,
            "out": str(Path(tmp) / "traced.npz"), "fingerprint": False,
            # an exported runtime maps its outputs to the layers by the reference
            "reference": str(reference) if reference else None,
            "export": str(export) if export else None, "trace": True,
            "deployed_export": str(deployed_export) if deployed_export else None},
            Path(tmp) / "trace.txt", workers, how, log) if kernels else None
    meta = repeats[0][0]
    layer_names = [name for name, _ in meta["layers"]]
    n_outputs = len(repeats[0][1])
    samples_content = {}
    for row, sample in enumerate(samples):
        stacked = [np.stack([arrays[str(p)][row] for _, arrays in repeats])
                   for p in range(n_outputs)]
        content = {OUTPUT: stacked[-1]}
        if layers:
            content["layers"] = list(zip(layer_names, stacked, strict=True))
            content["layer_classes"] = [cls for _, cls in meta["layers"]]
        if all(values is not None for values in deployed):
            content[DEPLOYED] = np.stack([values[row] for values in deployed])
        samples_content[sample] = content
    if meta["bfloat16"]:
        for content in samples_content.values():
            content["bfloat16"] = True
    sample_images = read_test_images(dataset_path, list(samples))
    effective = check_effective_precision(meta.get("checked", {}), weights, samples_content,
                                          sample_images, device["precision"]) \
        if layers else None
    orders = meta.get("orders")
    if orders:
        from bitdrift.accumulation import replay_layers

        # Every revealed order is named; without recorded layers there is nothing to
        # replay it against, and replay_layers says so per layer
        first = {}
        if layers:
            per_sample = [dict(content["layers"]) for content in samples_content.values()]
            first = {name: np.stack([outputs[name][0] for outputs in per_sample])
                     for name in layer_names}  # repeat 0 of every sample
        orders = replay_layers(orders, meta.get("checked", {}) if layers else {}, weights,
                               first, device["precision"], sample_images.astype(np.float32),
                               **(replay or {}))
    finding = describe_reduced(effective or {}, device, device_name, model_name)
    if finding:
        print(finding, file=log, flush=True)
    from bitdrift.devices import emulation_host

    attrs = {
        "model": model_name, "device": device_name, "backend": device["backend"],
        "precision": device["precision"], "fingerprint": emulation_host(meta["fingerprint"]),
        "model_sha256": model_digest(model_path), "input_sha256": input_sha256(sample_images),
        "accelerator": device["accelerator"], "batch_size": device["batch_size"],
        "repeats": device["repeats"], "device_config": json.dumps(device, sort_keys=True),
        # the rows the samples ran in (the record lists them sorted): bitdrift.repro
        "samples_order": json.dumps([int(sample) for sample in samples]),
    }
    if effective is not None:
        attrs["effective_precision"] = json.dumps(effective, sort_keys=True)
    if meta.get("unmapped"):
        attrs["unmapped_layers"] = json.dumps(meta["unmapped"])
    if orders:
        attrs["accumulation_orders"] = json.dumps(orders, sort_keys=True)
    if export:
        attrs["export_sha256"] = file_digest(export)
    if all(values is not None for values in deployed):
        from bitdrift.observer import observer_check

        check = observer_check(samples_content, meta.get("deployed_program", ""))
        attrs["observer_check"] = json.dumps(check, sort_keys=True)
        if deployed_export:
            attrs["deployed_export_sha256"] = file_digest(deployed_export)
        if not check["equal"]:
            print(f"bitdrift: warning: device {device_name!r}: {check['summary']}", file=log,
                  flush=True)
    if reference and classes is not None:
        reduced = bool(finding) or (meta["fingerprint"] or {}).get("accelerator", {}).get(
            "final_output_mapping") == "reduced"
        agreement = check_agreement(classes, expected, device, device_name, model_name,
                                    reduced=reduced)
        attrs["argmax_agreement"] = json.dumps(agreement, sort_keys=True)
    write_record(out, attrs, samples_content, kernels=traced)


def _why(job: dict) -> str:
    """': <the worker's one-line error>' (bitdrift.prefork writes it beside the job's
    files), else '; see log'."""
    path = Path(job.get("error_file") or "")
    if not path.is_file():
        return "; see log"
    return f": {path.read_text(errors='replace').strip()}"


def traced_repeat(model_name: str, device_name: str, device: dict, repeats: list, job: dict,
                  trace_path: Path, workers, how: str, log) -> dict:
    """One more repeat with the libraries' kernel logging on (the runtime's
    trace_environment), its C-level stdout in ``trace_path``; the kernels per layer, and
    whether its outputs equal the measured majority bit for bit (logging must not change
    what is computed; the record keeps the measured outputs either way)."""
    from dataclasses import asdict

    from bitdrift import backends
    from bitdrift.kernels import DEPLOYED_LAYER, KernelCall, layer_kernels, parse_trace

    meta = repeats[0][0]
    layer_classes = {name: layer_class for name, layer_class in meta["layers"]}
    environment = backends.get(device["backend"]).trace_environment(device)
    if environment is None:
        return {"traced": False, "layer_classes": layer_classes, "order": list(layer_classes),
                "reason": f"backend {device['backend']!r} logs no kernel per call",
                "layers": {name: {"signature": "untraced", "calls": []}
                           for name in layer_classes}}
    print(f"bitdrift: {model_name} on {device_name}: traced repeat (kernel logs) in {how}",
          file=log, flush=True)
    with open(trace_path, "w") as stdout:
        status = workers.run(job, stdout=stdout, environment=environment)
    if status != 0:
        raise InferenceError(f"device {device_name!r}, model {model_name!r}: the traced "
                             f"repeat failed (exit {status}); see log")
    with np.load(job["out"]) as data:
        traced_meta = json.loads(str(data["meta"]))
        described = traced_meta.get("runtime_kernels")
        outputs = {key: data[key] for key in data.files if key.isdigit()}
    trace = parse_trace(trace_path.read_text(errors="replace"))
    # the deployed run's kernels, logged apart (bitdrift.backends.keras_common)
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
    match = all(np.array_equal(values, _majority([arrays[key] for _, arrays in repeats]))
                for key, values in outputs.items())
    if not match:
        print(f"bitdrift: warning: device {device_name!r}: the traced repeat's outputs differ "
              "from the measured majority; the record keeps the measured ones",
              file=log, flush=True)
    traced = {"traced": True, "outputs_match": match, "environment": environment,
              "header": trace.header, "raw": trace.raw, "outside": trace.outside,
              "layers": found, "layer_classes": layer_classes, "order": list(layer_classes)}
    graphs = traced_meta.get("deployed_kernels")
    if deployed_calls is not None and described is None:
        graphs = {"deployed": [asdict(call) for call in deployed_calls],
                  "instrumented": [call for name, _ in meta["layers"]
                                   for call in found[name]["calls"]]}
    if graphs:
        from bitdrift.observer import compare_kernels

        traced["deployed"] = compare_kernels(graphs)
    return traced


def _majority(arrays: list[np.ndarray]) -> np.ndarray:
    """The most common of the repeats' arrays, bit for bit."""
    counts = Counter(array.tobytes() for array in arrays)
    best = counts.most_common(1)[0][0]
    return next(array for array in arrays if array.tobytes() == best)


def check_agreement(classes, reference, device: dict, device_name: str,
                    model_name: str, reduced: bool = False) -> dict:
    """The device's agreement with TensorFlow's classes; a float32 or float64 device below
    ARGMAX_AGREEMENT is a bug in a runtime or an export, not a class of its own. A device
    found computing in a narrower format (``reduced``) must still reach
    ARGMAX_AGREEMENT_REDUCED: a wrong export classes near chance."""
    from bitdrift.export import ARGMAX_AGREEMENT, ARGMAX_AGREEMENT_REDUCED, argmax_agreement

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


def check_effective_precision(checked: dict, weights: dict, samples_content: dict,
                              sample_images: np.ndarray, precision: str) -> dict:
    """{layer: effective-precision result} over all samples (the worst), from the record's
    own activations (see bitdrift.effective_precision)."""
    from bitdrift.effective_precision import check_layer, merge
    from bitdrift.models import numpy_dtype

    def as_float(values):
        return values.view(numpy_dtype("bfloat16")) if precision == "bfloat16" else values

    images = sample_images.astype(numpy_dtype(precision))
    results = {}
    for row, content in enumerate(samples_content.values()):
        outputs = {name: values for name, values in content.get("layers", [])}
        repeats = next(iter(outputs.values())).shape[0] if outputs else 1
        for name, spec in checked.items():
            if name not in outputs:
                continue
            inputs = outputs[spec["inbound"]] if spec["inbound"] else \
                np.repeat(images[row][None], repeats, axis=0)
            kernel = weights[f"weights/{name}/0"]
            bias = weights.get(f"weights/{name}/1") if spec["use_bias"] else None
            results.setdefault(name, []).append(check_layer(
                spec, as_float(inputs), as_float(outputs[name]), kernel, bias, precision))
    return {name: merge(parts) for name, parts in results.items()}


if __name__ == "__main__":
    worker_main(run_repeat)
