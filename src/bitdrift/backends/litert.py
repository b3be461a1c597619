"""LiteRT (TensorFlow Lite) on the model's ``.tflite`` export: the op resolver (XNNPACK,
the built-in kernels without it, or the reference kernels) and threads as device keys.
CPU only: a GPU delegate is not a device bitdrift can check here."""

from __future__ import annotations

import sys

import numpy as np

from bitdrift.backends import exported

# What every exported runtime shares (the rest of the backend interface).
from bitdrift.backends.exported import (  # noqa: F401
    configure_determinism,
    configure_threads,
    environment,
    preimport,
    strategy_scope,
    trace_environment,
)
from bitdrift.errors import AcceleratorMissing

NAME = "litert"
PIN = "ai-edge-litert==2.3.0"
TRAINS = False
PREFORK = False
RESOLVERS = {"xnnpack": "AUTO", "builtin": "BUILTIN_WITHOUT_DEFAULT_DELEGATES",
             "reference": "BUILTIN_REF"}


def _interpreter():
    exported.require("ai_edge_litert", NAME, PIN)
    from ai_edge_litert import interpreter

    return interpreter


def import_keras():
    return exported.import_keras(NAME)


def check_accelerator(name: str, device: dict) -> dict:
    _interpreter()
    if device["accelerator"] != "cpu":
        raise AcceleratorMissing(f"device {name!r}: bitdrift runs LiteRT on the CPU only; a "
                                 f"{device['accelerator'].upper()} device would not run on one")
    return {"accelerator": "cpu"}


# Nodes that only move or describe data
LAYOUT_OPS = {"SHAPE", "STRIDED_SLICE", "PACK", "RESHAPE", "TRANSPOSE", "SQUEEZE",
              "EXPAND_DIMS", "CONCATENATION", "GATHER", "SLICE"}


def compile(path, device: dict, accelerator: dict, trace: bool = False):
    interpreter = _interpreter()
    resolver_name = device.get("op_resolver") or "xnnpack"
    resolver = getattr(interpreter.OpResolverType, RESOLVERS[resolver_name])
    loaded = interpreter.Interpreter(
        model_path=str(path), num_threads=device.get("threads") or None,
        experimental_op_resolver_type=resolver)
    runner = loaded.get_signature_runner()
    # Keras names the outputs output_0, output_1, ... in the probe's order; the signature
    # sorts them as text (output_10 before output_2).
    names = sorted(runner.get_output_details(), key=lambda key: int(key.rsplit("_", 1)[1]))
    (input_name,) = runner.get_input_details()

    def run(batch):
        results = runner(**{input_name: np.ascontiguousarray(batch)})
        return [results[key] for key in names]

    def describe():
        """The interpreter's nodes after a run (its delegate is applied by then): a node
        whose outputs a DELEGATE node writes was taken by XNNPACK; the others ran the
        built-in kernels (optimised, or the reference ones)."""
        from bitdrift.kernels import GraphNode, KernelCall

        details = loaded._get_ops_details()  # LiteRT's only description of its plan
        delegated = {int(tensor) for op in details if op["op_name"] == "DELEGATE"
                     for tensor in op["outputs"]}
        kernels = "reference" if resolver_name == "reference" else "optimized"
        nodes = []
        for op in details:
            if op["op_name"] == "DELEGATE":
                continue
            outputs = tuple(int(tensor) for tensor in op["outputs"])
            taken = bool(outputs) and set(outputs) <= delegated
            implementation = f"xnnpack {op['op_name']}" if taken else \
                f"tflite {op['op_name']} ({kernels})"
            nodes.append(GraphNode(
                call=None if op["op_name"] in LAYOUT_OPS else KernelCall(
                    library="litert", primitive=op["op_name"], implementation=implementation),
                inputs=tuple(int(tensor) for tensor in op["inputs"]), outputs=outputs))
        details = runner.get_output_details()
        return nodes, [int(details[key]["index"]) for key in names]

    return run, describe


def versions() -> dict:
    if "ai_edge_litert" not in sys.modules:
        return {}
    from importlib.metadata import version

    return {"litert": version("ai-edge-litert")}


def open_session(job: dict, name: str):
    return exported.open_session(sys.modules[__name__], job, name)
