"""LiteRT flatbuffers (``.tflite``: the file identifier ``TFL3`` at bytes 4..8), run as
they are by LiteRT (bitdrift.backends.exported.litert, its resolver and threads as device keys).

The per-layer record names each value by the file's own tensor names: every float tensor
a node outputs, in the interpreter's execution order, the final outputs last, read from
an interpreter that keeps every tensor (LiteRT's ``experimental_preserve_all_tensors``).
A tensor a delegate (XNNPACK) computes inside itself without writing it is recorded as
absent for that device (``unmapped``), never given another value."""

from __future__ import annotations

import numpy as np

from bitdrift.errors import ModelFormatError
from bitdrift.formats import Input

NAME = "tflite"
WHAT = "a LiteRT .tflite flatbuffer"
RUNTIMES = ("litert",)
file_layers = None  # no reading of its layers' weights yet


def recognise(path, head: bytes) -> bool:
    return head[4:8] == b"TFL3"


def _interpreter(path):
    from ai_edge_litert import interpreter

    try:
        return interpreter.Interpreter(model_path=str(path))
    except (ValueError, RuntimeError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ModelFormatError(f"{path}: a damaged LiteRT .tflite file ({first})") from error


def check(path) -> None:
    _interpreter(path)


def signature(path) -> list[Input]:
    return [Input(detail["name"],
                  tuple(None if dim < 0 else int(dim) for dim in detail["shape_signature"]),
                  np.dtype(detail["dtype"]).name)
            for detail in _interpreter(path).get_input_details()]


# The nodes that sum (their summation order matters) and that are not probed yet
SUMMING_OPS = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL")


def file_tensors(path) -> list[tuple[int, str, str]]:
    """[(tensor index, name, op name)]: every floating-point tensor a node of the main
    graph outputs, in execution order, then the graph's outputs in their order (whatever
    their dtype). An empty or repeated tensor name takes ``@<index>``, so no two share one."""
    loaded = _interpreter(path)
    details = {int(detail["index"]): detail for detail in loaded.get_tensor_details()}
    finals = [int(detail["index"]) for detail in loaded.get_output_details()]
    ops = sorted(loaded._get_ops_details(), key=lambda op: int(op["index"]))
    producer = {int(tensor): op["op_name"] for op in ops for tensor in op["outputs"]}
    found = [int(tensor) for op in ops for tensor in op["outputs"]
             if int(tensor) >= 0 and int(tensor) not in finals
             and np.issubdtype(np.dtype(details[int(tensor)]["dtype"]), np.floating)]
    tensors, seen = [], set()
    for index in [*found, *finals]:
        name = details[index]["name"]
        name = f"{name}@{index}" if not name or name in seen else name
        seen.add(name)
        tensors.append((index, name, producer.get(index, "INPUT")))
    return tensors


def open_session(runtime, job: dict, name: str):
    return file_session(runtime, job, name, job["model_path"])


def file_session(runtime, job: dict, name: str, path, rename=None,
                 program: str | None = None, accelerator: dict | None = None):
    """A Session of LiteRT on the .tflite at ``path`` (the user's file, or a conversion
    of it: bitdrift.formats.pt2) with the device's resolver and threads: every tensor of
    file_tensors recorded, those a delegate keeps inside listed as unmapped; the file run
    without keeping its tensors is the model as deployed (the observer check).
    ``rename(tensors, values)``, given file_tensors and their values on the first batch
    of the inputs, returns ({tensor index: (layer, class, axes)}: the tensors recorded
    under those names, transposed by ``axes`` where not None, the final output last
    whatever it says; [the layers it finds no tensor for]). ``program``: what the
    deployed run runs; ``accelerator``: the fingerprint's, where the caller has begun it
    (a conversion's)."""
    from pathlib import Path

    from bitdrift.backends import Session
    from bitdrift.errors import BitdriftError, InferenceError
    from bitdrift.formats.onnx import cannot_run
    from bitdrift.inputs.datasets import first_batch

    device, shown = job["device"], job["model_path"]
    if accelerator is None:
        accelerator = runtime.check_accelerator(name, device)
        accelerator["model_format"] = NAME
    trace = bool(job.get("trace"))
    tensors = file_tensors(path)
    finals = len(_interpreter(path).get_output_details())
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
