"""ONNX models (a protobuf ModelProto), run as they are by ONNX Runtime and OpenVINO.

The per-layer record names each value by the model's own names: every float tensor a
node outputs is made a graph output of an instrumented copy (as Polygraphy's ``mark all``
does), in the graph's topological order; the final outputs stay last. A runtime that
returns no value for one of them has fused it away: that layer is recorded as absent
for the device (``unmapped``), never given another value."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bitdrift.errors import InferenceError, ModelFormatError
from bitdrift.formats import Input

NAME = "onnx"
WHAT = "an ONNX model"
# torch_export: torch eager on the model converted by onnx2torch (torch_session)
RUNTIMES = ("onnxruntime", "openvino", "torch_export", "litert")
# a model of several inputs: each fed by its name (a .npz of one array per input)
SEVERAL_INPUTS = ("onnxruntime", "openvino", "torch_export")


def recognise(path, head: bytes) -> bool:
    """A ModelProto has no magic number: its first field is ir_version (field 1, varint,
    tag 0x08) in the files onnx writes; the full parse in check() decides."""
    return head[:1] == b"\x08"


def _load(path):
    import onnx

    try:
        return onnx.load(str(path))
    except Exception as error:  # protobuf's DecodeError, onnx's own
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ModelFormatError(f"{path}: not an ONNX model, or a damaged one ({first})") \
            from error


def check(path) -> None:
    import onnx

    model = _load(path)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        first = (str(error).strip().splitlines() or ["invalid"])[0]
        raise ModelFormatError(f"{path}: an ONNX model the ONNX checker refuses ({first})") \
            from error


def _dtype(elem_type: int) -> str:
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name


def signature(path) -> list[Input]:
    graph = _load(path).graph
    constants = {initializer.name for initializer in graph.initializer}
    inputs = []
    for value in graph.input:
        if value.name in constants:
            continue
        tensor = value.type.tensor_type
        shape = tuple(dim.dim_value if dim.HasField("dim_value") else None
                      for dim in tensor.shape.dim)
        inputs.append(Input(value.name, shape, _dtype(tensor.elem_type)))
    return inputs


def instrumented(path):
    """(the model with every node's float output as a graph output, [(output name, op
    type)] in topological order with the final outputs last, the values left out because
    ONNX's shape inference, which gives each value's type, cannot type them)."""
    import onnx
    from onnx import TensorProto, helper

    model = _load(path)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as error:  # an op shape inference does not know
        raise InferenceError(f"{path}: ONNX shape inference fails ({error})") from error
    types = {value.name: value.type.tensor_type.elem_type
             for value in [*inferred.graph.value_info, *inferred.graph.output,
                           *inferred.graph.input]}
    floats = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
              TensorProto.BFLOAT16}
    finals = [output.name for output in model.graph.output]
    layers, added, untyped = [], [], []
    for node in model.graph.node:
        for output in node.output:
            if output and output not in finals and output not in types:
                untyped.append(output)
            if not output or output in finals or types.get(output) not in floats:
                continue
            layers.append((output, node.op_type))
            added.append(helper.make_tensor_value_info(output, types[output], None))
    producer = {output: node.op_type for node in model.graph.node for output in node.output}
    layers += [(name, producer.get(name, "Identity")) for name in finals]
    model.graph.output.extend(added)
    # the final outputs last, in their own order
    outputs = list(model.graph.output)
    ordered = [o for o in outputs if o.name not in finals] + \
        [o for o in outputs if o.name in finals]
    del model.graph.output[:]
    model.graph.output.extend(ordered)
    return model, layers, untyped


def open_session(runtime, job: dict, name: str):
    """A Session of ``runtime`` (onnxruntime, openvino) on the user's ONNX file: the
    instrumented copy when layers are recorded, the file itself as deployed (the observer
    check), both compiled with the device's settings."""
    import os
    import tempfile

    import onnx

    from bitdrift.backends import Session
    from bitdrift.backends.exported.expected import unreadable_export
    from bitdrift.errors import BitdriftError

    if runtime.NAME == "torch_export":
        return torch_session(runtime, job, name)
    if runtime.NAME == "litert":
        return litert_session(runtime, job, name)
    device, path = job["device"], job["model_path"]
    accelerator = runtime.check_accelerator(name, device)
    accelerator["model_format"] = NAME
    trace = bool(job.get("trace"))
    model, layers, untyped = instrumented(path)
    handle, instrumented_path = tempfile.mkstemp(suffix=".instrumented.onnx")
    os.close(handle)
    try:
        onnx.save(model, instrumented_path)
        compiled, describe = compile_model(runtime, instrumented_path, device, accelerator,
                                           trace, name, shown=path)
        deployed_run, _ = compile_model(runtime, path, device, dict(accelerator), False,
                                        name) if not trace else (None, None)
        nodes_outputs = describe() if trace else None
    except BitdriftError:
        raise
    except Exception as error:
        raise unreadable_export(path, runtime.NAME, error) from error
    finally:
        os.unlink(instrumented_path)
    recorded = list(layers)  # one per graph output of the instrumented model, in order

    def run(batch):
        outputs = compiled(batch)
        if len(outputs) != len(recorded):  # never map values to names by a guess
            raise InferenceError(f"device {name!r}: {runtime.NAME} returns {len(outputs)} "
                                 f"outputs of the instrumented {Path(path).name}, which asks "
                                 f"for {len(recorded)}")
        return list(outputs) if job["layers"] else [outputs[-1]]

    def final(batch):
        return compiled(batch)[-1]

    kernels = None
    if trace:
        from dataclasses import asdict

        from bitdrift.analysis.kernels import graph_layer_calls

        nodes, outputs = nodes_outputs
        found = graph_layer_calls(nodes, outputs, {position: layer for position, (layer, _)
                                                   in enumerate(recorded)})
        kernels = {layer: [asdict(call) for call in calls] for layer, calls in found.items()}

    def deployed(batch):
        outputs = deployed_run(batch)
        return outputs[-1]

    checked, order_layers = checked_layers(path, [output for output, _ in recorded])
    summing = {output: op for output, op in recorded if op in SUMMING_OPS}
    unrevealed = {output: f"an ONNX {op} node bitdrift does not probe (it probes MatMul and "
                          "Gemm nodes over rows, and ungrouped 2-D Conv nodes of valid or "
                          "same padding and a known input shape, with constant weights "
                          "and a recorded input)"
                  for output, op in summing.items() if output not in order_layers}
    return Session(layers=recorded if job["layers"] else [], run=run, final=final,
                   unrevealed=unrevealed, unmapped=untyped if job["layers"] else [],
                   checked=checked if job["layers"] else {}, order_layers=order_layers,
                   order_probe=node_order_probe(runtime, path, device, accelerator)
                   if order_layers else None,
                   accelerator=accelerator, kernels=kernels,
                   deployed=deployed if deployed_run is not None else None,
                   deployed_program=f"{Path(path).name} on {runtime.NAME}, as given")


