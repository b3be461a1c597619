"""What the exported runtimes share: a session on the file ``bitdrift.backends.keras.export``
wrote, its outputs mapped to the Keras layers by position and checked against the
reference; a user's model file compiled, an op the runtime lacks named in one line
(compile_model); one layer alone as ONNX (the order probe, a repro script's layer)."""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

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


def open_session(runtime, job: dict, name: str, order_probe=None):
    """``runtime.compile(path, device, accelerator, trace)`` returns a function of a
    float32 batch giving every exported output in order, and a function describing the
    compiled graph (its nodes and output tensors, bitdrift.analysis.kernels.GraphNode) when
    ``trace``; the layers whose outputs match the reference are recorded, the others
    listed as unmapped. ``order_probe(runtime, device, accelerator, order_layers)`` gives
    the session's order_probe: one Dense or Conv2D layer alone in the runtime's own format
    (onnx_order_probe; LiteRT's in its module)."""
    from bitdrift.backends import Session
    from bitdrift.backends.exported.expected import (
        check_export_file,
        mapped_positions,
        read_reference,
        unreadable_export,
    )
    from bitdrift.inputs.datasets import read_test_images

    device = job["device"]
    if not job.get("export") or not job.get("reference"):
        raise InferenceError(f"device {name!r}: backend {runtime.NAME!r} needs the model "
                             "exported (bitdrift.backends.keras.export) and its reference")
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
    # what a reduced-precision device must give (bitdrift.run.inference.check_agreement).
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

    from bitdrift.analysis.accumulation.probes import probe_spec

    names = [layer for layer, _ in reference.layers]
    order_layers = {}
    for layer, (spec, weights) in reference.checked.items():
        if layer not in recorded:
            continue
        # a Dense layer is probed on rows of its terms; a Conv2D at its input's own shape
        if spec["class_name"] == "Dense":
            shape = weights[0].shape[:1]
        elif spec["inbound"] is None:
            shape = check.shape[1:]
        elif spec["inbound"] in names:
            shape = reference.check_shape(names.index(spec["inbound"]))[1:]
        else:
            continue
        found = probe_spec(spec["class_name"], spec, shape, weights[0].shape)
        if found is not None:
            order_layers[layer] = found
    probe = order_probe(runtime, device, accelerator, order_layers) \
        if order_probe is not None else None
    kernels = deployed_kernels = None
    if trace:
        from dataclasses import asdict

        from bitdrift.analysis.kernels import graph_layer_calls

        nodes, outputs = describe()
        if len(outputs) != len(mapped):
            raise InferenceError(f"device {name!r}: {runtime.NAME} describes {len(outputs)} "
                                 f"outputs of {job['export']}, the session gives {len(mapped)}")
        found = graph_layer_calls(nodes, outputs, {position: reference.layers[position][0]
                                                   for position in positions})
        kernels = {layer: [asdict(call) for call in calls] for layer, calls in found.items()}
        if job.get("deployed_export"):
            # the deployed graph as the runtime compiles it (its nodes cannot all be named
            # by layer: only its final output is known), beside the instrumented graph's
            run_deployed, describe_deployed = runtime.compile(job["deployed_export"], device,
                                                              dict(accelerator), True)
            run_deployed(check)  # LiteRT applies its delegate at the first run
            deployed_kernels = {
                "deployed": [asdict(node.call) for node in describe_deployed()[0]
                             if node.call is not None],
                "instrumented": [asdict(node.call) for node in nodes if node.call is not None]}
    deployed, program = None, ""
    if job.get("deployed_export") and not trace:
        deployed, program = deployed_session(runtime, job["deployed_export"], device,
                                             accelerator, name)
    return Session(layers=layers if job["layers"] else [], run=run, final=final,
                   accelerator=accelerator, checked=checked if job["layers"] else {},
                   unmapped=unmapped, kernels=kernels, order_layers=order_layers,
                   order_probe=probe, deployed=deployed, deployed_program=program,
                   deployed_kernels=deployed_kernels)


