"""Samples whose lines coincide: drawn once and named together, so that a figure of three
identical samples shows one line that says so, not three lines of which one is visible."""

from __future__ import annotations

import pandas as pd


def identical_samples(part: pd.DataFrame, columns: list[str]) -> list[list]:
    """The samples of ``part`` (rows of sample, position and ``columns``) in groups whose
    ``columns`` are equal at every position (NaN equal to NaN), in the order the samples
    first appear."""
    groups: dict[tuple, list] = {}
    for sample, rows in part.groupby("sample", sort=False):
        rows = rows.sort_values("position")
        key = tuple(rows["position"]) + tuple(
            tuple("nan" if pd.isna(value) else value for value in rows[column])
            for column in columns)
        groups.setdefault(key, []).append(sample)
    return list(groups.values())


def samples_label(group: list, of: int) -> str:
    """`sample #3`; `samples #0, #1 (identical)`; `all 3 samples (identical)` when the
    group holds every one of the ``of`` samples drawn."""
    if len(group) == 1:
        return f"sample #{group[0]}"
    if len(group) == of:
        return f"all {of} samples (identical)"
    return f"samples {', '.join(f'#{s}' for s in group)} (identical)"


# Overlapping lines stay visible: the first group's line is the widest, each later one
# narrower, so that a line drawn over another leaves its edges showing.
def line_width(k: int) -> float:
    return max(3.2 - 1.0 * k, 1.0)