def torch_session(runtime, job: dict, name: str):
    """A Session of torch eager (``runtime``: torch_export, its knobs: threads,
    deterministic, precision, the libraries' ISA variables) on the model converted by
    onnx2torch (bitdrift.backends.torch_program.conversions.from_onnx; converter and versions in
    the fingerprint; an op it lacks fails this device alone, named). Each node's output is
    recorded under the ONNX value it computes, the names an ONNX runtime's record has; a
    value no fx node is known to compute is unmapped, never guessed. The GraphModule's
    own forward is the model as deployed."""
    from bitdrift.backends import Session
    from bitdrift.backends.torch_program.conversions import from_onnx
    from bitdrift.backends.torch_program.program import (
        ProgramError,
        cast_module,
        configure,
        run_graph,
        to_tensor,
    )

    device, path = job["device"], job["model_path"]
    accelerator = runtime.check_accelerator(name, device)
    accelerator["model_format"] = NAME
    _, layers, untyped = instrumented(path)
    try:
        conversion = from_onnx(path)
    except InferenceError as error:
        raise InferenceError(f"device {name!r}: {error}") from error
    accelerator.update(conversion.fingerprint())
    precision = device["precision"]
    configure(device.get("threads"), device.get("deterministic"))
    try:
        module = cast_module(conversion.model, precision, Path(path).name)
    except ProgramError as error:
        raise InferenceError(f"device {name!r}: {error}") from error
    computed = set(conversion.layers.values())
    recorded = [(layer, op) for layer, op in layers if layer in computed]
    if not recorded or recorded[-1] != layers[-1]:
        raise InferenceError(f"device {name!r}: {conversion.converter} gives no node "
                             f"computing {Path(path).name}'s output {layers[-1][0]!r}")
    names = {}
    for node, value in conversion.layers.items():
        names.setdefault(node, []).append(value)
    wanted = [layer for layer, _ in recorded]
    accelerator["per_layer"] = (f"every ONNX node output {conversion.converter} computes "
                                "in an fx node of its own, by its ONNX name (torch eager)")

    # onnx2torch's placeholders follow the graph's inputs: several fed by name, in that order
    order = [wanted_input.name for wanted_input in signature(path)]

    def call(batch, record):
        arrays = [batch[input_name] for input_name in order] if isinstance(batch, dict) \
            else [batch]
        try:
            return run_graph(module, [to_tensor(array, precision) for array in arrays], names,
                             wanted, record, Path(path).name, precision)
        except ProgramError as error:
            raise InferenceError(f"device {name!r}: {error}") from error

    def run(batch):
        if not job["layers"]:
            return [final(batch)]
        found = call(batch, True).layers
        return [found[layer] for layer in wanted]

    def final(batch):
        return call(batch, False).outputs[-1]

    checked, _ = checked_layers(path, wanted)
    unrevealed = {layer: f"an ONNX {op} node on torch, whose order bitdrift does not probe "
                         "yet" for layer, op in recorded if op in SUMMING_OPS}
    return Session(layers=recorded if job["layers"] else [], run=run, final=final,
                   accelerator=accelerator, checked=checked if job["layers"] else {},
                   unmapped=[layer for layer, _ in layers if layer not in computed] + untyped
                   if job["layers"] else [], unrevealed=unrevealed, deployed=final,
                   deployed_program=f"{Path(path).name} converted by "
                                    f"{conversion.converter}, its forward, torch eager")


