"""LiteRT (TensorFlow Lite) on the model's ``.tflite`` export, a user's own ``.tflite``
(bitdrift.backends.exported.tflite_file) or a .pt2 program or ONNX model converted by
litert-torch (bitdrift.backends.torch_program.converted): the op
resolver (XNNPACK, the built-in kernels without it, or the reference kernels) and
threads as device keys.
CPU only: a GPU delegate is not a device bitdrift can check here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

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
from bitdrift.errors import AcceleratorMissing, InferenceError

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


def compile(path, device: dict, accelerator: dict, trace: bool = False,
            tensors: list[int] | None = None):
    """(run, describe) of the .tflite at ``path`` with the device's resolver and threads:
    ``run(batch)`` gives the signature's outputs in order (Keras' output_0, output_1, ...
    by number; another file's in its graph's output order). With ``tensors`` (indices of
    the file's tensors: a user's own .tflite, bitdrift.backends.exported.tflite_file), the
    interpreter keeps every tensor (LiteRT's ``experimental_preserve_all_tensors``) and
    each run gives those tensors' values instead, None for one a delegate computes inside
    itself without writing it (never another tensor's value)."""
    import warnings

    interpreter = _interpreter()
    resolver_name = device.get("op_resolver") or "xnnpack"
    resolver = getattr(interpreter.OpResolverType, RESOLVERS[resolver_name])
    with warnings.catch_warnings():  # its warning that keeping every tensor costs memory
        warnings.simplefilter("ignore", UserWarning)
        loaded = interpreter.Interpreter(
            model_path=str(path), num_threads=device.get("threads") or None,
            experimental_op_resolver_type=resolver,
            experimental_preserve_all_tensors=tensors is not None)
    runner = loaded.get_signature_runner()
    signature_outputs = runner.get_output_details()
    graph_order = [int(detail["index"]) for detail in loaded.get_output_details()]
    if all(re.fullmatch(r"output_\d+", key) for key in signature_outputs):
        # Keras names the outputs output_0, output_1, ... in the probe's order; the
        # signature sorts them as text (output_10 before output_2).
        names = sorted(signature_outputs, key=lambda key: int(key.rsplit("_", 1)[1]))
    else:
        names = sorted(signature_outputs, key=lambda key: graph_order.index(
            int(signature_outputs[key]["index"])))
    (input_name,) = runner.get_input_details()
    hidden: set[int] | None = None  # the tensors a delegate keeps inside, after a run

    def run(batch):
        nonlocal hidden
        results = runner(**{input_name: np.ascontiguousarray(batch)})
        if tensors is None:
            return [results[key] for key in names]
        if hidden is None:  # the delegate is applied by the first run
            hidden = _hidden(loaded._get_ops_details())
        return [None if index in hidden else loaded.get_tensor(index) for index in tensors]

    def describe():
        """The interpreter's nodes after a run (its delegate is applied by then): a node
        whose outputs a DELEGATE node writes was taken by XNNPACK; the others ran the
        built-in kernels (optimised, or the reference ones)."""
        from bitdrift.analysis.kernels import GraphNode, KernelCall

        details = loaded._get_ops_details()  # LiteRT's only description of its plan
        taken_nodes = _delegated(details)
        kernels = "reference" if resolver_name == "reference" else "optimized"
        nodes = []
        for op in details:
            if op["op_name"] == "DELEGATE":
                continue
            outputs = tuple(int(tensor) for tensor in op["outputs"])
            taken = int(op["index"]) in taken_nodes
            implementation = f"xnnpack {op['op_name']}" if taken else \
                f"tflite {op['op_name']} ({kernels})"
            nodes.append(GraphNode(
                call=None if op["op_name"] in LAYOUT_OPS else KernelCall(
                    library="litert", primitive=op["op_name"], implementation=implementation),
                inputs=tuple(int(tensor) for tensor in op["inputs"]), outputs=outputs))
        if tensors is not None:
            return nodes, list(tensors)
        return nodes, [int(signature_outputs[key]["index"]) for key in names]

    return run, describe


def _delegated(details: list[dict]) -> set[int]:
    """The nodes a DELEGATE node took: those that compute its outputs from its inputs,
    found by walking back from each output through the nodes that produce it, up to the
    delegate's inputs. (Where every layer is a graph output, as in the instrumented file,
    each taken node's outputs are the delegate's own; in the deployed file, with the final
    output alone, the delegate's outputs are its last node's only.)"""
    producer = {int(tensor): op for op in details if op["op_name"] != "DELEGATE"
                for tensor in op["outputs"]}
    taken: set[int] = set()
    for delegate in (op for op in details if op["op_name"] == "DELEGATE"):
        boundary = {int(tensor) for tensor in delegate["inputs"]}
        pending = [int(tensor) for tensor in delegate["outputs"]]
        while pending:
            tensor = pending.pop()
            op = producer.get(tensor)
            if tensor in boundary or op is None or int(op["index"]) in taken:
                continue
            taken.add(int(op["index"]))
            pending.extend(int(source) for source in op["inputs"] if int(source) >= 0)
    return taken


def _hidden(details: list[dict]) -> set[int]:
    """The tensors that nodes a DELEGATE node took compute and that it does not write
    (its own outputs are written): a delegate fused them away."""
    taken = _delegated(details)
    written = {int(tensor) for op in details if op["op_name"] == "DELEGATE"
               for tensor in op["outputs"]}
    return {int(tensor) for op in details if int(op["index"]) in taken
            for tensor in op["outputs"]} - written


def versions() -> dict:
    if "ai_edge_litert" not in sys.modules:
        return {}
    from importlib.metadata import version

    return {"litert": version("ai-edge-litert")}


# -- one layer alone, converted as the model is ------------------------------------------------
CONVERT_CODE = """
import json, sys
import numpy as np
from bitdrift import backends
from bitdrift.backends.exported.expected import FORMATS

keras = backends.get("tensorflow").import_keras()
for spec in json.loads(sys.argv[1]):
    inputs = keras.Input(shape=spec["shape"])
    layer = getattr(keras.layers, spec["class_name"]).from_config(spec["config"])
    model = keras.Model(inputs, layer(inputs))
    with np.load(spec["weights"]) as data:
        layer.set_weights([data[str(index)] for index in range(len(data.files))])
    model(np.zeros((1, *spec["shape"]), np.float32))
    model.export(spec["out"], format=FORMATS["tflite"][0], verbose=False)
"""


def convert_layers(specs: list[dict]) -> None:
    """Each layer alone as a .tflite (spec: shape without the batch, class_name, config,
    weights as arrays, out), converted as bitdrift.backends.keras.export converts the model (Keras'
    LiteRT
    export), all in one TensorFlow process of its own (its import is the cost)."""
    with tempfile.TemporaryDirectory(prefix="bitdrift-convert-") as folder:
        plan = []
        for index, spec in enumerate(specs):
            holder = Path(folder) / f"{index}.npz"
            np.savez(holder, **{str(k): value for k, value in enumerate(spec["weights"])})
            plan.append({**spec, "weights": str(holder)})
        # natively, with the host's python: an emulated Arm device's userland has no
        # TensorFlow, and a .tflite is the same file whichever CPU converts it
        from bitdrift.emulation.cpus import HOST_PYTHON, HOST_PYTHONPATH

        env = dict(os.environ)
        if HOST_PYTHON in env:
            # in an Arm worker: the host's python with the host's path, not the Arm site's
            env.pop(HOST_PYTHON)
            env["PYTHONPATH"] = env.pop(HOST_PYTHONPATH, "")
        done = subprocess.run([os.environ.get(HOST_PYTHON, sys.executable), "-c",
                               CONVERT_CODE, json.dumps(plan)], capture_output=True, text=True,
                              env={**env, "KERAS_BACKEND": "tensorflow",
                                   "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InferenceError(f"LiteRT's converter failed ({last})")


def _template(spec: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """A layer's weights whose bytes occur once in its .tflite (a seeded normal draw: no
    value repeats), so a probe's weights can take their place."""
    draw = np.random.default_rng(spec["terms"] * 7919 + spec["units"])
    kernel = draw.standard_normal(spec["kernel_shape"]).astype(np.float32)
    bias = draw.standard_normal(spec["units"]).astype(np.float32) if spec["use_bias"] \
        else None
    return kernel, bias


def _stored(class_name: str, kernel: np.ndarray) -> bytes:
    """A kernel's bytes as the converter stores them: FULLY_CONNECTED (units, terms),
    CONV_2D (filters, kh, kw, cin)."""
    order = (1, 0) if class_name == "Dense" else (3, 0, 1, 2)
    return np.ascontiguousarray(kernel.transpose(order), dtype=np.float32).tobytes()


def order_probe(runtime, device: dict, accelerator: dict, order_layers: dict):
    """order_probe for LiteRT (see bitdrift.backends.Session). Each Dense or Conv2D layer
    is converted alone once, as the export converts the model (its weights constants,
    which XNNPACK packs at load), with template weights; each call writes the probe's
    kernel and bias over the template's bytes and loads the file with the device's
    resolver and threads."""
    from bitdrift.analysis.accumulation.probes import probe_output

    converted: dict = {}

    def key(spec: dict) -> str:
        return json.dumps({k: spec[k] for k in ("class_name", "config", "input_shape",
                                                "kernel_shape")}, sort_keys=True)

    def convert_all(folder: Path) -> None:
        # Every probed layer of the job in one converter process
        specs = {key(spec): spec for spec in order_layers.values()}
        plan = []
        for index, (name, spec) in enumerate(specs.items()):
            kernel, bias = _template(spec)
            plan.append((name, spec, {
                "shape": spec["input_shape"], "class_name": spec["class_name"],
                "config": {**spec["config"], "dtype": "float32", "name": "probe"},
                "weights": [kernel] + ([bias] if bias is not None else []),
                "out": str(folder / f"layer_{index}.tflite")}))
        convert_layers([conversion for _, _, conversion in plan])
        for name, spec, conversion in plan:
            content = Path(conversion["out"]).read_bytes()
            kernel, bias = _template(spec)
            stored = {"kernel": _stored(spec["class_name"], kernel),
                      "bias": None if bias is None else bias.tobytes()}
            for what, value in stored.items():
                if value is not None and content.count(value) != 1:
                    raise InferenceError(
                        f"LiteRT's converter did not store the {spec['class_name']} {what} "
                        f"{spec['kernel_shape']} as one float32 constant; its summation "
                        "order cannot be probed in the .tflite")
            # the file and the template's bytes, made once per layer, not once per probe
            converted[name] = (content, stored)

    def make(spec: dict, batch: int):
        ones = np.ones((batch, *spec["input_shape"]), dtype=np.float32)

        def call(kernel, bias):
            with tempfile.TemporaryDirectory(prefix="bitdrift-layer-") as folder:
                if not converted:
                    convert_all(Path(folder))
                content, template = converted[key(spec)]
                content = content.replace(
                    template["kernel"],
                    _stored(spec["class_name"], kernel.reshape(spec["kernel_shape"])))
                if spec["use_bias"]:
                    content = content.replace(template["bias"],
                                              np.asarray(bias, np.float32).tobytes())
                path = Path(folder) / "probe.tflite"
                path.write_bytes(content)
                run, _ = runtime.compile(path, device, dict(accelerator), False)
                return probe_output(spec, run(ones)[-1])

        return call

    return make


def open_session(job: dict, name: str):
    """A Keras model: the .tflite bitdrift.backends.keras.export wrote from it."""
    return exported.open_session(sys.modules[__name__], job, name, order_probe=order_probe)


def open_tflite(job: dict, name: str):
    """A user's own .tflite, every tensor kept (tflite_file)."""
    from bitdrift.backends.exported import tflite_file

    return tflite_file.open_session(sys.modules[__name__], job, name)


def open_onnx(job: dict, name: str):
    """A user's ONNX model converted by onnx2torch, then litert-torch
    (converted.onnx_on_litert)."""
    from bitdrift.backends.torch_program import converted

    return converted.onnx_on_litert(sys.modules[__name__], job, name)


def open_pt2(job: dict, name: str):
    """A .pt2 program converted by litert-torch (converted.program_on_litert)."""
    from bitdrift.backends.torch_program import converted

    return converted.program_on_litert(sys.modules[__name__], job, name)


# The session of a model file of each format this runtime runs (bitdrift.runtimes)
SESSIONS = {"keras": open_session, "onnx": open_onnx, "pt2": open_pt2, "tflite": open_tflite}

# -- a repro script's code (bitdrift.run.repro) ---------------------------------------------
SCRIPT_LAYER = "tflite"  # the layer alone as layer.tflite, converted as the export is
# After the script's header (x, BATCH, HERE): layer.tflite with the device's resolver
SCRIPT = '''from ai_edge_litert import interpreter

loaded = interpreter.Interpreter(
    model_path=str(HERE / "layer.tflite"), num_threads={threads},
    experimental_op_resolver_type=interpreter.OpResolverType.{resolver})
runner = loaded.get_signature_runner()
(name,) = runner.get_input_details()
out = np.concatenate([next(iter(runner(**{{name: np.ascontiguousarray(x[start:start + BATCH])}})
                                .values())) for start in range(0, len(x), BATCH)])
'''


def script_code(device: dict, layer) -> str:
    return SCRIPT.format(threads=device.get("threads") or None,
                         resolver=RESOLVERS[device.get("op_resolver") or "xnnpack"])


def script_refusal(device: dict, layer) -> str | None:
    """The export, and so the script's layer, is float32."""
    if device["precision"] != "float32":
        return "litert: the export is float32"
    return None
