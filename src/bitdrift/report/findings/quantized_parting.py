"""The findings' section on where a quantized model's devices part (issue 65): the pairs
that part, grouped by model, first parting layer and cause, with what the numpy integer
replay found of each device's integers there, as a table (from
results/tables/quantized_parting.csv, bitdrift.analysis.quantized_parting, which keeps
every pair, its details and kernels)."""

from __future__ import annotations

import pandas as pd

from bitdrift.report.findings.text import cut

HEADING = "Where quantized devices part"
# A cell's most characters (the replay's, which is the answer, more), and the pairs named
# in a group before the rest are counted
CELL_MOST, REPLAY_MOST, PAIRS_NAMED = 80, 160, 2


def _verdict(text: str) -> str:
    """A replay's verdict in a few words: 'exact int32', 'saturated 16-bit (226 pairs
    overflow)', 'neither replay'; '' where nothing was replayed."""
    text = str(text or "")
    if "bit for bit" in text and "exact int32 replay" in text:
        return "exact int32"
    if "bit for bit" in text and "saturated-16-bit replay" in text:
        overflow = text.rsplit(", ", 1)[-1] if "overflow" in text else ""
        return f"saturated 16-bit ({overflow})" if overflow else "saturated 16-bit"
    if "matches neither" in text:
        return "neither replay"
    return ""


def _grouped(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, first parting layer, cause): its pairs (a few named, the rest
    counted) and each device's integers as the replay found them."""
    table = table.astype(object).where(table.notna(), "")
    rows = []
    for (model, layer, cause), group in table.groupby(["model", "layer", "cause"],
                                                      sort=False):
        pairs = [f"{one} / {two}" for one, two in
                 zip(group["first_device"], group["second_device"], strict=True)]
        named = ", ".join(pairs[:PAIRS_NAMED]) + (
            f" and {len(pairs) - PAIRS_NAMED} more" if len(pairs) > PAIRS_NAMED else "")
        verdicts: dict[str, str] = {}
        for column, device in (("first_replay", "first_device"),
                               ("second_replay", "second_device")):
            for found, name in zip(group.get(column, []), group[device], strict=True):
                if _verdict(found):
                    verdicts.setdefault(name, _verdict(found))
        by_verdict: dict[str, list[str]] = {}
        for device, verdict in verdicts.items():
            by_verdict.setdefault(verdict, []).append(device)
        rows.append({"model": model, "first parting layer": cut(str(layer), 48),
                     "cause": cut(str(cause), CELL_MOST),
                     "pairs": cut(f"{len(pairs)}: {named}", CELL_MOST),
                     "integers, by the numpy replay": cut("; ".join(
                         f"{verdict}: {', '.join(devices)}"
                         for verdict, devices in by_verdict.items()), REPLAY_MOST)})
    return pd.DataFrame(rows)


def quantized_parting(table: pd.DataFrame) -> list:
    """The section's items: a sentence counting the pairs that part and those whose
    integers a replay gives bit for bit, and the grouped table; a sentence alone where
    none parts."""
    if table.empty:
        return ["No two devices of a quantized model part: every pair's final outputs are "
                "bit-identical."]
    replays = [table[column].astype(object).fillna("").astype(str).str.contains("bit for bit")
               for column in ("first_replay", "second_replay") if column in table.columns]
    replayed = int((replays[0] & replays[1]).sum()) if len(replays) == 2 else 0
    return [f"{len(table)} pair(s) of a quantized model's devices part. Where the first "
            "parting layer is an integer matmul, its integers are replayed in numpy from "
            "the recorded codes and the model's weights (exact int32 against AVX2's "
            f"saturated 16-bit pairs): in {replayed} pair(s) each device's integers are one "
            "replay's bit for bit. Each pair, its details and kernels: quantized_parting.csv.",
            _grouped(table)]
