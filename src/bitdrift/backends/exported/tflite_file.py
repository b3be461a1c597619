"""A .tflite file run as it is by LiteRT (bitdrift.backends.exported.litert, its resolver
and threads as device keys): a user's own, or a model of another format converted to one
(bitdrift.backends.torch_program.converted).

The per-layer record names each value by the file's own tensor names: every float tensor
a node outputs, in the interpreter's execution order, the final outputs last
(bitdrift.formats.tflite.file_tensors), read from an interpreter that keeps every tensor
(LiteRT's ``experimental_preserve_all_tensors``). A tensor a delegate (XNNPACK) computes
inside itself without writing it is recorded as absent for that device (``unmapped``),
never given another value."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bitdrift.backends.exported.common import cannot_run
from bitdrift.errors import BitdriftError, InferenceError
from bitdrift.formats.tflite import NAME, SUMMING_OPS, file_tensors, load_interpreter


def open_session(runtime, job: dict, name: str):
    """A Session of LiteRT on the user's own .tflite (file_session on the file itself)."""
    return file_session(runtime, job, name, job["model_path"])


def file_session(runtime, job: dict, name: str, path, rename=None,
                 program: str | None = None, accelerator: dict | None = None):
    """A Session of LiteRT on the .tflite at ``path`` (the user's file, or a conversion
    of it: bitdrift.backends.torch_program.converted) with the device's resolver and
    threads: every tensor of file_tensors recorded, those a delegate keeps inside listed
    as unmapped; the file run without keeping its tensors is the model as deployed (the
    observer check).
    ``rename(tensors, values)``, given file_tensors and their values on the first batch
    of the inputs, returns ({tensor index: (layer, class, axes)}: the tensors recorded
    under those names, transposed by ``axes`` where not None, the final output last
    whatever it says; [the layers it finds no tensor for]). ``program``: what the
    deployed run runs; ``accelerator``: the fingerprint's, where the caller has begun it
    (a conversion's)."""
    from bitdrift.backends import Session
    from bitdrift.inputs.datasets import first_batch

    device, shown = job["device"], job["model_path"]
    if accelerator is None:
        accelerator = runtime.check_accelerator(name, device)
        accelerator["model_format"] = NAME
    trace = bool(job.get("trace"))
    tensors = file_tensors(path)
    finals = len(load_interpreter(path).get_output_details())
    batch = device["batch_size"]
    first = first_batch(job["dataset_path"], batch)
    try:
        compiled, describe = runtime.compile(path, device, accelerator, trace,
                                             tensors=[index for index, _, _ in tensors])
        values = compiled(first)  # the delegate is applied by the first run
        deployed_run = None
        if not trace:
            deployed_run, _ = runtime.compile(path, device, dict(accelerator), False)
            deployed_run(first)
        nodes_outputs = describe() if trace else None
    except BitdriftError:
        raise
    except Exception as error:  # the interpreter's ValueError, RuntimeError
        raise cannot_run(runtime, shown, name, error) from error
    if any(value is None for value in values[-finals:]):
        raise InferenceError(f"device {name!r}: {runtime.NAME} gives no value for a final "
                             f"output of {Path(shown).name}")
    # (position among the tensors, layer, class, axes) of each recorded value
    left_out = [tensors[position][1] for position, value in enumerate(values)
                if value is None]
    if rename is None:
        recorded = [(position, layer, op, None) for position, (_, layer, op)
                    in enumerate(tensors) if values[position] is not None]
    else:
        names, not_found = rename(tensors, values)
        recorded = [(position, *names[index]) for position, (index, _, _)
                    in enumerate(tensors[:-finals]) if index in names]
        recorded += [(position, *names.get(index, (layer, op, None))) for position,
                     (index, layer, op) in enumerate(tensors) if position >= len(tensors)
                     - finals]
        left_out = list(not_found)

    def run(batch):
        outputs = compiled(batch)
        if not job["layers"]:
            return [outputs[-1]]
        if any(outputs[position] is None for position, *_ in recorded):  # never guessed
            raise InferenceError(f"device {name!r}: {runtime.NAME} stopped writing a tensor "
                                 f"of {Path(shown).name} it wrote in its first run")
        return [outputs[position] if axes is None else
                np.ascontiguousarray(outputs[position].transpose(axes))
                for position, _, _, axes in recorded]

    def final(batch):
        return compiled(batch)[-1]

    def deployed(batch):
        return deployed_run(batch)[-1]

    kernels = None
    if trace:
        from dataclasses import asdict

        from bitdrift.analysis.kernels import graph_layer_calls

        nodes, outputs = nodes_outputs
        found = graph_layer_calls(nodes, outputs, {position: layer for position, layer, _, _
                                                   in recorded})
        kernels = {layer: [asdict(call) for call in calls] for layer, calls in found.items()}
    layers = [(layer, kind) for _, layer, kind, _ in recorded]
    # named as the record names the layers (HDF5 takes "/" for a path: bitdrift.record.hdf5)
    from bitdrift.record.hdf5 import _sanitize

    unrevealed = {_sanitize(layer): f"a .tflite file's own {op} node, whose order is not "
                                    "probed yet" for layer, op in layers if op in SUMMING_OPS}
    return Session(layers=layers if job["layers"] else [], run=run, final=final,
                   accelerator=accelerator, unmapped=left_out if job["layers"] else [],
                   kernels=kernels, unrevealed=unrevealed if job["layers"] else {},
                   deployed=deployed if deployed_run is not None else None,
                   deployed_program=program or f"{Path(shown).name} on {runtime.NAME}, "
                                               "as given")