def deployed_session(runtime, path, device: dict, accelerator: dict, name: str):
    """(deployed(batch), what it runs): the deployed export (bitdrift.backends.keras.export: the
    model
    converted with its final output alone) compiled with the device's settings, so the
    runtime optimises the graph a user deploys, not the one with every layer exposed."""
    from bitdrift.backends.exported.expected import check_export_file, unreadable_export

    check_export_file(path, runtime.NAME)
    try:
        compiled, _ = runtime.compile(path, device, dict(accelerator), False)
    except BitdriftError:
        raise
    except Exception as error:  # each runtime's parser raises its own kinds
        raise unreadable_export(path, runtime.NAME, error) from error

    def deployed(batch):
        outputs = compiled(batch)
        if len(outputs) != 1:
            raise InferenceError(f"device {name!r}: {path} has {len(outputs)} outputs; the "
                                 "deployed export has the final output alone")
        return outputs[0]

    return deployed, f"{Path(path).name} on {runtime.NAME}, final output only"


# -- a model file of the user's compiled by an exported runtime -------------------------------
# The words of a runtime's message that say an op is missing (cannot_run shows that line)
OP_WORDS = ("no conversion rule found for operations", "not implemented", "no kernel",
            "could not find an implementation", "unsupported op",
            "didn't find op for builtin opcode", "unresolved custom op",
            "no suitable implementations")  # OpenVINO's CPU plugin: no kernel for a node


def compile_model(runtime, path, device, accelerator, trace, name, shown=None):
    """runtime.compile, an op the runtime lacks named in one line (only this device
    fails: bitdrift.record.failures); ``shown`` the file the user gave (of an instrumented copy)."""
    try:
        return runtime.compile(path, device, accelerator, trace)
    except Exception as error:
        raise cannot_run(runtime, shown or path, name, error) from error


