"""Progress of long steps (repeats, epochs, MaxPool draws) with tqdm: to the job's log in
the workflow (scripts send stderr there) and to the terminal when run as a command."""

from __future__ import annotations

import sys


def progress(iterable, description: str, *, total: int | None = None, file=None):
    """``iterable`` wrapped in a tqdm bar written to ``file`` (standard error by default)."""
    from tqdm import tqdm

    return tqdm(iterable, desc=description, total=total, file=file or sys.stderr,
                mininterval=2.0, ascii=True, dynamic_ncols=True)
