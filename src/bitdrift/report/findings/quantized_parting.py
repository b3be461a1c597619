"""The findings' section on where a quantized model's devices part (issue 65): per pair
that parts, the first layer, the cause named and the numpy integer replay's verdict, as a
table (from results/tables/quantized_parting.csv, bitdrift.analysis.quantized_parting)."""

from __future__ import annotations

import pandas as pd

HEADING = "Where quantized devices part"
# the table's columns as the section shows them
SHOWN = {"model": "model", "first_device": "device A", "second_device": "device B",
         "layer": "first parting layer", "op": "op", "cause": "cause",
         "first_replay": "device A's integers", "second_replay": "device B's integers"}


def quantized_parting(table: pd.DataFrame) -> list:
    """The section's items: a sentence counting the pairs that part, and the table of
    them; a sentence alone where none parts."""
    if table.empty:
        return ["No two devices of a quantized model part: every pair's final outputs are "
                "bit-identical."]
    shown = table[[column for column in SHOWN if column in table.columns]].rename(
        columns=SHOWN)
    if {"first_kernels", "second_kernels"} <= set(table.columns):
        # the traced kernels where the record holds them ("ort ms:MatMulIntegerToFloat")
        first, second = (table[column].astype(object).fillna("").astype(str)
                         for column in ("first_kernels", "second_kernels"))
        shown.insert(5, "kernels (A / B)", [f"{one} / {two}" if one or two else ""
                                            for one, two in zip(first, second, strict=True)])
    replays = [table[column].astype(object).fillna("").astype(str).str.contains("bit for bit")
               for column in ("first_replay", "second_replay") if column in table.columns]
    replayed = int((replays[0] & replays[1]).sum()) if len(replays) == 2 else 0
    return [f"{len(table)} pair(s) of a quantized model's devices part. Where the first "
            "parting layer is an integer matmul, its integers are replayed in numpy from "
            "the recorded codes and the model's weights (exact int32 against AVX2's "
            f"saturated 16-bit pairs): in {replayed} pair(s) each device's integers are one "
            "replay's bit for bit.", shown]
