"""LiteRT flatbuffers (``.tflite``: the file identifier ``TFL3`` at bytes 4..8): the file
recognised, read by LiteRT's interpreter, its inputs and its tensors read
(:func:`file_tensors`: what a session records, by the file's own tensor names). LiteRT
runs it as it is (bitdrift.backends.exported.tflite_file)."""

from __future__ import annotations

import numpy as np

from bitdrift.errors import ModelFormatError
from bitdrift.formats import Input

NAME = "tflite"
WHAT = "a LiteRT .tflite flatbuffer"
file_layers = None  # no reading of its layers' weights yet


def recognise(path, head: bytes) -> bool:
    return head[4:8] == b"TFL3"


def load_interpreter(path):
    """LiteRT's interpreter on the file; ModelFormatError in one line for a damaged one."""
    from ai_edge_litert import interpreter

    try:
        return interpreter.Interpreter(model_path=str(path))
    except (ValueError, RuntimeError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ModelFormatError(f"{path}: a damaged LiteRT .tflite file ({first})") from error


def check(path) -> None:
    load_interpreter(path)


def signature(path) -> list[Input]:
    return [Input(detail["name"],
                  tuple(None if dim < 0 else int(dim) for dim in detail["shape_signature"]),
                  np.dtype(detail["dtype"]).name)
            for detail in load_interpreter(path).get_input_details()]


# The nodes that sum (their summation order matters) and that are not probed yet
SUMMING_OPS = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL")


def file_tensors(path) -> list[tuple[int, str, str]]:
    """[(tensor index, name, op name)]: every floating-point tensor a node of the main
    graph outputs, in execution order, then the graph's outputs in their order (whatever
    their dtype). A node computed from constants alone (a float16 file's DEQUANTIZE of
    its weights) outputs no activation, and is left out. An empty or repeated tensor name
    takes ``@<index>``, so no two share one."""
    loaded = load_interpreter(path)
    details = {int(detail["index"]): detail for detail in loaded.get_tensor_details()}
    finals = [int(detail["index"]) for detail in loaded.get_output_details()]
    ops = sorted(loaded._get_ops_details(), key=lambda op: int(op["index"]))
    producer = {int(tensor): op["op_name"] for op in ops for tensor in op["outputs"]}
    # the tensors that depend on the graph's inputs, in execution order
    live = {int(detail["index"]) for detail in loaded.get_input_details()}
    for op in ops:
        if any(int(tensor) in live for tensor in op["inputs"]):
            live.update(int(tensor) for tensor in op["outputs"])
    found = [int(tensor) for op in ops for tensor in op["outputs"]
             if int(tensor) >= 0 and int(tensor) not in finals and int(tensor) in live
             and np.issubdtype(np.dtype(details[int(tensor)]["dtype"]), np.floating)]
    tensors, seen = [], set()
    for index in [*found, *finals]:
        name = details[index]["name"]
        name = f"{name}@{index}" if not name or name in seen else name
        seen.add(name)
        tensors.append((index, name, producer.get(index, "INPUT")))
    return tensors
