"""ONNX Runtime on the model's ONNX export: graph optimisation level and intra-op threads
as device keys; CPU or CUDA execution provider, never one for the other."""

from __future__ import annotations

import sys

from bitdrift.backends.exported import common as exported

# What every exported runtime shares (the rest of the backend interface).
from bitdrift.backends.exported.common import (  # noqa: F401
    configure_determinism,
    configure_threads,
    environment,
    preimport,
    strategy_scope,
    trace_environment,
)
from bitdrift.errors import AcceleratorMissing

NAME = "onnxruntime"
PIN = "onnxruntime==1.32.0"
TRAINS = False
PREFORK = False
PROVIDERS = {"cpu": "CPUExecutionProvider", "gpu": "CUDAExecutionProvider"}
# A user's quantized ONNX model's integer node outputs (uint8/int8 codes, int32
# accumulators) are recorded as they are, beside the float ones (onnx_file.instrumented)
INTEGER_LAYERS = True
LEVELS = {"disable_all": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
          "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def _ort():
    return exported.require("onnxruntime", NAME, PIN)


def import_keras():
    return exported.import_keras(NAME)


def check_accelerator(name: str, device: dict) -> dict:
    ort = _ort()
    provider = PROVIDERS.get(device["accelerator"])
    if provider is None or provider not in ort.get_available_providers():
        raise AcceleratorMissing(f"device {name!r} asks for a {device['accelerator'].upper()} "
                                 f"but ONNX Runtime has no {provider or 'provider for it'} "
                                 f"(it has {', '.join(ort.get_available_providers())}); "
                                 "refusing to fall back to the CPU")
    return {"accelerator": device["accelerator"], "provider": provider}


# Nodes that only move or describe data: no arithmetic, left out of the kernels
LAYOUT_OPS = {"Transpose", "Reshape", "Shape", "Gather", "Slice", "Concat", "Identity",
              "ReorderInput", "ReorderOutput", "Squeeze", "Unsqueeze", "Flatten"}
DOMAINS = {"": "", "ai.onnx": "", "com.microsoft": "ms:", "com.microsoft.nchwc": "nchwc:"}
INTEGER_TYPES = {2, 3, 4, 5, 6, 7, 9, 12, 13}  # ONNX TensorProto: (u)int8..64, bool


def _options(ort, device: dict):
    """The device's session options: optimisation level, threads, determinism, and its
    session configuration entries (``session_config``: ONNX Runtime's own keys, e.g. its
    int8 options)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, LEVELS[device.get("graph_optimization_level") or "all"])
    if device.get("threads"):
        options.intra_op_num_threads = device["threads"]
    options.inter_op_num_threads = 1
    if device.get("deterministic"):
        options.use_deterministic_compute = True
    for key, value in sorted((device.get("session_config") or {}).items()):
        options.add_session_config_entry(key, value)
    return options


# What a user's ONNX model's instrumented run exposes on ONNX Runtime (the observer
# table's ``instrumented``, bitdrift.analysis.observer)
EXPOSED = ("every node output of ONNX Runtime's optimised graph, under the model's names "
           "where that graph keeps them")


def optimised_model(path, device: dict, accelerator: dict):
    """(the graph ONNX Runtime deploys for the ONNX file at ``path`` with the device's
    settings, as ONNX; the device settings that run that graph as it is; what exposing
    its node outputs exposes, in words). The graph is the one the session runs
    (SessionOptions.optimized_model_filepath: fused nodes such as MatMul+Add as Gemm,
    Gemm+Relu as FusedGemm, NCHWc convolutions), written for this machine and this
    ONNX Runtime; run with every optimisation off, exposing its node outputs stops no
    fusion, since its fusions are made (onnx_file.open_session: the observer check
    compares it with the file as given)."""
    import os
    import tempfile

    import onnx

    ort = _ort()
    options = _options(ort, device)
    handle, written = tempfile.mkstemp(suffix=".optimised.onnx")
    os.close(handle)
    options.optimized_model_filepath = written
    options.log_severity_level = 3  # its warning that the file is machine-specific
    try:
        ort.InferenceSession(str(path), options, providers=[accelerator["provider"]])
        model = onnx.load(written)
    finally:
        os.unlink(written)
    return model, {**device, "graph_optimization_level": "disable_all"}, EXPOSED


def compile(path, device: dict, accelerator: dict, trace: bool = False):
    ort = _ort()
    options = _options(ort, device)
    optimized = None
    if trace:  # the graph as ONNX Runtime will run it: fused, NCHWc and Gemm nodes
        import os
        import tempfile

        handle, optimized = tempfile.mkstemp(suffix=".optimized.onnx")
        os.close(handle)
        options.optimized_model_filepath = optimized
        options.log_severity_level = 3  # its warning that the file is machine-specific
    session = ort.InferenceSession(str(path), options, providers=[accelerator["provider"]])
    if session.get_providers()[0] != accelerator["provider"]:
        raise AcceleratorMissing(f"ONNX Runtime runs on {session.get_providers()[0]}, not "
                                 f"the {accelerator['provider']} asked for")
    name = session.get_inputs()[0].name

    def describe():
        import os

        import onnx

        from bitdrift.analysis.kernels import GraphNode, KernelCall

        try:
            graph = onnx.load(optimized).graph
        finally:
            os.unlink(optimized)
        nodes = []
        for node in graph.node:
            casts_integers = node.op_type == "Cast" and any(
                attribute.name == "to" and attribute.i in INTEGER_TYPES
                for attribute in node.attribute)
            kind = f"{DOMAINS.get(node.domain, node.domain + ':')}{node.op_type}"
            moves_data = node.op_type in LAYOUT_OPS or casts_integers
            nodes.append(GraphNode(
                call=None if moves_data else KernelCall(
                    library="onnxruntime", primitive=kind, implementation=f"ort {kind}"),
                inputs=tuple(node.input), outputs=tuple(node.output)))
        return nodes, [output.name for output in session.get_outputs()]

    def run(batch):  # a model of several inputs takes them by name (datasets.NamedInputs)
        return session.run(None, dict(batch) if isinstance(batch, dict) else {name: batch})

    return run, describe


def versions() -> dict:
    ort = sys.modules.get("onnxruntime")
    return {"onnxruntime": ort.__version__} if ort is not None else {}


def open_session(job: dict, name: str):
    """A Keras model: the ONNX file bitdrift.backends.keras.export wrote from it."""
    return exported.open_session(sys.modules[__name__], job, name,
                                 order_probe=exported.onnx_order_probe)


def open_onnx(job: dict, name: str):
    """A user's ONNX model, every node's output marked (onnx_file.instrumented)."""
    from bitdrift.backends.exported import onnx_file

    return onnx_file.open_session(sys.modules[__name__], job, name)


def open_pt2(job: dict, name: str):
    """A .pt2 program exported to ONNX by torch.onnx.export (converted.as_onnx)."""
    from bitdrift.backends.torch_program import converted

    return converted.program_session(sys.modules[__name__], job, name, converted.as_onnx)


# The session of a model file of each format this runtime runs (bitdrift.runtimes)
SESSIONS = {"keras": open_session, "onnx": open_onnx, "pt2": open_pt2}

# -- a repro script's code (bitdrift.run.repro) ---------------------------------------------
SCRIPT_LAYER = "onnx"  # the layer alone as layer.onnx, its weights inside
# After the script's header (x, BATCH, HERE): layer.onnx run with the device's settings
SCRIPT = '''import onnxruntime as ort

options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.{level}
{threads}options.inter_op_num_threads = 1
options.use_deterministic_compute = {deterministic}
{entries}session = ort.InferenceSession(str(HERE / "layer.onnx"), options,
                               providers=[{provider!r}])
out = np.concatenate([session.run(None, {{"x": x[start:start + BATCH]}})[0]
                      for start in range(0, len(x), BATCH)])
'''


def script_code(device: dict, layer) -> str:
    threads = device.get("threads")
    return SCRIPT.format(
        level=LEVELS[device.get("graph_optimization_level") or "all"],
        threads=f"options.intra_op_num_threads = {threads}\n" if threads else "",
        deterministic=bool(device.get("deterministic")),
        entries="".join(f"options.add_session_config_entry({key!r}, {value!r})\n"
                        for key, value in sorted((device.get("session_config") or {}).items())),
        provider=PROVIDERS[device["accelerator"]])


def script_refusal(device: dict, layer) -> str | None:
    return exported.onnx_script_refusal(NAME, layer)
