"""LiteRT flatbuffers (``.tflite``: the file identifier ``TFL3`` at bytes 4..8).
Recognised and checked here; LiteRT runs bitdrift.export's conversions of a Keras model
(bitdrift.backends.litert), not yet a user's own file."""

from __future__ import annotations

import numpy as np

from bitdrift.errors import ModelFormatError
from bitdrift.formats import Input

NAME = "tflite"
WHAT = "a LiteRT .tflite flatbuffer"
RUNTIMES = ()
open_session = None
file_layers = None  # no reading of its layers' weights yet


def recognise(path, head: bytes) -> bool:
    return head[4:8] == b"TFL3"


def _interpreter(path):
    from ai_edge_litert import interpreter

    try:
        return interpreter.Interpreter(model_path=str(path))
    except (ValueError, RuntimeError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ModelFormatError(f"{path}: a damaged LiteRT .tflite file ({first})") from error


def check(path) -> None:
    _interpreter(path)


def signature(path) -> list[Input]:
    return [Input(detail["name"],
                  tuple(None if dim < 0 else int(dim) for dim in detail["shape_signature"]),
                  np.dtype(detail["dtype"]).name)
            for detail in _interpreter(path).get_input_details()]
