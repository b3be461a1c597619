"""The batching study's section of the findings (bitdrift.report.findings.StudySection):
per device, how many batch settings change the studied outputs, and whether greedy
decoding diverged."""

from __future__ import annotations

import pandas as pd

from bitdrift.report.findings import StudySection
from bitdrift.studies.batching.paths import BATCHING_TABLES


def batching_sentences(summary: pd.DataFrame) -> list[str]:
    """The sentences of batching_summary.csv (`bitdrift batching-tables`)."""
    lines = []
    for row in summary.to_dict("records"):
        origin = row.get("origin_layers")
        origin = "" if pd.isna(origin) or origin == "" else f"; differences start at {origin}"
        lines.append(f"Batching, {row['device']}: {row['settings_differing']} of "
                     f"{row['settings']} batch settings change the studied outputs{origin}.")
    tokens = summary["first_divergent_token"]
    diverged = tokens[pd.to_numeric(tokens, errors="coerce").notna()]
    lines.append("Batching: greedy decoding " + (
        f"diverged on {len(diverged)} device(s)." if len(diverged)
        else "gave the same tokens in every setting on every device."))
    return lines


# after the probes' section, where the two studies were written first
SECTION = StudySection("Batch invariance", (BATCHING_TABLES["summary"],), batching_sentences,
                       place=2)
