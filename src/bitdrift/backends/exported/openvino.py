"""OpenVINO on the model's ONNX export: execution mode and inference precision hint as
device keys, threads; its CPU or GPU plugin, never one for the other."""

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

NAME = "openvino"
PIN = "openvino==2026.4.1"
TRAINS = False
PREFORK = False
PLUGINS = {"cpu": "CPU", "gpu": "GPU"}
# OpenVINO's element types by the names bitdrift uses for formats
PRECISION_NAMES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}


def _ov():
    return exported.require("openvino", NAME, PIN)


def import_keras():
    return exported.import_keras(NAME)


def check_accelerator(name: str, device: dict) -> dict:
    ov = _ov()
    plugin = PLUGINS.get(device["accelerator"])
    available = ov.Core().available_devices
    if plugin is None or not any(found.split(".")[0] == plugin for found in available):
        raise AcceleratorMissing(f"device {name!r} asks for a {device['accelerator'].upper()} "
                                 f"but OpenVINO sees {', '.join(available) or 'none'}; "
                                 "refusing to fall back to the CPU")
    return {"accelerator": device["accelerator"], "plugin": plugin}


# Executed nodes that only move data or are none (a Reorder that converts a format stays)
LAYOUT_TYPES = {"Input", "Output", "Parameter", "Result", "Const", "Transpose", "Reshape",
                "Squeeze", "Unsqueeze", "Concatenation", "Split", "Gather", "ShapeOf"}
ISAS = ("amx", "avx512", "avx2", "avx", "sse42", "sse41")


def compile_settings(device: dict) -> dict:
    """The plugin's settings for the device's keys (also bitdrift.run.repro's scripts)."""
    settings = {"EXECUTION_MODE_HINT": device.get("execution_mode") or "PERFORMANCE"}
    if device.get("inference_precision_hint"):
        settings["INFERENCE_PRECISION_HINT"] = device["inference_precision_hint"]
    if device.get("threads"):
        settings["INFERENCE_NUM_THREADS"] = device["threads"]
    return settings


def compile(path, device: dict, accelerator: dict, trace: bool = False):
    ov = _ov()
    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), accelerator["plugin"],
                                  compile_settings(device))
    # The precision the plugin chose (it may ignore a hint the hardware cannot do): the
    # effective-precision check verifies the layers either way.
    chosen = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
    accelerator["inference_precision"] = PRECISION_NAMES.get(chosen, chosen)
    outputs = compiled.outputs

    def run(batch):
        # a model of several inputs takes them by name (datasets.NamedInputs)
        results = compiled(dict(batch) if isinstance(batch, dict) else batch)
        return [results[output] for output in outputs]

    def describe():
        """The runtime model: each executed node's layer type, primitive (its kernel, ISA
        and precision) and runtime precision: ``ov Convolution:brgconv_avx512_amx_i8 u8``."""
        from bitdrift.analysis.kernels import GraphNode, KernelCall

        model = compiled.get_runtime_model()
        nodes = []
        for op in model.get_ordered_ops():
            info = op.get_rt_info()

            def value(key, info=info):
                return info[key].astype(str) if key in info else ""

            kind, primitive = value("layerType"), value("primitiveType")
            # the precision the node computes in (u8/i8 where a quantized model's int8
            # kernels run: a FullyConnected's primitive may be "undef_I8" alone)
            precision = value("runtimePrecision")
            converts = kind == "Reorder" and op.get_input_size() and \
                op.input_value(0).get_element_type() != op.get_output_element_type(0)
            moves_data = kind in LAYOUT_TYPES or (kind == "Reorder" and not converts)
            isa = next((name for name in ISAS if name in primitive.lower()), "")
            nodes.append(GraphNode(
                call=None if moves_data else KernelCall(
                    library="openvino", primitive=kind,
                    implementation=f"ov {kind}:{primitive}"
                    + (f" {precision}" if precision else ""), isa=isa),
                inputs=tuple((source.get_node().get_friendly_name(), source.get_index())
                             for source in (item.get_source_output() for item in op.inputs())),
                outputs=tuple((op.get_friendly_name(), index)
                              for index in range(op.get_output_size()))))
        results = [(source.get_node().get_friendly_name(), source.get_index())
                   for source in (result.input_value(0) for result in model.get_results())]
        return nodes, results

    return run, describe


def versions() -> dict:
    ov = sys.modules.get("openvino")
    return {"openvino": ov.get_version()} if ov is not None else {}


def open_session(job: dict, name: str):
    """A Keras model: the ONNX file bitdrift.backends.keras.export wrote from it."""
    return exported.open_session(sys.modules[__name__], job, name,
                                 order_probe=exported.onnx_order_probe)


def open_onnx(job: dict, name: str):
    """A user's ONNX model, every node's output marked (onnx_file.instrumented)."""
    from bitdrift.backends.exported import onnx_file

    return onnx_file.open_session(sys.modules[__name__], job, name)


def open_pt2(job: dict, name: str):
    """A .pt2 program converted by OpenVINO's own conversion (converted.as_openvino)."""
    from bitdrift.backends.torch_program import converted

    return converted.program_session(sys.modules[__name__], job, name,
                                     converted.as_openvino)


# The session of a model file of each format this runtime runs (bitdrift.runtimes)
SESSIONS = {"keras": open_session, "onnx": open_onnx, "pt2": open_pt2}

# -- a repro script's code (bitdrift.run.repro) ---------------------------------------------
SCRIPT_LAYER = "onnx"  # the layer alone as layer.onnx, its weights inside
# After the script's header (x, BATCH, HERE): layer.onnx compiled with the device's settings
SCRIPT = '''import openvino as ov

core = ov.Core()
compiled = core.compile_model(core.read_model(str(HERE / "layer.onnx")), {plugin!r},
                              {settings!r})
out = np.concatenate([compiled(x[start:start + BATCH])[compiled.outputs[0]]
                      for start in range(0, len(x), BATCH)])
'''


def script_code(device: dict, layer) -> str:
    return SCRIPT.format(plugin=PLUGINS[device["accelerator"]],
                         settings=compile_settings(device))


def script_refusal(device: dict, layer) -> str | None:
    return exported.onnx_script_refusal(NAME, layer)
