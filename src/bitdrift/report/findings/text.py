"""The sentences' shared ways of saying a list: in full up to LISTED items, else the first
SHOWN and how many more; devices joined with "and"; the samples a sentence is about."""

from __future__ import annotations

import pandas as pd

# A list in a sentence is written in full up to LISTED items; a longer one shows its
# first SHOWN and says how many more (the tables hold them all): a run of 100 samples,
# 177 layers and 30 devices otherwise writes lines of thousands of names.
LISTED = 10
SHOWN = 5


def first_listed(items, listed: int = LISTED, shown: int = SHOWN) -> str:
    """``a, b, c`` up to ``listed`` items, else the first ``shown`` and ``… and N more``."""
    items = [str(item) for item in items]
    if len(items) <= listed:
        return ", ".join(items)
    return ", ".join(items[:shown]) + f" … and {len(items) - shown} more"


def first_within(items, width: int = 120) -> str:
    """``a, b, c … and N more``: as many items as fit in ``width`` characters (one at
    least), the rest counted; for names of any length (an ONNX model's layers run to 50
    characters each)."""
    items = [str(item) for item in items]
    said: list[str] = []
    for item in items:
        if said and len(", ".join([*said, item])) > width:
            break
        said.append(item)
    left = len(items) - len(said)
    return ", ".join(said) + (f" … and {left} more" if left else "")


def largest_kept(sizes: list, listed: int = LISTED, shown: int = SHOWN) -> list[int]:
    """The indices of the items a list keeps, in their order: all up to ``listed``; more:
    the ``shown`` largest (``sizes``), the first of equal ones."""
    if len(sizes) <= listed:
        return list(range(len(sizes)))
    return sorted(sorted(range(len(sizes)), key=lambda index: sizes[index],
                         reverse=True)[:shown])


def and_list(devices) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    devices = list(devices)
    return devices[0] if len(devices) == 1 else ", ".join(devices[:-1]) + " and " + devices[-1]


def sample_names(samples) -> str:
    return first_listed(f"#{sample}" for sample in sorted(samples))


def samples_phrase(rows: pd.DataFrame) -> str:
    """``samples #0, #1, #6``; many: ``100 samples (#0, #1, … and 95 more)``."""
    samples = rows["sample"].unique()
    return f"samples {sample_names(samples)}" if len(samples) <= LISTED else \
        f"{len(samples)} samples ({sample_names(samples)})"


def cut(text: str, most: int) -> str:
    """``text`` cut to ``most`` characters, an ellipsis marking the cut."""
    return text if len(text) <= most else text[:most - 1].rstrip() + "…"
