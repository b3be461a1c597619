"""The run's checks on itself: whether instrumenting changed the deployed model's final
output (the observer check), the devices that failed, and the devices the plan left out
of a model (their runtime cannot run its format) or a model left with one device."""

from __future__ import annotations

import pandas as pd

from bitdrift.report.findings.text import cut


def observer(table: pd.DataFrame) -> list:
    """The observer check (bitdrift.analysis.observer): devices whose instrumentation changed the
    final output, and what the instrumented runs exposed (the check holds for that)."""
    checked = table[table["observer_equal"].astype(str) != "unchecked"]
    changed = checked[checked["observer_equal"].astype(str) == "no"]
    exposed = checked["instrumented"].fillna("").astype(str) \
        if "instrumented" in checked else pd.Series("", index=checked.index)
    kinds = [kind for kind in dict.fromkeys(exposed) if kind]
    first = (f"The deployed model (final output only) gives the instrumented run's final "
             f"output bit for bit on {len(checked) - len(changed)} of {len(checked)} checked "
             "devices")
    if len(kinds) == 1 and (exposed == kinds[0]).all():
        first += f", each instrumented run exposing {kinds[0]}"
    lines: list = [first + "."]
    if kinds and not (len(kinds) == 1 and (exposed == kinds[0]).all()):
        # per instrumentation, a line each: the equal ones of those exposing it
        equal = checked["observer_equal"].astype(str) != "no"
        lines += [f"Of those whose instrumented run exposed {kind}: "
                  f"{int((equal & (exposed == kind)).sum())} of {int((exposed == kind).sum())}."
                  for kind in kinds]
    if len(changed):  # a row per device: the same sentence for each read as a table
        lines.append("Where the deployed model differs from the instrumented run (the table), "
                     "a device's final-output classes are the deployed outputs', its per-layer "
                     "analyses describe the instrumented program.")
        differing = pd.DataFrame([{
            "device": row["device"], "model": row["model"],
            "deployed model": row["deployed_program"],
            "samples differing": f"{int(row['samples']) - int(row['equal_samples'])} of "
                                 f"{int(row['samples'])}",
            "instrumented run exposed": "" if str(row.get("instrumented") or "") == "nan"
            else str(row.get("instrumented") or "")} for row in changed.to_dict("records")])
        # a table from before the column, or runtimes that say nothing of it: left out
        lines.append(differing if (differing["instrumented run exposed"] != "").any()
                     else differing.drop(columns="instrumented run exposed"))
    return lines


# The characters of a failure's reason the findings keep: its log and
# device_failures.csv hold it whole (a runtime's error can run to thousands)
REASON = 200


def failures(table: pd.DataFrame) -> list[str]:
    if table.empty:
        return ["None: every scheduled device ran."]
    return [f"{row['device']} ({row['model']}): {cut(str(row['reason']), REASON)} "
            f"(log: {row['log']})" for row in table.to_dict("records")]


def skipped_devices(model: str, what: str, skipped: dict[str, list[str]]) -> str:
    """The devices of a model's run left out because their runtime cannot run its format
    (``what``: bitdrift.formats' WHAT), ``skipped`` by runtime: a clause, as the terminal
    says it at the start of the run and the findings (capitalized) in the Machine section."""
    devices = [device for members in skipped.values() for device in members]
    return (f"skipped for model {model}: {', '.join(skipped)} cannot run {what} "
            f"(device{'s' if len(devices) > 1 else ''} {', '.join(devices)})")


def lone_device(model: str, devices: list[str]) -> str:
    """A model that one device runs: its classes compare nothing (the clause, as
    :func:`skipped_devices`)."""
    return f"only one device runs model {model} ({', '.join(devices)}): nothing to compare"


def planned_devices(planned: dict) -> tuple[list[str], list[str]]:
    """The plan's notes on the devices of each model (bitdrift.plan.Plan.device_plan: only
    models with a skipped device or fewer than two), as sentences: those of skipped devices
    (the Machine section) and those of a model with one device (the classes' section)."""
    skipped, lone = [], []
    for model, entry in planned.items():
        if entry["skipped"]:
            skipped.append(_sentence(skipped_devices(model, entry["format"], entry["skipped"])))
        if len(entry["devices"]) == 1:
            lone.append(_sentence(lone_device(model, entry["devices"])))
    return skipped, lone


def _sentence(clause: str) -> str:
    return clause[0].upper() + clause[1:] + "."