def litert_session(runtime, job: dict, name: str):
    """A Session of LiteRT (``runtime``: its resolver and threads) on the ONNX model
    converted twice: by onnx2torch to a torch module (torch_conversions.from_onnx), and
    that by litert-torch to a .tflite at the device's batch size (to_litert); both
    converters and their versions in the fingerprint, a failure of either failing this
    device alone, named. A node's value is recorded under its ONNX value's name where
    litert-torch names a tensor by the onnx2torch module computing it and that tensor's
    value on the first batch equals the module's eager output
    (torch_conversions.litert_module_tensors); the others are unmapped, never guessed."""
    import os
    import shutil
    import tempfile

    from bitdrift.backends.torch_program import conversions
    from bitdrift.backends.torch_program.program import run_graph, to_tensor
    from bitdrift.formats import tflite
    from bitdrift.inputs.datasets import first_batch

    device, path = job["device"], job["model_path"]
    accelerator = runtime.check_accelerator(name, device)
    accelerator["model_format"] = NAME
    _, layers, _ = instrumented(path)
    batch = device["batch_size"]
    first = first_batch(job["dataset_path"], batch)
    folder = tempfile.mkdtemp(prefix="bitdrift-onnx-litert-")
    try:
        converted_path = os.path.join(folder, "model.tflite")
        try:
            to_torch = conversions.from_onnx(path)
            to_tflite = conversions.to_litert(to_torch.model.eval(), converted_path, first)
        except InferenceError as error:
            raise InferenceError(f"device {name!r}: {error}") from error
        accelerator.update({
            "converter": f"{to_torch.converter}, then {to_tflite.converter}",
            "converter_versions": {**to_torch.versions, **to_tflite.versions},
            "converter_options": {**to_torch.options, **to_tflite.options}})
        # {onnx2torch submodule: the ONNX value its node computes}
        graph = {node.name: node for node in to_torch.model.graph.nodes}
        values = {graph[node].target: value for node, value in to_torch.layers.items()
                  if graph[node].op == "call_module"}

        def eager():
            return run_graph(to_torch.model, [to_tensor(first)],
                             {node: [graph[node].target] for node in to_torch.layers
                              if graph[node].op == "call_module"},
                             list(values), True, path, "float32").layers

        by_module = conversions.litert_rename(layers, values, eager)

        def rename(tensors, found_values):
            return by_module(tensors, found_values) if job["layers"] else ({}, [])

        accelerator["per_layer"] = (
            "the ONNX nodes whose onnx2torch module names a tensor litert-torch keeps, "
            "equal to the module's eager output on the first batch; the others are "
            "unmapped")
        return tflite.file_session(runtime, job, name, converted_path, rename=rename,
                                   program=f"{Path(path).name} converted by "
                                   f"{accelerator['converter']}, on {runtime.NAME}",
                                   accelerator=accelerator)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


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


