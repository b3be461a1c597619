"""Where the batching study puts its files (on top of bitdrift.paths)."""

from __future__ import annotations

from bitdrift.paths import RESULTS


def batching_run_file(model="{model}", device="{device}") -> str:
    """One device's batch-invariance run (JSON)."""
    return f"{RESULTS}/batching/{model}/{device}.json"


BATCHING_TABLES = {"layers": "batching_layers", "decoding": "batching_decoding",
                   "summary": "batching_summary"}
