"""ONNX models (a protobuf ModelProto): the file recognised, checked by ONNX's checker, its
inputs read, and its nodes read as layers (:func:`file_layers`, :func:`value_shapes`).
Its runtimes (bitdrift.runtimes.FORMAT_RUNTIMES) run it as it is (ONNX Runtime and
OpenVINO: bitdrift.backends.exported.onnx_file) or converted (torch eager, LiteRT:
bitdrift.backends.torch_program)."""

from __future__ import annotations

import numpy as np

from bitdrift.errors import ModelFormatError
from bitdrift.formats import Input

NAME = "onnx"
WHAT = "an ONNX model"


def recognise(path, head: bytes) -> bool:
    """A ModelProto has no magic number: its first field is ir_version (field 1, varint,
    tag 0x08) in the files onnx writes; the full parse in check() decides."""
    return head[:1] == b"\x08"


def load_model(path):
    """The file's ModelProto; ModelFormatError in one line for a damaged file."""
    import onnx

    try:
        return onnx.load(str(path))
    except Exception as error:  # protobuf's DecodeError, onnx's own
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ModelFormatError(f"{path}: not an ONNX model, or a damaged one ({first})") \
            from error


def check(path) -> None:
    import onnx

    model = load_model(path)
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
    graph = load_model(path).graph
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


SUMMING_OPS = ("MatMul", "Gemm", "Conv")  # the nodes whose summation order matters


def file_layers(path) -> list[dict]:
    """The model's nodes as bitdrift.inputs.models.keras_file_layers gives a Keras model's (named
    as the record names them), for
    the analyses that recompute a layer from its weights (effective precision, repro):
    each graph input as an InputLayer, each MatMul or Gemm with constant weights as a
    Dense layer, each Conv as a channels-first Conv2D (named by its output), a MatMul of
    two activations as MatMul with both in ``inbound`` and no weights; every other node by
    its op type, with no weights, so those analyses leave it out."""
    from onnx import numpy_helper

    graph = load_model(path).graph
    constants = {tensor.name: numpy_helper.to_array(tensor) for tensor in graph.initializer}
    for node in graph.node:  # Constant nodes hold weights too, and scalars (a scale)
        value = next((attribute.t for attribute in node.attribute
                      if attribute.name == "value"), None) if node.op_type == "Constant" \
            else None
        if value is not None:
            constants[node.output[0]] = numpy_helper.to_array(value)
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
        elif node.op_type == "MatMul" and len(inbound) == 2 and len(node.input) == 2:
            # a product of two activations (attention's Q @ K^T, softmax @ V): no weights;
            # the analyses read its second operand, ``inbound[1]``, from the record
            entry.update(op_type="MatMul", config={"activation": "linear", "use_bias": False})
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


def value_shapes(path) -> dict:
    """{value name: its shape as ONNX's shape inference with data propagation gives it
    (None where a dimension is free)}, of every graph input and node output it can type
    (a session's instrumented copy, bitdrift.backends.exported.onnx_file.instrumented, has
    run it on the same file)."""
    import onnx

    model = load_model(path)
    try:
        # data propagation follows the shape a Reshape is given through Shape, Gather and
        # Concat nodes (torch.onnx.export's attention heads): without it those are unknown
        graph = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    except Exception:  # noqa: BLE001 - a model it cannot take: the plain inference's shapes
        graph = onnx.shape_inference.infer_shapes(model).graph
    return {value.name: [dim.dim_value if dim.HasField("dim_value") else None
                         for dim in value.type.tensor_type.shape.dim]
            for value in [*graph.input, *graph.value_info, *graph.output]
            if value.type.HasField("tensor_type")}


