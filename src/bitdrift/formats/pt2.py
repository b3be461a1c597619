"""PyTorch ``torch.export`` programs (``torch.export.save``: a zip holding
``<name>/archive_format`` and ``<name>/models/*.json``), run natively by torch eager
(``torch_export``), torch.compile (``torch_inductor``) and ExecuTorch (``executorch``, a
lowering each repeat makes), and through a conversion by ONNX Runtime, OpenVINO and
LiteRT (:func:`open_session`: ``torch.onnx.export(dynamo=True)``,
``openvino.convert_model``, ``litert_torch.convert``).
A conversion is named in the record's fingerprint (converter, versions, options); a
failed one fails only the devices that need it, its reason in the failure record."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from bitdrift.errors import ModelFormatError
from bitdrift.formats import Input

NAME = "pt2"
WHAT = "a PyTorch torch.export .pt2 archive"
RUNTIMES = ("torch_export", "torch_inductor", "executorch", "onnxruntime", "openvino",
            "litert")
# a program of several inputs: each fed by its name (a .npz of one array per input)
SEVERAL_INPUTS = ("torch_export",)
NATIVE = ("torch_export", "torch_inductor", "executorch")  # each opens the file itself
# The ATen calls read as layers (file_layers): nn.Linear and nn.Conv2d export as these
LINEAR, CONV2D = "aten.linear.default", "aten.conv2d.default"


def _names(path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return []


def recognise(path, head: bytes) -> bool:
    return head.startswith(b"PK") and any(name.endswith("/archive_format")
                                          for name in _names(path))


def check(path) -> None:
    names = _names(path)
    if not any("/models/" in name and name.endswith(".json") for name in names):
        raise ModelFormatError(f"{path}: a damaged torch.export .pt2 archive (no "
                               "models/*.json)")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError) as error:
        raise ModelFormatError(f"{path}: a damaged torch.export .pt2 archive ({error})") \
            from error
    if bad is not None:
        raise ModelFormatError(f"{path}: a damaged torch.export .pt2 archive ({bad} fails "
                               "its checksum)")


def signature(path) -> list[Input]:
    """The program's user inputs, from torch.export.load (torch is imported here)."""
    import torch

    try:
        program = torch.export.load(str(path))
    except Exception as error:  # torch raises many kinds for a damaged archive
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ModelFormatError(f"{path}: torch.export.load cannot read it ({first})") \
            from error
    users = set(program.graph_signature.user_inputs)
    inputs = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in users:
            value = node.meta.get("val")
            shape = tuple(dim if isinstance(dim, int) else None for dim in value.shape)
            inputs.append(Input(node.name, shape, str(value.dtype).removeprefix("torch.")))
    return inputs


def open_session(runtime, job: dict, name: str):
    """A Session of ``runtime`` on the job's program: a torch runtime's own
    (``open_session(job, name)``); ONNX Runtime and OpenVINO on the program converted in
    this process (:func:`converted_session`)."""
    if runtime.NAME in NATIVE:
        return runtime.open_session(job, name)
    return converted_session(runtime, job, name)


