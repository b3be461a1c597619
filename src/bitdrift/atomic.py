"""Atomic outputs: an interrupted job never leaves a half file that looks complete."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_output(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only on success.

    The temporary name keeps the suffix (Keras and h5py look at it) and lives in the same
    directory so that ``os.replace`` is an atomic rename on the same filesystem.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(
        prefix=f".{path.stem}.", suffix=f".partial{path.suffix}", dir=path.parent
    )
    os.close(handle)
    tmp = Path(tmp_name)
    tmp.unlink()  # writers create the file themselves (h5py, keras refuse some existing files)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_csv(table, path: str | Path) -> None:
    """A pandas table as CSV (no index), written atomically."""
    with atomic_output(path) as tmp:
        table.to_csv(tmp, index=False)
