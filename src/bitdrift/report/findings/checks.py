"""The run's checks on itself: whether instrumenting changed the deployed model's final
output (the observer check), and the devices that failed."""

from __future__ import annotations

import pandas as pd


def observer(table: pd.DataFrame) -> list[str]:
    """The observer check (bitdrift.analysis.observer): devices whose instrumentation changed the
    final output."""
    checked = table[table["observer_equal"].astype(str) != "unchecked"]
    changed = checked[checked["observer_equal"].astype(str) == "no"]
    lines = [f"The deployed model (final output only) gives the instrumented run's final "
             f"output bit for bit on {len(checked) - len(changed)} of {len(checked)} checked "
             "devices."]
    for row in changed.to_dict("records"):
        lines.append(f"{row['device']} ({row['model']}): the deployed model "
                     f"({row['deployed_program']}) differs from the instrumented run on "
                     f"{int(row['samples']) - int(row['equal_samples'])} of "
                     f"{int(row['samples'])} samples: its final-output classes are the "
                     "deployed outputs', its per-layer analyses describe the instrumented "
                     "program.")
    return lines


def failures(table: pd.DataFrame) -> list[str]:
    if table.empty:
        return ["None: every scheduled device ran."]
    return [f"{row['device']} ({row['model']}): {row['reason']} (log: {row['log']})"
            for row in table.to_dict("records")]
