"""The batching study's section of the findings (bitdrift.report.findings.StudySection):
a table of how many batch settings change each device's studied outputs, and whether
greedy decoding diverged."""

from __future__ import annotations

import pandas as pd

from bitdrift.report.findings import StudySection
from bitdrift.studies.batching.paths import BATCHING_TABLES


def batching_sentences(summary: pd.DataFrame) -> list:
    """The items of batching_summary.csv (`bitdrift batching-tables`): a table of the
    devices (how many batch settings change the studied outputs, the layers where the
    differences start), and whether greedy decoding diverged."""
    def origin(value) -> str:
        return "" if pd.isna(value) or value == "" else str(value)

    devices = pd.DataFrame([{
        "device": row["device"],
        "batch settings that change the studied outputs":
            f"{row['settings_differing']} of {row['settings']}",
        "differences start at": origin(row.get("origin_layers"))}
        for row in summary.to_dict("records")])
    tokens = summary["first_divergent_token"]
    diverged = tokens[pd.to_numeric(tokens, errors="coerce").notna()]
    return ["Batching: per device, the batch settings that change the studied outputs:",
            devices,
            "Batching: greedy decoding " + (
                f"diverged on {len(diverged)} device(s)." if len(diverged)
                else "gave the same tokens in every setting on every device.")]


# after the probes' section, where the two studies were written first
SECTION = StudySection("Batch invariance", (BATCHING_TABLES["summary"],), batching_sentences,
                       place=2)