SUMMING_OPS = ("MatMul", "Gemm", "Conv")  # the nodes whose summation order matters
OP_WORDS = ("no conversion rule found for operations", "not implemented", "no kernel",
            "could not find an implementation", "unsupported op",
            "didn't find op for builtin opcode", "unresolved custom op")


def file_layers(path) -> list[dict]:
    """The model's nodes as bitdrift.inputs.models.keras_file_layers gives a Keras model's (named
    as the record names them), for
    the analyses that recompute a layer from its weights (effective precision, repro):
    each graph input as an InputLayer, each MatMul or Gemm with constant weights as a
    Dense layer, each Conv as a channels-first Conv2D (named by its output); every other
    node by its op type, with no weights, so those analyses leave it out."""
    from onnx import numpy_helper

    graph = _load(path).graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    for node in graph.node:  # Constant nodes hold weights too
        if node.op_type == "Constant" and node.attribute and node.attribute[0].t.dims:
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    layers = [{"name": value.name, "class_name": "InputLayer", "config": {}, "inbound": [],
               "weights": []} for value in graph.input if value.name not in constants]
    # a node fed by one of several model inputs is read by its op type alone: the analyses
    # that read "the model input" (inbound None) know one
    several = {layer["name"] for layer in layers} if len(layers) > 1 else set()
    for node in graph.node:
        attributes = {attribute.name: attribute for attribute in node.attribute}

        def number(key, default, attributes=attributes):
            found = attributes.get(key)
            if found is None:
                return default
            return found.f if found.type == found.FLOAT else found.i

        def ints(key, default, attributes=attributes):
            found = attributes.get(key)
            return list(found.ints) if found is not None else default

        inbound = [name for name in node.input if name and name not in constants]
        entry = {"name": node.output[0], "class_name": node.op_type, "config": {},
                 "inbound": inbound, "weights": []}
        if several.intersection(inbound):
            layers.append(entry)
            continue
        weights = [constants.get(name) for name in node.input[1:]]
        if node.op_type in ("MatMul", "Gemm") and len(inbound) == 1 and weights and \
                weights[0] is not None and weights[0].ndim == 2:
            kernel = weights[0]
            bias = weights[1] if len(weights) > 1 else None
            plain = node.op_type == "MatMul" or (
                number("alpha", 1.0) == 1.0 and number("beta", 1.0) == 1.0
                and not number("transA", 0) and (bias is None or bias.ndim == 1))
            if plain:
                if node.op_type == "Gemm" and number("transB", 0):
                    kernel = kernel.T
                entry.update(class_name="Dense", op_type=node.op_type, config={
                    "activation": "linear", "use_bias": bias is not None,
                    "units": int(kernel.shape[1])},
                    weights=[kernel] + ([bias] if bias is not None else []))
        elif node.op_type == "Conv" and len(inbound) == 1 and weights and \
                weights[0] is not None and weights[0].ndim == 4:
            padding = _padding(attributes, number, ints, weights[0].shape[2:])
            if padding is not None:
                kernel = np.ascontiguousarray(weights[0].transpose(2, 3, 1, 0))  # to HWIO
                bias = weights[1] if len(weights) > 1 and weights[1] is not None else None
                entry.update(class_name="Conv2D", op_type="Conv", config={
                    "activation": "linear", "use_bias": bias is not None,
                    "filters": int(kernel.shape[-1]), "strides": ints("strides", [1, 1]),
                    "dilation_rate": ints("dilations", [1, 1]), "padding": padding,
                    "data_format": "channels_first", "groups": int(number("group", 1))},
                    weights=[kernel] + ([bias] if bias is not None else []))
        layers.append(entry)
    # named as the record names them (HDF5 takes "/" for a path: bitdrift.record.hdf5)
    from bitdrift.record.hdf5 import _sanitize

    return [dict(layer, name=_sanitize(layer["name"]),
                 inbound=[_sanitize(name) for name in layer["inbound"]]) for layer in layers]


