"""This machine among the machines measured: the reference model's devices here against
the atlas's entries (atlas.csv), and the entries left out."""

from __future__ import annotations

import pandas as pd

ATLAS_HEADING = "This machine among the machines measured"
# Device columns per table: a row of four cells ("parts at `conv2d`, 15 bits left"), the
# machine's label and the versions that differ stays within about 300 characters
DEVICES_PER_TABLE = 4
NAMED_CHARS = 140  # the machines that agree are named within this many characters, else counted


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def atlas(table: pd.DataFrame, refused: pd.DataFrame) -> list[str | pd.DataFrame]:
    """The reference model's devices on this machine against the atlas's machines
    (atlas.csv, bitdrift.atlas.entries): how many machines, how many give this machine's
    bits on every device; then the machines x devices table (a DataFrame per four devices,
    the versions that differ in the first), cells "same bits" or "parts at `conv2d`, 15
    bits left"; the entries that could not be read, one line each."""
    from bitdrift.atlas.entries import (
        DIFFERS_COLUMN,
        MACHINE_COLUMN,
        agreeing,
        machines_by_devices,
        rows_from_table,
    )
    from bitdrift.atlas.machines import EMULATED

    items: list[str | pd.DataFrame] = []
    if not table.empty:
        rows = rows_from_table(table)
        grid = machines_by_devices(rows)
        devices = [column for column in grid.columns
                   if column not in (MACHINE_COLUMN, DIFFERS_COLUMN)]
        emulated = int(grid[MACHINE_COLUMN].str.startswith(EMULATED).sum())
        same = agreeing(rows)
        named = "; ".join(same)
        items.append(
            f"{_count(len(grid), 'machine')} of the atlas ran this machine's atlas devices "
            f"({len(grid) - emulated} real, {emulated} emulated by QEMU); {len(same)} "
            f"{'gives' if len(same) == 1 else 'give'} this machine's bits on every device "
            "both ran" + (f": {named}." if same and len(named) <= NAMED_CHARS else "."))
        if len(grid):
            items.append("A cell: \"same bits\" on every layer and sample, or the first "
                         "layer whose bits differ and the mantissa bits the final outputs "
                         "still share; the last column names the versions that can change "
                         "arithmetic (runtime, driver, C library) and differ from this "
                         "machine's (figure atlas.png).")
            for start in range(0, len(devices), DEVICES_PER_TABLE):
                chunk = devices[start:start + DEVICES_PER_TABLE]
                items.append(grid[[MACHINE_COLUMN, *chunk,
                                   *([DIFFERS_COLUMN] if start == 0 else [])]])
    elif refused.empty:
        items.append("No device ran the reference model.")
    items += [f"Entry {row.entry} left out: {row.reason}" for row in refused.itertuples()]
    return items
