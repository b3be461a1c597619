"""Progress of long steps (repeats, batches, layers, epochs, MaxPool draws) with tqdm.

At a terminal (a command run by hand) the bar is tqdm's own, redrawn in place. Written to
a file (a workflow job's log: scripts and their worker processes send stderr there) each
state is a line of its own, ``bitdrift: progress: <what> k/n [elapsed<remaining]``, at most
one per :data:`LOG_INTERVAL_SECONDS` per loop: the log stays readable, and the quiet view
(src/snakemake_logger_plugin_bitdrift) shows a running job's latest state,
:func:`latest_progress`, once it has run a while. Every process of a job writes to the same
log, so the latest state is whichever loop counted last (the parent's repeats, a worker's
batches or order search).
"""

from __future__ import annotations

import os
import sys

PREFIX = "bitdrift: progress: "  # a log's progress lines start with it
# tqdm's fields in a log's line: what is counted, done of total, elapsed<remaining
LOG_FORMAT = PREFIX + "{desc} {n_fmt}/{total_fmt} [{elapsed}<{remaining}]"
LOG_FORMAT_UNKNOWN_TOTAL = PREFIX + "{desc} {n_fmt} [{elapsed}]"
LOG_INTERVAL_SECONDS = 10.0  # a loop's progress lines in a log: at most one per this
INTERVAL = "BITDRIFT_PROGRESS_INTERVAL"  # seconds, to replace LOG_INTERVAL_SECONDS (tests)
TAIL_BYTES = 1 << 20  # how far back from a log's end latest_progress looks


def progress(iterable, description: str, *, total: int | None = None, file=None):
    """``iterable`` counted by tqdm as ``description`` (say what is done: "repeats done",
    "layers merged") on ``file`` (standard error by default): a bar at a terminal, a line
    per state in a file."""
    from tqdm import tqdm

    file = file or sys.stderr
    if _is_terminal(file):
        return tqdm(iterable, desc=description, total=total, file=file, mininterval=2.0,
                    ascii=True, dynamic_ncols=True)
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)
    return tqdm(iterable, desc=description, total=total, file=_LogLines(file),
                mininterval=float(os.environ.get(INTERVAL, LOG_INTERVAL_SECONDS)),
                miniters=1, bar_format=LOG_FORMAT if total is not None
                else LOG_FORMAT_UNKNOWN_TOTAL)


def _is_terminal(file) -> bool:
    try:
        return file.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class _LogLines:
    """A file for tqdm that writes each state it draws as a line of its own: tqdm redraws
    in place with a carriage return, which in a log runs every state into one line (and
    into the next line the job prints)."""

    def __init__(self, file):
        self.file = file
        self.last = None

    def write(self, text: str) -> None:
        for state in text.split("\r"):
            state = state.strip()  # tqdm pads a state over the previous one's length
            if state and state != self.last:  # closing, tqdm draws the last state again
                self.file.write(state + "\n")
                self.last = state

    def flush(self) -> None:
        self.file.flush()


def latest_progress(log_path) -> str | None:
    """The latest progress line in the log at ``log_path``, without :data:`PREFIX` (None:
    no such line in its last :data:`TAIL_BYTES`, or no log yet)."""
    try:
        with open(log_path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - TAIL_BYTES))
            tail = log.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        if line.startswith(PREFIX):
            return line[len(PREFIX):].strip()
    return None
