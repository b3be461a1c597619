"""A user's ONNX model run as it is by an ONNX runtime (ONNX Runtime, OpenVINO), as
Polygraphy runs one: ``SessionFromOnnx(ModifyOutputs(OnnxFromPath(p)))``.

The loader step (:func:`instrumented`) makes every float tensor a node outputs a graph
output of a copy of the model (as Polygraphy's ``mark all`` does), in the graph's
topological order, the final outputs last; the runtime's runner (its ``compile``) runs
that copy. The per-layer record names each value by the model's own names. A runtime that
returns no value for one of them has fused it away: that layer is recorded as absent for
the device (``unmapped``), never given another value. The file itself, compiled alone, is
the model as deployed (the observer check).

Exposing a value stops the fusions that consume it (ONNX Runtime fuses MatMul and Add into
a Gemm only where the MatMul's output is no graph output), so on a runtime that writes the
graph it deploys (``runtime.optimised_model``: ONNX Runtime's
``optimized_model_filepath``) the exposed values are that graph's node outputs instead
(:func:`exposed_graph`), run without optimising it again: the file's values it keeps
(under their own names) are recorded, those it fused away are unmapped, and the final
output is the deployed model's. The same model converted for torch eager or
LiteRT is bitdrift.backends.torch_program's (eager.open_onnx, converted.onnx_on_litert).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bitdrift.backends.exported.common import cannot_run, compile_model, run_probe_model
from bitdrift.errors import InferenceError
from bitdrift.formats.onnx import NAME, SUMMING_OPS, file_layers, load_model, value_shapes

# The nodes of a quantized model whose outputs are integers a record keeps as they are
# (issue 65): quantization, integer matmuls and convolutions, QLinear* ops
INTEGER_OPS = {"DynamicQuantizeLinear", "QuantizeLinear", "MatMulInteger", "ConvInteger",
               "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}
# Where a node's output's scale and zero point come from: (scale, zero point) as
# ("input", index) or ("output", index) of the node; None where the graph gives none
QUANTIZATION_PARAMS = {"DynamicQuantizeLinear": (("output", 1), ("output", 2)),
                       "QuantizeLinear": (("input", 1), ("input", 2)),
                       "MatMulInteger": (None, None), "ConvInteger": (None, None),
                       "QLinearConv": (("input", 6), ("input", 7)),
                       "QLinearMatMul": (("input", 6), ("input", 7))}


def integer_node(node) -> bool:
    """Whether a node computes integers a quantized model's record keeps (INTEGER_OPS,
    QLinear*)."""
    return node.op_type in INTEGER_OPS or node.op_type.startswith("QLinear")


def quantization_params(model, layers: list) -> dict:
    """{integer layer: {"scale": ..., "zero_point": ...}} for the recorded integer outputs
    of ``model``'s integer nodes: each a constant (a list of numbers, from an initializer
    or a Constant node) or {"layer": name}, a recorded per-batch value (a
    DynamicQuantizeLinear's scale and zero-point outputs). A MatMulInteger's or
    ConvInteger's int32 output has no scale of its own; its operands' zero points are
    given as "input_zero_point" and "weight_zero_point". Where the graph gives none, the
    key is left out."""
    from onnx import numpy_helper

    constants = {tensor.name: numpy_helper.to_array(tensor)
                 for tensor in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attribute in node.attribute:
                if attribute.name == "value":
                    constants[node.output[0]] = numpy_helper.to_array(attribute.t)
    recorded = {name for name, _ in layers}

    def source(name):
        if not name:
            return None
        if name in constants:
            return np.asarray(constants[name]).reshape(-1).tolist()
        return {"layer": name} if name in recorded else None

    found = {}
    for node in model.graph.node:
        if not integer_node(node) or not node.output or node.output[0] not in recorded:
            continue
        params = {}
        if node.op_type in ("MatMulInteger", "ConvInteger"):
            for key, index in (("input_zero_point", 2), ("weight_zero_point", 3)):
                value = source(node.input[index]) if len(node.input) > index else [0]
                if value is not None:
                    params[key] = value
        else:
            where = QUANTIZATION_PARAMS.get(node.op_type, (None, None))
            for key, place in zip(("scale", "zero_point"), where, strict=True):
                if place is None:
                    continue
                names = node.input if place[0] == "input" else node.output
                value = source(names[place[1]]) if len(names) > place[1] else None
                if value is not None:
                    params[key] = value
        if params:
            found[node.output[0]] = params
    return found


def instrumented(path, integers: bool = False):
    """(the model with every node's float output computed from the model's inputs as a
    graph output, [(output name, op type)] in topological order with the final outputs
    last, the values left out because ONNX's shape inference, which gives each value's
    type, cannot type them). ``integers``: the integer outputs of integer nodes
    (integer_node: a quantized model's codes and int32 accumulators) too, with their own
    dtype, and a DynamicQuantizeLinear's per-batch scale and zero point (scalars, the run
    gives one per sample)."""
    import onnx
    from onnx import TensorProto, helper

    model = load_model(path)
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as error:  # an op shape inference does not know
        raise InferenceError(f"{path}: ONNX shape inference fails ({error})") from error
    types = {value.name: value.type.tensor_type.elem_type
             for value in [*inferred.graph.value_info, *inferred.graph.output,
                           *inferred.graph.input]}
    floats = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16,
              TensorProto.BFLOAT16}
    # a scalar computed from the inputs has no sample axis: one value per batch, such as
    # dynamic quantization's activation scale (DynamicQuantizeLinear's y_scale)
    scalars = {value.name for value in inferred.graph.value_info
               if value.type.tensor_type.HasField("shape")
               and not value.type.tensor_type.shape.dim}
    finals = [output.name for output in model.graph.output]
    # the values computed from the model's inputs: a node of constants alone (a Constant,
    # an Identity of a weight, as torch.onnx.export writes them) holds no sample's value
    # (a scalar has no batch axis to record), and is the file's, not the device's
    constants = {tensor.name for tensor in model.graph.initializer}
    varying = {value.name for value in model.graph.input if value.name not in constants}
    for node in model.graph.node:
        if varying.intersection(node.input):
            varying.update(output for output in node.output if output)
    integer_types = {TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32}
    layers, added, untyped = [], [], []
    for node in model.graph.node:
        kept_scalars = integers and node.op_type == "DynamicQuantizeLinear"
        for output in node.output:
            if output and output not in finals and output not in types and \
                    output in varying:
                untyped.append(output)
            wanted = types.get(output) in floats or (
                integers and integer_node(node) and types.get(output) in integer_types)
            if not output or output in finals or not wanted or output not in varying or \
                    (output in scalars and not kept_scalars):
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


def exposed_graph(optimised, model, layers: list, path):
    """(``optimised``, a runtime's optimised graph of the file at ``path``, with each value of
    ``layers`` (instrumented's, of ``model``, the instrumented file) that one of its nodes
    outputs as a graph output, in the file's order, the final outputs last; those layers;
    the others: values the graph has fused away, as a MatMul's output inside a Gemm).
    A kept value keeps its name and meaning (the optimiser renames what it changes: an
    NCHWc convolution's blocked output is ``reorder_token_1``, its ``ReorderOutput``
    writes the file's name), so its layer is the file's node's, named and classed so."""
    import onnx

    finals = [output.name for output in optimised.graph.output]
    if finals != [name for name, _ in layers[len(layers) - len(finals):]]:
        raise InferenceError(f"{Path(path).name}: the optimised graph's outputs {finals} "
                             "are not the file's; refusing to map its values by a guess")
    held = {output for node in optimised.graph.node for output in node.output}
    declared = {output.name: output for output in model.graph.output}
    kept = [(name, op) for name, op in layers[:len(layers) - len(finals)] if name in held]
    fused = [name for name, _ in layers[:len(layers) - len(finals)] if name not in held]
    exposed = onnx.ModelProto()
    exposed.CopyFrom(optimised)
    outputs = [declared[name] for name, _ in kept] + list(optimised.graph.output)
    del exposed.graph.output[:]
    exposed.graph.output.extend(outputs)
    return exposed, kept + layers[len(layers) - len(finals):], fused


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

    device, path = job["device"], job["model_path"]
    accelerator = runtime.check_accelerator(name, device)
    accelerator["model_format"] = NAME
    trace = bool(job.get("trace"))
    # a quantized model's integer layers where the runtime returns them as graph outputs
    # (ONNX Runtime: INTEGER_LAYERS)
    model, layers, untyped = instrumented(path, integers=getattr(runtime, "INTEGER_LAYERS",
                                                                 False))
    quantization = quantization_params(model, layers)  # the file's nodes and constants
    # A runtime that writes the graph it deploys (ONNX Runtime) has that graph's node
    # outputs exposed instead of the file's: exposing a value of the file (a MatMul's
    # output) stops the fusion that consumes it (MatMul+Add -> Gemm), and the layers would
    # describe a program nobody deploys. The file's values the graph fused away are
    # unmapped for the device, never given another value.
    compile_device, fused = device, []
    optimise = getattr(runtime, "optimised_model", None)
    if optimise is not None:
        try:
            graph, compile_device, accelerator["exposed"] = optimise(path, device,
                                                                     dict(accelerator))
        except BitdriftError:
            raise
        except Exception as error:
            raise cannot_run(runtime, path, name, error) from error
        model, layers, fused = exposed_graph(graph, model, layers, path)
    handle, instrumented_path = tempfile.mkstemp(suffix=".instrumented.onnx")
    os.close(handle)
    try:
        onnx.save(model, instrumented_path)
        compiled, describe = compile_model(runtime, instrumented_path, compile_device,
                                           accelerator, trace, name, shown=path)
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
    quantization = {layer: params for layer, params in quantization.items()
                    if layer in {name for name, _ in recorded}}

    def run(batch):
        outputs = compiled(batch)
        if len(outputs) != len(recorded):  # never map values to names by a guess
            raise InferenceError(f"device {name!r}: {runtime.NAME} returns {len(outputs)} "
                                 f"outputs of the instrumented {Path(path).name}, which asks "
                                 f"for {len(recorded)}")
        if not job["layers"]:
            return [outputs[-1]]
        # a batch's scalar (a DynamicQuantizeLinear's scale), given once per sample
        size = len(outputs[-1])
        return [np.full(size, value) if np.ndim(value) == 0 else value
                for value in outputs]

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

    checked, order_layers, unrevealed = checked_layers(path, [output for output, _ in
                                                              recorded])
    summing = {output: op for output, op in recorded if op in SUMMING_OPS}
    unrevealed = {output: unrevealed.get(output, f"an ONNX {op} node bitdrift does not probe")
                  for output, op in summing.items() if output not in order_layers}
    return Session(layers=recorded if job["layers"] else [], run=run, final=final,
                   unrevealed=unrevealed, unmapped=untyped + fused if job["layers"] else [],
                   checked=checked if job["layers"] else {}, order_layers=order_layers,
                   order_probe=node_order_probe(runtime, path, device, accelerator)
                   if order_layers else None,
                   accelerator=accelerator, kernels=kernels,
                   deployed=deployed if deployed_run is not None else None,
                   deployed_program=f"{Path(path).name} on {runtime.NAME}, as given",
                   quantization=quantization if job["layers"] else {})


def checked_layers(path, recorded: list[str]) -> tuple[dict, dict, dict]:
    """({output: (effective-precision spec, [kernel, bias])}, {output: order probe spec},
    {output: why its order is not probed}): the MatMul, Gemm (as Dense) and Conv (as
    channels-first Conv2D) nodes whose output and input are recorded, named by their
    output as the session records it. A Dense node's order is revealed at its input's own
    shape per sample ((terms,), or a transformer's (tokens, terms): the GEMM of every
    leading position, probes.dense_grid), a Conv's (grouped and depthwise too) at its
    input's (bitdrift.analysis.accumulation); both need that shape known to ONNX's shape
    inference. Every other recorded MatMul, Gemm or Conv node is in the third dict, the
    reason said."""
    from bitdrift.analysis.accumulation.probes import probe_spec
    from bitdrift.analysis.effective_precision import spec_from_config
    from bitdrift.record.hdf5 import _sanitize

    raw = {_sanitize(name): name for name in recorded}
    layers = file_layers(path)
    inputs = {layer["name"] for layer in layers if layer["class_name"] == "InputLayer"}
    shapes = {_sanitize(name): shape for name, shape in value_shapes(path).items()}
    checked, orders, unrevealed = {}, {}, {}
    for layer in layers:
        if layer["name"] not in raw:
            continue
        name = raw[layer["name"]]
        if layer["class_name"] == "MatMul" and layer.get("op_type") == "MatMul":
            found, why = _activations_matmul(layer, raw, inputs, shapes)
            if found is None:
                unrevealed[name] = why
            else:
                checked[name], orders[name] = found
            continue
        if layer["class_name"] not in ("Dense", "Conv2D"):
            if layer["class_name"] in SUMMING_OPS:
                unrevealed[name] = _not_read(layer, inputs)
            continue
        source = layer["inbound"][0]
        inbound = None if source in inputs else raw.get(source)
        if inbound is None and source not in inputs:
            unrevealed[name] = f"its input {source} is not recorded"
            continue
        spec = spec_from_config(layer["class_name"], layer["config"], inbound)
        if spec is None:
            continue
        checked[name] = (spec, [np.asarray(value, np.float64) for value in layer["weights"]])
        kernel = layer["weights"][0]
        shape = shapes.get(source)
        if not shape or None in shape[1:]:
            unrevealed[name] = (f"its input's shape {shape} is not known to ONNX's shape "
                                "inference besides the batch: not probed")
            continue
        found = None
        if layer["class_name"] == "Dense" and len(shape) >= 2:
            found = probe_spec("Dense", layer["config"], shape[1:], kernel.shape)
            if found is not None:
                found = {**found, "op_type": layer["op_type"], "node": layer["name"]}
        elif layer["class_name"] == "Conv2D" and len(shape) == 4:
            # the sum described as Keras' channels-last Conv2D's (its terms in Keras' kernel
            # order, its output grid); the probe feeds the node channels-first and reads
            # its output back channels-last (channels_first; probe_output)
            channels, height, width = shape[1:]
            found = probe_spec("Conv2D", {**layer["config"], "data_format": "channels_last"},
                               (height, width, channels), kernel.shape)
            if found is not None:
                found = {**found, "op_type": "Conv", "node": layer["name"],
                         "channels_first": True}
        if found is None:
            unrevealed[name] = (f"an ONNX {layer['op_type']} node over an input of shape "
                                f"{shape}: not probed")
        else:
            orders[name] = found
    return checked, orders, unrevealed


def _activations_matmul(layer: dict, raw: dict, inputs: set, shapes: dict):
    """((effective-precision spec, no weights), order probe spec) of a recorded MatMul of
    two activations (attention's Q @ K^T: (batch, ..., M, K) @ (batch, ..., K, N)), or
    (None, why not). Both operands must be recorded layers (the checks read them from the
    record) of shapes known besides the batch, of one rank with the same leading axes.
    Its probe is the node alone fed the probe's weights as its second operand, the same
    (K, N) in every leading position (node_order_probe); a place is a leading position
    (probes.dense_grid)."""
    from bitdrift.analysis.accumulation.probes import probe_spec
    from bitdrift.analysis.effective_precision import spec_from_config

    first, second = layer["inbound"]
    missing = [source for source in (first, second) if source in inputs or source not in raw]
    if missing:
        return None, (f"an ONNX MatMul of two activations whose operand {missing[0]} is "
                      "not a recorded layer: not read")
    left, right = shapes.get(first), shapes.get(second)
    if not left or not right or None in left[1:] + right[1:]:
        return None, (f"an ONNX MatMul of two activations of shapes {left} and {right}, not "
                      "known to ONNX's shape inference besides the batch: not read")
    if len(left) != len(right) or len(left) < 3 or left[1:-2] != right[1:-2] or \
            left[-1] != right[-2]:
        return None, (f"an ONNX MatMul of two activations of shapes {left} and {right}: it "
                      "reads (batch, ..., M, K) @ (batch, ..., K, N) of the same leading "
                      "axes")
    spec = spec_from_config("MatMul", layer["config"], raw[first], raw[second])
    found = probe_spec("Dense", {"use_bias": False}, left[1:], (left[-1], right[-1]))
    return ((spec, []), {**found, "op_type": "MatMul", "node": layer["name"],
                         "operand_shape": [int(size) for size in right[1:]]}), None


def _not_read(layer: dict, inputs: set) -> str:
    """Why file_layers reads a recorded MatMul, Gemm or Conv node as no Dense or Conv2D."""
    op = layer["class_name"]
    if set(layer["inbound"]) & inputs and len(inputs) > 1:
        return f"an ONNX {op} node fed by one of the model's several inputs: not read"
    return (f"an ONNX {op} node bitdrift does not read as a layer (it reads MatMul and Gemm "
            "nodes of one activation and a constant 2-D weight, and 2-D Conv nodes of "
            "valid or same padding)")


def node_model(path, layer: str, input_shape: tuple, operand_shape: tuple | None = None):
    """The node whose output the record names ``layer`` alone, as an ONNX model of the
    same opset: its input ``x`` (a batch of ``input_shape``), its constant operands as
    initializers, its attributes as in the file, its output ``y`` (bitdrift.run.repro).
    ``operand_shape``: the node's second input is an activation too (a MatMul of two),
    the model's input ``w``, a batch of that shape."""
    import onnx
    from onnx import helper

    from bitdrift.record.hdf5 import _sanitize

    model = load_model(path)
    graph = model.graph
    node = next((node for node in graph.node if node.output and
                 _sanitize(node.output[0]) == layer), None)
    if node is None:
        raise InferenceError(f"{path}: no node outputs {layer!r}")
    constants = {tensor.name: tensor for tensor in graph.initializer}
    for item in graph.node:  # a Constant node's tensor, as an initializer of its name
        value = next((attribute.t for attribute in item.attribute
                      if attribute.name == "value"), None) if item.op_type == "Constant" \
            else None
        if value is not None:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value)
            tensor.name = item.output[0]
            constants[item.output[0]] = tensor
    types = {value.name: value.type.tensor_type.elem_type for value in graph.input}
    inputs = [name for name in node.input if name and name not in constants]
    if len(inputs) != (1 if operand_shape is None else 2):
        raise InferenceError(f"{path}: node {node.name or layer!r} has {len(inputs)} "
                             "inputs; a repro runs one-input nodes")
    renamed = {inputs[0]: "x", **({inputs[1]: "w"} if operand_shape is not None else {})}
    alone = helper.make_node(node.op_type, [renamed.get(name, name) for name in node.input],
                             ["y"] + [f"unused_{index}" for index in range(1, len(node.output))],
                             domain=node.domain)
    alone.attribute.extend(node.attribute)
    used = [constants[name] for name in node.input if name in constants]
    elem_type = types.get(inputs[0], 1)  # float unless the model input says otherwise
    graph_alone = helper.make_graph(
        [alone], f"{layer}_alone",
        [helper.make_tensor_value_info("x", elem_type, [None, *input_shape])] + (
            [helper.make_tensor_value_info("w", elem_type, [None, *operand_shape])]
            if operand_shape is not None else []),
        [helper.make_tensor_value_info("y", elem_type, None)],
        [tensor for tensor in used])
    alone_model = helper.make_model(graph_alone, opset_imports=list(model.opset_import))
    alone_model.ir_version = model.ir_version
    return alone_model


def node_order_probe(runtime, path, device: dict, accelerator: dict):
    """order_probe (bitdrift.backends.Session) of an ONNX model's MatMul, Gemm or Conv
    node: the node alone, cut from the file with its own attributes (node_model), its
    weights replaced by the probe's (a MatMul of two activations fed them as its second
    operand), compiled with the device's settings, on a batch of
    ones at its input's shape in the model (a Conv's channels-first)."""
    import onnx
    from onnx import numpy_helper

    def make(spec: dict, batch: int):
        conv = spec["op_type"] == "Conv"
        if conv:
            height, width, channels = spec["input_shape"]
            shape = (channels, height, width)
        else:  # the node's own input per sample: (terms,) or (..., tokens, terms)
            shape = tuple(spec["input_shape"])
        ones = np.ones((batch, *shape), dtype=np.float32)
        operand = spec.get("operand_shape")  # a MatMul of two activations
        alone = node_model(path, spec["node"], shape, operand)
        node = alone.graph.node[0]
        transposed = spec["op_type"] == "Gemm" and any(
            attribute.name == "transB" and attribute.i for attribute in node.attribute)
        constants = [name for name in node.input[1:] if name]

        def call(kernel, bias):
            if operand is not None:  # the probe's (K, N) as every position's operand
                kernel = np.asarray(kernel, np.float32).reshape(spec["terms"], spec["units"])
                return run_probe_model(runtime, alone, device, accelerator, spec, {
                    "x": ones, "w": np.ascontiguousarray(np.broadcast_to(
                        kernel, (batch, *operand)))})
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
