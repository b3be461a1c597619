"""A workflow job's frame: its log, and one line for an error, as on the command line.

Workflow scripts call the library directly, so without this a :class:`BitdriftError` in a
job showed as a traceback in its log and Snakemake said only that the script failed. In a
job, stderr goes to the job's log at the file-descriptor level too, so the C-level log
lines of the frameworks (TensorFlow's C++ logging, oneDNN) land in the log rather than on
the terminal; a bitdrift error ends the job with its one line in the log and on the
terminal Snakemake shows, and the error's exit status.

A job that ends well writes how long its own work took (``bitdrift: job work ... s``):
from the end of its framework's import (:func:`framework_imported`, called where Keras or
torch is loaded), or from the script's call when it loads none, to the end, less the time
it waited on worker processes (:func:`waiting_on_workers`; they log their own work). What
the job's wall time has beyond the work is start-up: the interpreter, Snakemake's script
preamble, framework imports, starting workers (benchmarks/first_run.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

from bitdrift.errors import BitdriftError

JOB_WORK_LINE = "bitdrift: job work {seconds:.3f} s"  # benchmarks/first_run.py reads it
_framework_ready: list[tuple[float, float]] = []  # when the first framework import ended,
# and the seconds waited on workers by then
_waited = [0.0]  # seconds this process has waited on its workers


@contextlib.contextmanager
def waiting_on_workers():
    """Around a wait for a worker process's job: not this process's work."""
    started = time.perf_counter()
    try:
        yield
    finally:
        _waited[0] += time.perf_counter() - started


def framework_imported() -> None:
    """Mark the end of the process's framework import (the first one counts: a job's later
    imports, an exporter's runtime say, are its work)."""
    if not _framework_ready:
        _framework_ready.append((time.perf_counter(), _waited[0]))


@contextlib.contextmanager
def workflow_job(log_path, on_failure=None):
    """``with workflow_job(snakemake.log[0]):`` around a script's one call.

    ``on_failure(reason) -> line``: a device's job (bitdrift.record.failures) that fails for any
    reason but an interruption records the failure and ends successfully, so that the
    other devices' analysis goes on; the line goes to the log and the terminal."""
    terminal = os.fdopen(os.dup(2), "w", buffering=1)
    log = open(log_path, "w", buffering=1)
    os.dup2(log.fileno(), 2)
    sys.stderr = log
    called, waited = time.perf_counter(), _waited[0]
    try:
        yield log
        _log_work(log, called, waited)
    except Exception as error:  # noqa: BLE001 - a device's failure is recorded, never lost
        if on_failure is None and not isinstance(error, BitdriftError):
            raise
        reason = " ".join(str(error).split()) or type(error).__name__
        if not isinstance(error, BitdriftError):
            import traceback

            traceback.print_exc(file=log)
            reason = f"{type(error).__name__}: {reason}"
        if on_failure is None:
            message = f"bitdrift: error: {reason}"
            print(message, file=log)
            print(message, file=terminal)
            raise SystemExit(error.exit_code) from None
        line = on_failure(reason)
        _log_work(log, called, waited)  # the failure record is the job's result
        print(line, file=log)
        print(line, file=terminal)
    except SystemExit as done:
        # A command-line call (cli.main) returned its status and wrote its one line to
        # the log: the terminal gets that line too.
        if done.code in (0, None):
            _log_work(log, called, waited)
        else:
            log.flush()
            with open(log_path, errors="replace") as written:
                lines = [line.rstrip("\n") for line in written
                         if line.startswith("bitdrift: error:")]
            print(lines[-1] if lines else f"bitdrift: error: the job failed (exit "
                  f"{done.code}); see {log_path}", file=terminal)
        raise
    finally:
        terminal.flush()


def _log_work(log, called: float, waited: float) -> None:
    """The job's own work: from its call, or from its framework's import if that came
    later, to now, less what it waited on workers in that time."""
    started = (called, waited)
    if _framework_ready and _framework_ready[0][0] > called:
        started = _framework_ready[0]
    work = time.perf_counter() - started[0] - (_waited[0] - started[1])
    print(JOB_WORK_LINE.format(seconds=max(work, 0.0)), file=log)
