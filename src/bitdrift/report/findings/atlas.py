"""This machine among the machines measured: the reference model's devices here against
the atlas's entries (atlas.csv), and the entries left out."""

from __future__ import annotations

import pandas as pd

ATLAS_HEADING = "This machine among the machines measured"


def atlas(table: pd.DataFrame, refused: pd.DataFrame) -> list[str]:
    """The reference model's devices on this machine against the atlas's machines
    (atlas.csv, bitdrift.atlas.entries): per device, the machines of the same bits and
    where the others part; the entries that could not be read, one line each."""
    from bitdrift.atlas.entries import THIS_MACHINE, rows_from_table, summary_lines

    lines = []
    if not table.empty:
        others = table[table["machine"] != THIS_MACHINE]
        names = dict(zip(others["machine"], others["name"], strict=False))
        lines.append(f"The atlas holds {len(names)} machine(s): "
                     + (", ".join(f"{name} [{entry}]" for entry, name in names.items())
                        or "none yet")
                     + "; the reference model ran here on "
                     + ", ".join(table.loc[table["machine"] == THIS_MACHINE, "device"])
                     + " (figure atlas.png: machines x devices, colour = class across "
                     "machines).")
        lines += summary_lines(rows_from_table(table))
    elif refused.empty:
        lines.append("No device ran the reference model.")
    lines += [f"Entry {row.entry} left out: {row.reason}" for row in refused.itertuples()]
    return lines