def converted_session(runtime, job: dict, name: str):
    """The program converted for ``runtime`` (ONNX for onnxruntime, OpenVINO's own
    conversion for openvino), compiled with the device's settings. The layers recorded
    are the module calls the conversion keeps under their module paths (the eager run's
    names, torch_conversions.onnx_module_outputs / openvino_module_outputs), the final
    output last; the others (fused away, or without a value of their own) are listed as
    unmapped, never guessed. The converted file without the added outputs is the model
    as deployed (the observer check)."""
    import shutil
    import tempfile

    from bitdrift.backends.torch_program.eager import load, program_layers

    device = job["device"]
    accelerator = runtime.check_accelerator(name, device)
    accelerator["model_format"] = NAME
    program = load(job)
    layers, _ = program_layers(program)
    # the converted files live until compiled (a worker ends by os._exit: no atexit)
    folder = tempfile.mkdtemp(prefix="bitdrift-pt2-")
    try:
        return _converted(runtime, job, name, program, layers, accelerator, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _converted(runtime, job, name, program, layers, accelerator, folder):
    import os

    from bitdrift.backends import Session
    from bitdrift.backends.torch_program import conversions
    from bitdrift.errors import BitdriftError, InferenceError
    from bitdrift.formats.onnx import compile_model

    device = job["device"]
    if runtime.NAME == "litert":
        return _litert_session(runtime, job, name, program, layers, accelerator, folder)
    if runtime.NAME == "onnxruntime":
        import onnx

        conversion = conversions.to_onnx(program, os.path.join(folder, "model.onnx"))
        mapping = conversions.onnx_module_outputs(conversion.model,
                                                  [layer for layer, _ in layers[:-1]])
        instrumented = conversions.with_outputs(conversion.model, list(mapping.values()))
        path = os.path.join(folder, "instrumented.onnx")
        onnx.save(instrumented, path)
        names = [output.name for output in instrumented.graph.output]
        positions = {layer: names.index(value) for layer, value in mapping.items()}
        deployed_path = str(conversion.path)
    elif runtime.NAME == "openvino":
        import openvino

        conversion = conversions.to_openvino(program)
        deployed_path = os.path.join(folder, "deployed.xml")
        openvino.save_model(conversion.model, deployed_path, compress_to_fp16=False)
        conversion.layers = {layer: value for layer, value in conversion.layers.items()
                             if layer in {name for name, _ in layers[:-1]}}
        positions = conversions.openvino_with_outputs(conversion)
        path = os.path.join(folder, "instrumented.xml")
        openvino.save_model(conversion.model, path, compress_to_fp16=False)
    else:
        raise InferenceError(f"device {name!r}: {runtime.NAME} has no conversion of a .pt2 "
                             "program")
    accelerator.update(conversion.fingerprint())
    try:
        compiled, _ = compile_model(runtime, path, device, accelerator, False, name,
                                    shown=job["model_path"])
        deployed_run, _ = compile_model(runtime, deployed_path, device, dict(accelerator),
                                        False, name, shown=job["model_path"])
    except BitdriftError:
        raise
    except Exception as error:
        raise InferenceError(f"device {name!r}: {runtime.NAME} cannot run the converted "
                             f"{job['model_path']}: {error}") from error
    final_layer = layers[-1]
    recorded = [(layer, kind) for layer, kind in layers[:-1] if layer in positions]
    unmapped = [layer for layer, _ in layers[:-1] if layer not in positions]
    checked, unrevealed = {}, {}
    if job["layers"]:  # the converted runtimes run float32 (docs/pytorch-models.md)
        checked, probed, unrevealed = checked_layers(
            program_file_layers(program), [layer for layer, _ in recorded + [final_layer]],
            "float32")
        unrevealed.update({layer: f"the program converted by {conversion.converter}: its "
                                  "node alone is not probed" for layer in probed})
    accelerator["per_layer"] = (f"the module calls {conversion.converter} keeps under their "
                                "module paths; the others are unmapped")

    def final(batch):
        return deployed_run(batch)[0]

    def run(batch):
        outputs = compiled(batch)
        if not job["layers"]:
            return [outputs[0]]
        return [outputs[positions[layer]] for layer, _ in recorded] + [outputs[0]]

    def instrumented_final(batch):
        return compiled(batch)[0]

    return Session(layers=recorded + [final_layer] if job["layers"] else [], run=run,
                   final=instrumented_final, accelerator=accelerator, checked=checked,
                   unrevealed=unrevealed,
                   unmapped=unmapped if job["layers"] else [], deployed=final,
                   deployed_program=f"{Path(job['model_path']).name} converted by "
                                    f"{conversion.converter}, on {runtime.NAME}")



def _litert_session(runtime, job, name, program, layers, accelerator, folder):
    """LiteRT on the program converted by litert-torch at the device's batch size
    (bitdrift.formats.tflite.file_session on the .tflite): the module calls whose tensor
    the conversion keeps recorded under their module paths
    (torch_conversions.litert_module_tensors, checked against the eager run's values on
    the first batch), the others unmapped; the final output last."""
    import os

    from bitdrift.backends.torch_program import conversions
    from bitdrift.backends.torch_program.program import EagerRunner
    from bitdrift.formats import tflite
    from bitdrift.inputs.datasets import first_batch

    batch = job["device"]["batch_size"]
    first = first_batch(job["dataset_path"], batch)
    path = os.path.join(folder, "model.tflite")
    conversion = conversions.to_litert(program, path, first)
    accelerator.update(conversion.fingerprint())
    accelerator["model_format"] = NAME
    modules = {layer: layer for layer, _ in layers[:-1]}  # named by their module paths

    def eager():
        values = EagerRunner(program, source=job["model_path"])([first]).layers
        return {layer: values[layer] for layer in modules if layer in values}

    by_module = conversions.litert_rename(layers, modules, eager)

    def rename(tensors, values):
        return by_module(tensors, values) if job["layers"] else ({}, [])

    accelerator["per_layer"] = (f"the module calls whose tensor {conversion.converter} "
                                "keeps, named by their module stack and equal to the eager "
                                "module's output on the first batch; the others are "
                                "unmapped")
    return tflite.file_session(runtime, job, name, path, rename=rename, program=(
        f"{Path(job['model_path']).name} converted by {conversion.converter}, on "
        f"{runtime.NAME}"), accelerator=accelerator)


# -- the program's layers, as the analyses take them ------------------------------------------
def file_layers(path) -> list[dict]:
    """The program's layers as bitdrift.inputs.models.keras_file_layers gives a Keras model's,
    named as the torch_export device records them (module paths, torch_program.
    module_outputs): each user input as an InputLayer, each ``aten.linear`` call as a
    Dense layer (kernel ``weight.T``, (terms, units)), each ``aten.conv2d`` call whose
    padding Keras can name (none, or stride-1 symmetric "same") as a channels-first
    Conv2D (kernel HWIO, as the ONNX loader gives a Conv's); every other call by its
    ATen op, with no weights, so those analyses leave it out. A layer's ``inbound`` is
    the recorded call that hands on its input, else that input's node name (a function
    outside any module: not recorded). ``op_type`` is the module class (Linear, Conv2d),
    ``node`` the graph node, ``input_shape`` its input's shape per sample (None where
    dynamic)."""
    from bitdrift.backends.torch_program.program import load_program

    return program_file_layers(load_program(path))


def program_file_layers(program) -> list[dict]:
    """file_layers of a loaded ExportedProgram."""
    from bitdrift.backends.torch_program.program import module_outputs

    module = program.module()
    recorded, _ = module_outputs(module.graph)
    names = {call.node: call.name for call in recorded}
    # the unlifted module's placeholders are the user inputs (its weights are get_attr)
    inputs = [node.name for node in module.graph.nodes if node.op == "placeholder"]
    layers = [{"name": name, "class_name": "InputLayer", "config": {}, "inbound": [],
               "weights": []} for name in inputs]
    # a call fed by one of several program inputs is read by its ATen op alone: the
    # analyses that read "the model input" (inbound None) know one
    several = set(inputs) if len(inputs) > 1 else set()
    for node in module.graph.nodes:
        if node.op != "call_function" or node.name not in names:
            continue
        target = str(node.target)
        source = node.args[0] if node.args and hasattr(node.args[0], "op") else None
        entry = {"name": names[node.name], "class_name": target, "config": {},
                 "inbound": [] if source is None else [_source(source, names)],
                 "weights": [], "node": node.name,
                 "input_shape": [] if source is None else _sample_shape(source)}
        if several.intersection(entry["inbound"]):
            pass
        elif target == LINEAR:
            weight, bias = (_value(module, arg) for arg in _arguments(node, 3)[1:])
            if weight is not None and weight.ndim == 2:
                entry.update(class_name="Dense", op_type="Linear", config={
                    "activation": "linear", "use_bias": bias is not None,
                    "units": int(weight.shape[0])},
                    weights=[np.ascontiguousarray(weight.T)] +
                    ([bias] if bias is not None else []))
        elif target == CONV2D:
            _, weight_node, bias_node, strides, pads, dilations, groups = _arguments(node, 7)
            weight, bias = _value(module, weight_node), _value(module, bias_node)
            strides, pads, dilations = (_pair(value) for value in (strides, pads, dilations))
            padding = _padding(pads, strides, dilations, weight.shape[2:]) \
                if weight is not None and weight.ndim == 4 else None
            if padding is not None:
                kernel = np.ascontiguousarray(weight.transpose(2, 3, 1, 0))  # to HWIO
                entry.update(class_name="Conv2D", op_type="Conv2d", config={
                    "activation": "linear", "use_bias": bias is not None,
                    "filters": int(kernel.shape[-1]), "strides": strides,
                    "dilation_rate": dilations, "padding": padding,
                    "data_format": "channels_first", "groups": int(groups)},
                    weights=[kernel] + ([bias] if bias is not None else []))
        layers.append(entry)
    from bitdrift.record.hdf5 import _sanitize  # named as the record names them

    return [dict(layer, name=_sanitize(layer["name"]),
                 inbound=[_sanitize(name) for name in layer["inbound"]]) for layer in layers]


# aten.conv2d's defaults: (input, weight, bias, stride, padding, dilation, groups)
CONV2D_DEFAULTS = (None, None, None, [1, 1], [0, 0], [1, 1], 1)


def _arguments(node, count: int) -> list:
    """A call's first ``count`` arguments, its keyword ones and ATen's defaults filled in."""
    import torch

    schema = node.target._schema.arguments if isinstance(
        node.target, torch._ops.OpOverload) else []
    values = list(node.args) + [None] * (count - len(node.args))
    for index, argument in enumerate(schema[:count]):
        if argument.name in node.kwargs:
            values[index] = node.kwargs[argument.name]
    if str(node.target) == CONV2D:
        values = [CONV2D_DEFAULTS[index] if value is None else value
                  for index, value in enumerate(values[:count])]
    return values[:count]


def _value(module, node) -> np.ndarray | None:
    """A parameter, buffer or constant a call reads (a get_attr node) as float numpy."""
    if node is None or getattr(node, "op", None) != "get_attr":
        return None
    from functools import reduce

    from bitdrift.backends.torch_program.program import to_numpy

    return to_numpy(reduce(getattr, node.target.split("."), module))


def _sample_shape(node) -> list:
    """A value's shape per sample (the batch axis dropped), None for a dynamic size."""
    value = node.meta.get("val")
    shape = getattr(value, "shape", None) or ()
    return [size if isinstance(size, int) else None for size in list(shape)[1:]]


def _source(node, names: dict) -> str:
    """The recorded call whose value ``node`` is, or a user input's name, else the node's
    own name (no layer has it: the analyses leave a layer so fed out)."""
    return names.get(node.name, node.name)


def _pair(value) -> list[int]:
    values = [int(item) for item in (value if isinstance(value, list | tuple) else [value])]
    return values * 2 if len(values) == 1 else values


def _padding(pads, strides, dilations, kernel_shape) -> str | None:
    """aten.conv2d's padding as Keras names it: valid (none), same (what same pads, both
    sides alike, at stride 1); None for any other."""
    if not any(pads):
        return "valid"
    wanted = [(size - 1) * dilation for size, dilation in zip(kernel_shape, dilations,
                                                               strict=True)]
    if strides == [1, 1] and all(total % 2 == 0 and pad == total // 2
                                 for pad, total in zip(pads, wanted, strict=True)):
        return "same"
    return None


# -- what the torch_export device checks and probes ---------------------------------------------
def checked_layers(layers: list[dict], recorded: list[str], precision: str) -> tuple[dict,
                                                                                    dict, dict]:
    """({layer: (effective-precision spec, [kernel, bias] as the device had them)},
    {layer: order probe spec (bitdrift.analysis.accumulation.probes.probe_spec)}, {layer: why its
    order
    is not revealed}) of the recorded Linear and Conv2d calls among ``layers``
    (file_layers); the effective-precision check takes those fed by the program input or
    a recorded call. A Linear's order is probed over (batch, terms) inputs, a Conv2d's
    (groups 1) at its input's own shape, channels-last in the spec (its terms in Keras'
    order: position, then channel) and channels-first where the probe runs it
    (node_order_probe)."""
    from bitdrift.analysis.accumulation.probes import probe_spec
    from bitdrift.analysis.effective_precision import spec_from_config
    from bitdrift.inputs.models import numpy_dtype

    inputs = {layer["name"] for layer in layers if layer["class_name"] == "InputLayer"}
    checked, orders, unrevealed = {}, {}, {}
    for layer in layers:
        name = layer["name"]
        if name not in recorded:
            continue
        if layer["class_name"] in (LINEAR, CONV2D) and len(inputs) > 1 and \
                set(layer["inbound"]) & inputs:  # file_layers reads it by its op alone
            unrevealed[name] = "fed by one of the program's several inputs: not probed"
            continue
        if layer["class_name"] == CONV2D:  # file_layers could not name its padding
            unrevealed[name] = ("a Conv2d whose padding is neither none nor the same on "
                                "both sides at stride 1: not read")
            continue
        if layer["class_name"] not in ("Dense", "Conv2D"):
            continue
        source = layer["inbound"][0] if layer["inbound"] else None
        spec = spec_from_config(layer["class_name"], layer["config"],
                                None if source in inputs else source)
        if spec is not None and (source in inputs or source in recorded):
            checked[name] = (spec, [np.asarray(value).astype(numpy_dtype(precision))
                                    for value in layer["weights"]])
        kernel, shape = layer["weights"][0], layer["input_shape"]
        found, why = None, None
        if not shape or None in shape:
            why = "its input has a dynamic size besides the batch"
        elif layer["class_name"] == "Dense":
            found = probe_spec("Dense", layer["config"], kernel.shape[:1], kernel.shape) \
                if len(shape) == 1 else None
            why = "a Linear over more than (batch, features): not probed"
        else:
            channels, height, width = shape
            found = probe_spec("Conv2D", {**layer["config"], "data_format": "channels_last"},
                               (height, width, channels), kernel.shape)
            why = "a grouped Conv2d: not probed"
        if found is not None:
            orders[name] = found
        else:
            unrevealed[name] = why
    return checked, orders, unrevealed


def node_order_probe(precision: str):
    """order_probe (bitdrift.backends.Session) of a program's Linear or Conv2d call: its
    ATen op alone (aten.linear, aten.conv2d, as the eager program calls it), in this
    process (the device's threads and environment) and the device's precision, on a
    batch of ones, the probe's weights in torch's layout (a Conv2d's kernel OIHW, its
    input and output channels-first, the sums read back channels-last)."""
    import torch

    from bitdrift.analysis.accumulation.probes import probe_output
    from bitdrift.backends.torch_program.program import to_numpy, to_tensor, torch_dtype

    dtype = torch_dtype(precision)

    def make(spec: dict, batch: int):
        conv = spec["class_name"] == "Conv2D"
        if conv:
            height, width, channels = spec["input_shape"]
            ones = torch.ones((batch, channels, height, width), dtype=dtype)
            config = spec["config"]
            pads = [0, 0] if config["padding"] == "valid" else [
                (size - 1) * dilation // 2 for size, dilation in zip(
                    spec["kernel_shape"][:2], config["dilation_rate"], strict=True)]
        else:
            ones = torch.ones((batch, spec["terms"]), dtype=dtype)

        def call(kernel, bias):
            kernel = np.asarray(kernel).reshape(spec["kernel_shape"])
            weight = to_tensor(np.ascontiguousarray(
                kernel.transpose(3, 2, 0, 1) if conv else kernel.T))
            shift = to_tensor(np.asarray(bias)) if spec["use_bias"] else None
            with torch.no_grad():
                if conv:
                    out = torch.ops.aten.conv2d.default(
                        ones, weight, shift, config["strides"], pads, config["dilation_rate"],
                        1).permute(0, 2, 3, 1)
                else:
                    out = torch.ops.aten.linear.default(ones, weight, shift)
            return probe_output(spec, to_numpy(out.contiguous()))

        return call

    return make
