"""bitdrift's reference set: a model trained once and committed with its inputs.

A model trained in a run depends on the machine that trained it, so two machines' records
of it are not comparable. The reference set is fixed: ``cifar10_small.keras`` (the
default CNN, trained once by the default workflow; provenance in ``manifest.json``) and
``digits_test.h5`` (the test images it is run on, a bitdrift dataset file). No run
retrains or rewrites them; each file is checked against the manifest's digest when it is
asked for, and a changed file is refused naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

from bitdrift.errors import BitdriftError
from bitdrift.inputs.datasets import file_digest

FOLDER = Path(__file__).parent
MANIFEST = FOLDER / "manifest.json"


def manifest() -> dict:
    """The reference set's manifest (model and inputs, their digests and provenance)."""
    return json.loads(MANIFEST.read_text())


def _checked(part: str) -> Path:
    entry = manifest()[part]
    path = FOLDER / entry["file"]
    if not path.is_file():
        raise BitdriftError(f"{path}: the reference set's {part} file is missing; reinstall "
                            "bitdrift or restore it from the repository")
    found = file_digest(path)
    if found != entry["file_sha256"]:
        raise BitdriftError(f"{path}: sha256 {found[:12]}... is not the reference set's "
                            f"{entry['file_sha256'][:12]}... (manifest.json); the reference "
                            "set is fixed, restore the file from the repository")
    return path


def model_file() -> Path:
    """The reference model (a .keras file), checked against the manifest."""
    return _checked("model")


def inputs_file() -> Path:
    """The reference inputs (a bitdrift dataset file), checked against the manifest."""
    return _checked("inputs")


def samples() -> list[int]:
    """The test-set indices the reference model is recorded on."""
    return list(manifest()["inputs"]["samples"])