def _padding(attributes, number, ints, kernel_shape) -> str | None:
    """A Conv's padding as Keras names it: valid (none), same (SAME_UPPER, or explicit
    pads that are what same pads at stride 1); None for any other padding."""
    auto = attributes.get("auto_pad")
    auto = auto.s.decode() if auto is not None else "NOTSET"
    if auto == "VALID":
        return "valid"
    if auto == "SAME_UPPER":
        return "same"
    if auto != "NOTSET":
        return None
    pads = ints("pads", [0, 0, 0, 0])
    if not any(pads):
        return "valid"
    strides, dilations = ints("strides", [1, 1]), ints("dilations", [1, 1])
    same = [((size - 1) * dilation) for size, dilation in zip(kernel_shape, dilations,
                                                               strict=True)]
    begin = [total // 2 for total in same]
    end = [total - total // 2 for total in same]
    if strides == [1, 1] and pads == begin + end:
        return "same"
    return None


def node_model(path, layer: str, input_shape: tuple):
    """The node whose output the record names ``layer`` alone, as an ONNX model of the
    same opset: its input ``x`` (a batch of ``input_shape``), its constant operands as
    initializers, its attributes as in the file, its output ``y`` (bitdrift.run.repro)."""
    from onnx import helper

    from bitdrift.record.hdf5 import _sanitize

    model = _load(path)
    graph = model.graph
    node = next((node for node in graph.node if node.output and
                 _sanitize(node.output[0]) == layer), None)
    if node is None:
        raise InferenceError(f"{path}: no node outputs {layer!r}")
    constants = {tensor.name: tensor for tensor in graph.initializer}
    constants.update({item.output[0]: item.attribute[0].t for item in graph.node
                      if item.op_type == "Constant" and item.attribute})
    types = {value.name: value.type.tensor_type.elem_type for value in graph.input}
    inputs = [name for name in node.input if name and name not in constants]
    if len(inputs) != 1:
        raise InferenceError(f"{path}: node {node.name or layer!r} has {len(inputs)} "
                             "inputs; a repro runs one-input nodes")
    alone = helper.make_node(node.op_type, ["x" if name == inputs[0] else name
                                            for name in node.input],
                             ["y"] + [f"unused_{index}" for index in range(1, len(node.output))],
                             domain=node.domain)
    alone.attribute.extend(node.attribute)
    used = [constants[name] for name in node.input if name in constants]
    elem_type = types.get(inputs[0], 1)  # float unless the model input says otherwise
    graph_alone = helper.make_graph(
        [alone], f"{layer}_alone",
        [helper.make_tensor_value_info("x", elem_type, [None, *input_shape])],
        [helper.make_tensor_value_info("y", elem_type, None)],
        [tensor for tensor in used])
    alone_model = helper.make_model(graph_alone, opset_imports=list(model.opset_import))
    alone_model.ir_version = model.ir_version
    return alone_model


def checked_layers(path, recorded: list[str]) -> tuple[dict, dict]:
    """({output: (effective-precision spec, [kernel, bias])}, {output: order probe spec}):
    the MatMul, Gemm (as Dense) and Conv (as channels-first Conv2D) nodes whose output and
    input are recorded, named by their output as the session records it; the order of the
    Dense ones over a (batch, terms) input is revealed (bitdrift.analysis.accumulation)."""
    from bitdrift.analysis.accumulation.probes import probe_spec
    from bitdrift.analysis.effective_precision import spec_from_config
    from bitdrift.record.hdf5 import _sanitize

    raw = {_sanitize(name): name for name in recorded}
    layers = file_layers(path)
    inputs = {layer["name"] for layer in layers if layer["class_name"] == "InputLayer"}
    shapes = {_sanitize(name): shape for name, shape in value_shapes(path).items()}
    checked, orders = {}, {}
    for layer in layers:
        if layer["class_name"] not in ("Dense", "Conv2D") or layer["name"] not in raw:
            continue
        source = layer["inbound"][0]
        inbound = None if source in inputs else raw.get(source)
        if inbound is None and source not in inputs:
            continue  # its input is not recorded
        spec = spec_from_config(layer["class_name"], layer["config"], inbound)
        if spec is None:
            continue
        name = raw[layer["name"]]
        checked[name] = (spec, [np.asarray(value, np.float64) for value in layer["weights"]])
        kernel = layer["weights"][0]
        shape = shapes.get(source)
        if layer["class_name"] == "Dense" and (source not in inputs or len(shape or []) == 2):
            found = probe_spec("Dense", layer["config"], kernel.shape[:1], kernel.shape)
            if found is not None:
                orders[name] = {**found, "op_type": layer["op_type"], "node": layer["name"]}
        elif layer["class_name"] == "Conv2D" and shape and len(shape) == 4 and \
                None not in shape[1:]:
            # the sum described as Keras' channels-last Conv2D's (its terms in Keras' kernel
            # order, its output grid); the probe feeds the node channels-first and reads
            # its output back channels-last (channels_first; probe_output)
            channels, height, width = shape[1:]
            found = probe_spec("Conv2D", {**layer["config"], "data_format": "channels_last"},
                               (height, width, channels), kernel.shape)
            if found is not None:
                orders[name] = {**found, "op_type": "Conv", "node": layer["name"],
                                "channels_first": True}
    return checked, orders


def value_shapes(path) -> dict:
    """{value name: its shape as ONNX's shape inference gives it (None where a dimension
    is free)}, of every graph input and node output it can type (instrumented has run it
    on the same file)."""
    import onnx

    graph = onnx.shape_inference.infer_shapes(_load(path)).graph
    return {value.name: [dim.dim_value if dim.HasField("dim_value") else None
                         for dim in value.type.tensor_type.shape.dim]
            for value in [*graph.input, *graph.value_info, *graph.output]
            if value.type.HasField("tensor_type")}


def node_order_probe(runtime, path, device: dict, accelerator: dict):
    """order_probe (bitdrift.backends.Session) of an ONNX model's MatMul, Gemm or Conv
    node: the node alone, cut from the file with its own attributes (node_model), its
    weights replaced by the probe's, compiled with the device's settings, on a batch of
    ones (a Conv's channels-first, at its input's shape in the model)."""
    import onnx
    from onnx import numpy_helper

    from bitdrift.backends.exported.common import run_probe_model

    def make(spec: dict, batch: int):
        conv = spec["op_type"] == "Conv"
        if conv:
            height, width, channels = spec["input_shape"]
            shape = (channels, height, width)
        else:
            shape = (spec["terms"],)
        ones = np.ones((batch, *shape), dtype=np.float32)
        alone = node_model(path, spec["node"], shape)
        node = alone.graph.node[0]
        transposed = spec["op_type"] == "Gemm" and any(
            attribute.name == "transB" and attribute.i for attribute in node.attribute)
        constants = [name for name in node.input[1:] if name]

        def call(kernel, bias):
            if conv:  # the probe's (kh, kw, cin, units) as ONNX's (units, cin, kh, kw)
                kernel = np.asarray(kernel, np.float32).reshape(spec["kernel_shape"])
                values = [kernel.transpose(3, 2, 0, 1)]
            else:
                kernel = np.asarray(kernel, np.float32).reshape(spec["terms"], spec["units"])
                values = [kernel.T if transposed else kernel]
            if spec["use_bias"]:
                values.append(np.asarray(bias, np.float32))
            probe = onnx.ModelProto()
            probe.CopyFrom(alone)
            del probe.graph.initializer[:]
            probe.graph.initializer.extend(numpy_helper.from_array(
                np.ascontiguousarray(value), name) for name, value in zip(
                    constants, values, strict=True))
            return run_probe_model(runtime, probe, device, accelerator, spec, ones)

        return call

    return make