def cannot_run(runtime, path, name, error: BaseException) -> InferenceError:
    """One line saying why ``runtime`` cannot run the model at ``path``: the line of the
    runtime's message that names the op where it has one (OpenVINO's report of
    unconverted ops comes after its source location), else its first line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if any(word in line.lower() for word in OP_WORDS)]
    reason = (named or lines or [type(error).__name__])[-1 if named else 0]
    return InferenceError(f"device {name!r}: {runtime.NAME} cannot run {Path(path).name} "
                          f"({reason.lstrip('- ')[:300]})")


# -- one layer alone as ONNX, as tf2onnx writes it --------------------------------------------
ONNX_LAYERS = ("Dense", "Conv2D")
ONNX_ACTIVATIONS = {"linear": None, "relu": "Relu", "softmax": "Softmax"}


def onnx_layer(class_name: str, config: dict, weights: list, input_shape: tuple,
               name: str = "layer", opset: int = 17):
    """The layer as an ONNX graph of a batch of ``input_shape`` (per sample), as tf2onnx
    writes it: Dense as MatMul and Add, Conv2D between NHWC<->NCHW transposes with its
    bias; then the activation. The input is ``x``, the output ``y``."""
    from onnx import TensorProto, helper, numpy_helper

    kernel = np.asarray(weights[0], dtype=np.float32)
    use_bias = bool(config.get("use_bias", True)) and len(weights) > 1
    bias = np.asarray(weights[1], dtype=np.float32) if use_bias else None
    constants, nodes = [], []
    if class_name == "Dense":
        constants.append(numpy_helper.from_array(kernel, "kernel"))
        nodes.append(helper.make_node("MatMul", ["x", "kernel"], ["linear"]))
        if use_bias:
            constants.append(numpy_helper.from_array(bias, "bias"))
            nodes.append(helper.make_node("Add", ["linear", "bias"], ["biased"]))
        last = nodes[-1].output[0]
    else:
        if config.get("data_format", "channels_last") != "channels_last" or \
                int(config.get("groups", 1)) != 1:
            raise InferenceError(f"{name}: bitdrift rebuilds channels-last, ungrouped Conv2D "
                                 "layers only as ONNX")
        constants.append(numpy_helper.from_array(
            np.ascontiguousarray(kernel.transpose(3, 2, 0, 1)), "kernel"))
        inputs = ["nchw", "kernel"]
        if use_bias:
            constants.append(numpy_helper.from_array(bias, "bias"))
            inputs.append("bias")
        nodes.append(helper.make_node("Transpose", ["x"], ["nchw"], perm=[0, 3, 1, 2]))
        padding = {"same": {"auto_pad": "SAME_UPPER"}, "valid": {"auto_pad": "VALID"}}
        nodes.append(helper.make_node(
            "Conv", inputs, ["linear"], strides=list(config.get("strides", [1, 1])),
            dilations=list(config.get("dilation_rate", [1, 1])),
            kernel_shape=list(kernel.shape[:2]), **padding[config.get("padding", "valid")]))
        last = "linear"
    activation = ONNX_ACTIVATIONS[config.get("activation", "linear")]
    if activation:
        extra = {"axis": 1 if class_name == "Conv2D" else -1} \
            if activation == "Softmax" else {}
        nodes.append(helper.make_node(activation, [last], ["activated"], **extra))
        last = "activated"
    if class_name == "Conv2D":
        nodes.append(helper.make_node("Transpose", [last], ["y"], perm=[0, 2, 3, 1]))
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, *input_shape])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], constants)
    # The oldest IR version the opset allows, not the installed onnx's newest: a runtime
    # older than onnx refuses a newer IR (on an NVIDIA H200 host, onnx 1.23 wrote IR 14
    # and onnxruntime 1.30 read up to 13), though it runs every op here.
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets,
                             ir_version=helper.find_min_ir_version_for(opsets))


def run_probe_model(runtime, model, device: dict, accelerator: dict, spec: dict,
                    ones: np.ndarray) -> np.ndarray:
    """A probe's ONNX model (one layer or node alone) compiled with the device's settings
    from a temporary file and run on ``ones``: its output as the order search reads it."""
    import os
    import tempfile

    import onnx

    from bitdrift.analysis.accumulation.probes import probe_output

    handle, path = tempfile.mkstemp(suffix=".probe.onnx")
    os.close(handle)
    try:
        onnx.save(model, path)
        run, _ = runtime.compile(path, device, dict(accelerator), False)
        return probe_output(spec, run(ones)[-1])
    finally:
        os.unlink(path)


def onnx_order_probe(runtime, device: dict, accelerator: dict, order_layers=None):
    """order_probe for an ONNX runtime (see bitdrift.backends.Session): each call builds the
    layer alone as the export writes it (onnx_layer), its kernel and bias as constants (so
    the runtime packs and fuses them as in the export), and compiles it with the device's
    settings."""

    def make(spec: dict, batch: int):
        ones = np.ones((batch, *spec["input_shape"]), dtype=np.float32)

        def call(kernel, bias):
            weights = [kernel.reshape(spec["kernel_shape"]).astype(np.float32)]
            if spec["use_bias"]:
                weights.append(np.asarray(bias, np.float32))
            return run_probe_model(runtime, onnx_layer(
                spec["class_name"], spec["config"], weights, tuple(spec["input_shape"]),
                "probe"), device, accelerator, spec, ones)

        return call

    return make


def onnx_script_refusal(backend: str, layer) -> str | None:
    """Why an ONNX runtime has no repro script for a Keras ``layer`` (bitdrift.run.repro):
    its script rebuilds Dense and Conv2D layers of a few activations as ONNX
    (onnx_layer); a node of a user's ONNX model runs as the file has it."""
    if layer.format != "keras":
        return None
    activation = layer.config.get("activation", "linear")
    if layer.class_name not in ONNX_LAYERS or activation not in ONNX_ACTIVATIONS:
        return (f"{backend}: the script rebuilds Dense and Conv2D layers (activation "
                f"{', '.join(ONNX_ACTIVATIONS)}) as ONNX; {layer.layer!r} is a "
                f"{layer.class_name} ({activation})")
    return None
