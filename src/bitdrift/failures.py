"""A device that fails costs nothing else: its job writes a failure record instead of a
record (bitdrift.record.write_failure), every other device runs, and the tables, figures
and report are built from the devices that ran. The analysis leaves failure records out
and names them (``device_failures.csv``, findings, report); at the end of the run the
workflow names each failed device with its one-line reason, removes its failure record so
that the next run tries the device again, and exits non-zero.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bitdrift.record import read_failure, write_failure

TABLE_COLUMNS = ["model", "device", "backend", "reason", "log"]


def failure_recorder(out, model: str, device: str, backend: str, log_path):
    """The ``on_failure`` of a device's job (bitdrift.jobs.workflow_job): writes the
    failure record at the record's path with the one-line reason."""

    def record(reason: str) -> str:
        write_failure(out, {"model": model, "device": device, "backend": backend,
                            "log": str(log_path)}, reason)
        return (f"bitdrift: device {device!r} (model {model!r}) failed: {reason}; recorded "
                f"as a failure in {out}, the other devices go on")

    return record


def failure_rows(paths) -> list[dict]:
    """``device_failures.csv``: one row per failure record among ``paths``."""
    rows = []
    for path in paths:
        found = read_failure(path)
        if found is not None:
            rows.append({column: found[column] for column in TABLE_COLUMNS})
    return rows


def end_of_run(paths, stream=sys.stderr) -> list[dict]:
    """At the end of a run (the workflow's onsuccess/onerror): name every failed device
    with its reason and log, and remove its failure record so that the next run retries
    it (the reason stays in device_failures.csv, findings.md and the job's log)."""
    failed = [found for found in map(read_failure, paths) if found is not None]
    if failed:
        print(f"bitdrift: {len(failed)} device(s) failed; the tables, figures and report "
              "hold the others:", file=stream)
        for found in failed:
            print(f"  {found['device']} (model {found['model']}): {found['reason']} "
                  f"[log: {found['log']}]", file=stream)
            Path(found["path"]).unlink(missing_ok=True)
        print("bitdrift: the next run tries the failed devices again", file=stream)
    return failed
