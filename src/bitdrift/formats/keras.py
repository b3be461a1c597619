"""Keras models: a ``.keras`` archive (a zip holding config.json) or a legacy ``.h5``
(HDF5 with a model_config attribute). Keras' own runtimes open them (bitdrift.backends.keras:
tensorflow, torch, jax), and the exported runtimes run bitdrift.backends.keras.export's
conversions."""

from __future__ import annotations

import json
import zipfile

from bitdrift.errors import ModelFormatError
from bitdrift.formats import Input

NAME = "keras"
WHAT = "a Keras .keras archive or .h5 file"
HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
# A Keras model reads a dataset each runtime casts to the device's precision: its session
# opens without the signature checks a model of another format has first
# (bitdrift.backends.open_session)
INPUTS_CHECKED_BEFORE_SESSION = False


def recognise(path, head: bytes) -> bool:
    if head.startswith(HDF5_MAGIC):
        return True
    if head.startswith(b"PK") and zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                return "config.json" in archive.namelist()
        except zipfile.BadZipFile:
            return False
    return False


def check(path) -> None:
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                config = json.loads(archive.read("config.json"))
                if "model.weights.h5" not in archive.namelist():
                    raise ModelFormatError(f"{path}: a damaged Keras .keras archive (no "
                                           "model.weights.h5)")
                bad = archive.testzip()
        except ModelFormatError:
            raise
        except (zipfile.BadZipFile, ValueError, OSError) as error:
            raise ModelFormatError(f"{path}: a damaged Keras .keras archive ({error})") \
                from error
        if bad is not None:
            raise ModelFormatError(f"{path}: a damaged Keras .keras archive ({bad} fails "
                                   "its checksum)")
        refuse_code(path, config)
        return
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            found = handle.attrs.get("model_config")
    except OSError as error:
        raise ModelFormatError(f"{path}: a damaged HDF5 file ({error})") from error
    if found is None:
        raise ModelFormatError(f"{path}: an HDF5 file but not a Keras .h5 model (no "
                               "model_config attribute)")
    try:
        config = json.loads(found.decode() if isinstance(found, bytes) else found)
    except (ValueError, TypeError) as error:
        raise ModelFormatError(f"{path}: a damaged Keras .h5 model (model_config is no "
                               f"JSON: {error})") from error
    refuse_code(path, config)


def refuse_code(path, config) -> None:
    """ModelFormatError naming ``path`` and the layer for a model config holding Python
    bytecode (a Lambda layer's function, ``__lambda__`` in a .keras, ``function_type:
    lambda`` in a legacy .h5): loading would run it. Keras' safe mode (on: bitdrift never
    turns it off) refuses it too, but only when a job loads the model, in many lines."""
    stack = [(config, "?")]
    while stack:
        value, layer = stack.pop()
        if isinstance(value, list):
            stack.extend((item, layer) for item in value)
        elif isinstance(value, dict):
            inner = value.get("config")
            if isinstance(inner, dict) and isinstance(inner.get("name"), str) and \
                    "class_name" in value:
                layer = inner["name"]
            if value.get("class_name") == "__lambda__" or \
                    value.get("function_type") == "lambda":
                raise ModelFormatError(
                    f"{path}: refused: layer {layer!r} holds Python bytecode (a Lambda "
                    "layer's function), which loading would run; bitdrift reads a model file "
                    "without running code it holds")
            stack.extend((item, layer) for item in value.values())


def signature(path) -> list[Input]:
    """The input a ``.keras`` file declares (float32: Keras casts to the device's
    precision); none read from a legacy .h5."""
    from bitdrift.inputs.models import model_input_shape

    shape = model_input_shape(path)
    return [] if shape is None else [Input("input", (None, *shape), "float32")]


def file_layers(path) -> list[dict]:
    from bitdrift.inputs.models import keras_file_layers

    return keras_file_layers(path)
