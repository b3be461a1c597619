"""PyTorch ``torch.export`` programs (``torch.export.save``: a zip holding
``<name>/archive_format`` and ``<name>/models/*.json``). Recognised and checked here; no
runtime runs one yet (the torch runners join RUNTIMES when they land)."""

from __future__ import annotations

import zipfile

from bitdrift.errors import ModelFormatError
from bitdrift.formats import Input

NAME = "pt2"
WHAT = "a PyTorch torch.export .pt2 archive"
RUNTIMES = ()
open_session = None
file_layers = None  # no reading of its layers' weights yet


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
