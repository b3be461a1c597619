"""The traced repeat: one more repeat of a device, after the measured ones, with its
libraries' kernel logging on, parsed into the kernels each layer ran (the record's
``kernels`` dataset; bitdrift.analysis.kernels)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bitdrift.errors import InferenceError
from bitdrift.run.repeat import RepeatJob


def traced_repeat(model_name: str, device_name: str, device: dict, meta: dict,
                  job: RepeatJob, trace_path: Path, workers, how: str, log) -> dict:
    """One more repeat with the libraries' kernel logging on (the runtime's
    trace_environment), its C-level stdout in ``trace_path``, its outputs in job.out;
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
    size, numbers = device["batch_size"], job.batches
    # analysis.traced_samples: full runs the batches of the full samples alone
    traced_samples = None if numbers is None else [
        sample for number in numbers for sample in job.samples[number * size:
                                                              (number + 1) * size]]
    which = "" if traced_samples is None else (
        f" on the batches of samples {traced_samples} alone (analysis.traced_samples: full)")
    print(f"bitdrift: {model_name} on {device_name}: traced repeat (kernel logs) in "
          f"{how}{which}", file=log, flush=True)
    with open(trace_path, "w") as stdout:
        status = workers.run(job.as_dict(), stdout=stdout, environment=environment)
    if status != 0:
        raise InferenceError(f"device {device_name!r}, model {model_name!r}: the traced "
                             f"repeat failed (exit {status}); see log")
    with np.load(job.out) as data:
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
