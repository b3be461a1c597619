"""What the exported runtimes share: a session on the file ``bitdrift.export`` wrote, its
outputs mapped to the Keras layers by position and checked against the reference."""

from __future__ import annotations

import contextlib
import importlib

import numpy as np

from bitdrift.errors import BitdriftError, ConfigError, InferenceError


def require(package: str, backend: str, pin: str):
    """``import package``; one line naming what to install when it is missing."""
    try:
        return importlib.import_module(package)
    except ImportError as error:
        raise InferenceError(f"backend {backend!r} needs the Python package {pin.split('==')[0]!r}"
                             f" (pip install {pin}; it is in requirements.txt)") from error


def preimport() -> None:
    """Nothing: an exported runtime's process starts in about a second; each repeat is a
    fresh process (PREFORK False)."""


def environment(device: dict) -> dict:
    """Nothing to set before import: an exported runtime's settings are session options."""
    return {}


def configure_threads(threads: int | None) -> None:
    """Threads are a session, compile or interpreter option (each runtime's compile)."""


def configure_determinism(deterministic: bool) -> None:
    """Set per session where the runtime has a switch (ONNX Runtime's compile); OpenVINO
    and LiteRT have none on the CPU, where their kernels are deterministic per process."""


def strategy_scope(accelerator: dict):
    return contextlib.nullcontext()


def import_keras(backend: str):
    raise ConfigError(f"backend {backend!r} runs an exported model: it cannot train or load "
                      "a .keras file (use tensorflow, torch or jax)")


def trace_environment(device: dict) -> dict:
    """Nothing to set: an exported runtime describes its compiled graph itself (the
    runtime's ``compile`` with ``trace``), read in the traced repeat."""
    return {}


def open_session(runtime, job: dict, name: str, dense_probe=None):
    """``runtime.compile(path, device, accelerator, trace)`` returns a function of a
    float32 batch giving every exported output in order, and a function describing the
    compiled graph (its nodes and output tensors, bitdrift.kernels.GraphNode) when
    ``trace``; the layers whose outputs match the reference are recorded, the others
    listed as unmapped. ``dense_probe(runtime, device, accelerator, export, dense_layers)``
    gives the session's dense_call: one Dense layer alone in the runtime's own format
    (onnx_dense_call; LiteRT's in its module)."""
    from bitdrift.backends import Session
    from bitdrift.datasets import read_test_images
    from bitdrift.reference import (
        check_export_file,
        mapped_positions,
        read_reference,
        unreadable_export,
    )

    device = job["device"]
    if not job.get("export") or not job.get("reference"):
        raise InferenceError(f"device {name!r}: backend {runtime.NAME!r} needs the model "
                             "exported (bitdrift.export) and its reference")
    reference = read_reference(job["reference"])
    accelerator = runtime.check_accelerator(name, device)
    check_export_file(job["export"], runtime.NAME)
    trace = bool(job.get("trace"))
    try:
        compiled, describe = runtime.compile(job["export"], device, accelerator, trace)
    except BitdriftError:
        raise
    except Exception as error:  # each runtime's parser raises its own kinds
        raise unreadable_export(job["export"], runtime.NAME, error) from error
    check = read_test_images(job["dataset_path"], reference.check_indices).astype(np.float32)
    mapped = mapped_positions(compiled(check), reference)
    if not mapped[-1]:
        raise InferenceError(f"device {name!r}: the final output of {job['export']} does not "
                             f"match the Keras model's on {runtime.NAME}, not even within a "
                             "bfloat16 runtime's error (wrong export or runtime); refusing to "
                             "record it")
    # The final output only within a narrower format's error: the argmax check then asks
    # what a reduced-precision device must give (bitdrift.inference.check_agreement).
    accelerator["final_output_mapping"] = mapped[-1]
    positions = [position for position, ok in enumerate(mapped) if ok]
    layers = [reference.layers[position] for position in positions]
    unmapped = [layer for (layer, _), ok in zip(reference.layers, mapped, strict=True) if not ok]
    # The effective-precision check reads a checked layer's input from the record: only
    # layers whose own values and whose input are both recorded are checked.
    recorded = {layer for layer, _ in layers}
    checked = {layer: value for layer, value in reference.checked.items()
               if layer in recorded and (value[0]["inbound"] is None
                                         or value[0]["inbound"] in recorded)}

    def run(batch):
        outputs = compiled(batch)
        return [outputs[position] for position in positions] if job["layers"] \
            else [outputs[-1]]

    def final(batch):
        return compiled(batch)[-1]

    dense_layers = {layer: (int(value[1][0].shape[0]), int(value[1][0].shape[1]),
                            bool(value[0]["use_bias"]))
                    for layer, value in reference.checked.items()
                    if value[0]["class_name"] == "Dense" and layer in recorded}
    dense_call = dense_probe(runtime, device, accelerator, job["export"], dense_layers) \
        if dense_probe is not None else None
    kernels = None
    if trace:
        from dataclasses import asdict

        from bitdrift.kernels import graph_layer_calls

        nodes, outputs = describe()
        if len(outputs) != len(mapped):
            raise InferenceError(f"device {name!r}: {runtime.NAME} describes {len(outputs)} "
                                 f"outputs of {job['export']}, the session gives {len(mapped)}")
        found = graph_layer_calls(nodes, outputs, {position: reference.layers[position][0]
                                                   for position in positions})
        kernels = {layer: [asdict(call) for call in calls] for layer, calls in found.items()}
    return Session(layers=layers if job["layers"] else [], run=run, final=final,
                   accelerator=accelerator, checked=checked if job["layers"] else {},
                   unmapped=unmapped, kernels=kernels, dense_layers=dense_layers,
                   dense_call=dense_call)


# The runtimes that run the ONNX export: a Dense layer for revealing their summation order
# is an ONNX graph of its own, built as tf2onnx writes a Dense layer (MatMul, then Add)
ONNX_RUNTIMES = ("onnxruntime", "openvino")


def onnx_dense_call(runtime, device: dict, accelerator: dict, export, dense_layers=None):
    """dense_call for an ONNX runtime (see bitdrift.backends.Session): each call builds a
    one-layer ONNX model with the given kernel and bias as constants (so the runtime packs
    and fuses them as in the export) and compiles it with the device's settings."""

    def make(terms: int, units: int, use_bias: bool, batch: int):
        # Only when an order is revealed (repeat 0): every other repeat opens the session
        # without reading the export twice
        import os
        import tempfile

        import onnx
        from onnx import TensorProto, helper, numpy_helper

        opset = list(onnx.load(str(export), load_external_data=False).opset_import)
        ones = np.ones((batch, terms), dtype=np.float32)

        def call(kernel, bias):
            nodes = [helper.make_node("MatMul", ["x", "kernel"], ["product" if use_bias
                                                                 else "y"])]
            constants = [numpy_helper.from_array(kernel.astype(np.float32), "kernel")]
            if use_bias:
                nodes.append(helper.make_node("Add", ["product", "bias"], ["y"]))
                constants.append(numpy_helper.from_array(bias.astype(np.float32), "bias"))
            graph = helper.make_graph(
                nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                               [None, terms])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, units])],
                constants)
            model = helper.make_model(graph, opset_imports=opset)
            handle, path = tempfile.mkstemp(suffix=".dense.onnx")
            os.close(handle)
            try:
                onnx.save(model, path)
                run, _ = runtime.compile(path, device, dict(accelerator), False)
                return np.asarray(run(ones)[-1])
            finally:
                os.unlink(path)

        return call

    return make
