"""A device that fails costs nothing else: its job writes a failure record instead of a
record (bitdrift.record.writer.write_failure), every other device runs, and the tables, figures
and report are built from the devices that ran. The analysis leaves failure records out
and names them (``device_failures.csv``, findings, report); at the end of the run the
workflow names each failed device with its one-line reason, removes its failure record so
that the next run tries the device again, and exits non-zero.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bitdrift.errors import BitdriftError
from bitdrift.record.reader import read_failure
from bitdrift.record.writer import write_failure

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


def end_of_run(paths, stream=sys.stderr, findings=None, stale=(),
               analysed=None) -> list[dict]:
    """At the end of a run (the workflow's onsuccess/onerror): name every failed device
    with its reason and log, and remove its failure record so that the next run retries
    it (the reason stays in device_failures.csv, findings.md and the job's log).

    When no device of ``analysed`` (the records the findings are written from; default
    ``paths``) ran because each one failed, no analysis could run, and an earlier run's
    answer must not stay in place: ``findings`` (findings.md) is written anew to say so,
    and the ``stale`` files (the report, findings.rst) are removed."""
    failed = [found for found in map(read_failure, paths) if found is not None]
    analysed = paths if analysed is None else analysed
    # Each file is opened once: an analysed path among ``paths`` was read above
    failed_paths, scanned = {found["path"] for found in failed}, set(map(str, paths))
    ran = [path for path in analysed if Path(path).exists() and str(path) not in failed_paths
           and (str(path) in scanned or read_failure(path) is None)]
    analysed_failed = [found for found in failed if found["path"] in set(map(str, analysed))]
    none_ran = not ran and bool(analysed_failed)
    if failed:
        print(f"bitdrift: {len(failed)} device(s) failed; " + (
            "no device ran, so the analyses had nothing to read:" if none_ran
            else "the tables, figures and report hold the others:"), file=stream)
        for found in failed:
            print(f"  {found['device']} (model {found['model']}): {found['reason']} "
                  f"[log: {found['log']}]", file=stream)
        # First, so that whatever fails below, the next run retries the failed devices
        for found in failed:
            Path(found["path"]).unlink(missing_ok=True)
        print("bitdrift: the next run tries the failed devices again", file=stream)
        if findings is not None and none_ran:
            try:
                write_no_device_findings(analysed_failed, len(analysed), findings)
                removed = [str(path) for path in stale if Path(path).exists()]
                for path in removed:
                    Path(path).unlink()
            except (BitdriftError, OSError) as error:
                print(f"bitdrift: no device ran, and {findings} could not be rewritten to say "
                      f"so: {error}", file=stream)
            else:
                print("bitdrift: no device ran, so this run has no classes, tables or figures: "
                      f"{findings} says so" + (f"; removed the earlier run's "
                                               f"{', '.join(removed)}" if removed else ""),
                      file=stream)
    return failed


def write_no_device_findings(failed: list[dict], scheduled: int, out) -> None:
    """findings.md of a run in which no device ran (``failed`` of the ``scheduled`` ones
    failed, the others never started): that fact and each reason, in place of an earlier
    run's findings, which a reader would take for this run's."""
    from bitdrift.atomic import atomic_output

    never = scheduled - len(failed)
    lines = ["# Findings on this machine", "",
             f"No device ran: {len(failed)} of the {scheduled} scheduled devices failed"
             + (f" and {never} never started" if never else "") + ", so this run has no "
             "equivalence classes, tables or figures, and no report. Mend the reasons below "
             "and run again.", "", "## Devices that failed", ""]
    lines += [f"- {found['device']} ({found['model']}): {found['reason']} "
              f"(log: {found['log']})" for found in failed]
    with atomic_output(out) as tmp:
        Path(tmp).write_text("\n".join(lines) + "\n")
