"""The layer axis the figures share: the layer kinds marked along it (the figures of
remaining precision, bitdrift.report.figures.remaining_precision, and the studies' per-layer
figures) and its tick labels, long layer names shortened with a key (every per-layer
figure)."""

from __future__ import annotations

import os
import re
import textwrap

import pandas as pd

from bitdrift.inputs.models import layer_kind


def mark_layer_kinds(ax, layers: pd.DataFrame) -> None:
    """Activation layers: red upward arrows; pooling layers: blue downward arrows, at the
    foot of the panel (the paper's Figures SUP-4..7 put them on the x-axis)."""
    coordinates = ("data", "axes fraction")
    for position, layer_class in zip(layers["position"], layers["layer_class"].fillna(""),
                                     strict=True):
        kind = layer_kind(layer_class)
        if kind in ("activation", "pooling"):
            low, high = (0.0, 0.09) if kind == "activation" else (0.09, 0.0)
            ax.annotate("", (position, high), (position, low), xycoords=coordinates,
                        textcoords=coordinates,
                        arrowprops={"arrowstyle": "-|>", "lw": 1.5,
                                    "color": "red" if kind == "activation" else "blue"})
    # The arrows sit in a grey strip below 0 (the axis leaves room for them); no tick
    # there: precision and counts are never negative
    bottom, top = ax.get_ylim()
    if bottom < 0:
        ax.axhspan(bottom, 0, color="0.94", zorder=0, lw=0)
        ax.set_yticks([tick for tick in ax.get_yticks() if 0 <= tick <= top])
        ax.set_ylim(bottom, top)


# A rotated tick label longer than this squeezes its panel: longer layer names are shortened
# (layer_labels) and given back in full in a key under the figure.
LAYER_LABEL_WIDTH = 22
# Where a layer name splits into path parts: "/" (ONNX node names), "." (torch module
# paths), ":" and "__" (how a record stores "/": bitdrift.record.hdf5).
_SEPARATOR = re.compile(r"__|[/.:]")


def _common_start(names: list[str]) -> str:
    """The longest start all ``names`` share that ends with a separator and leaves each
    name something."""
    shared = os.path.commonprefix(names)
    ends = [match.end() for match in _SEPARATOR.finditer(shared)]
    ends = [end for end in ends if all(len(name) > end for name in names)]
    return shared[:ends[-1]] if ends else ""


def _common_end(names: list[str]) -> str:
    """The longest end all ``names`` share that starts at a separator or "_" (ONNX's
    ``_output_0``) and leaves each name something."""
    shared = os.path.commonprefix([name[::-1] for name in names])[::-1]
    starts = [k for k, character in enumerate(shared) if character in "_/.:"]
    starts = [k for k in starts if all(len(name) > len(shared) - k for name in names)]
    return shared[starts[0]:] if starts else ""


def _tail(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters: its end after "…"."""
    if len(name) <= width:
        return name
    # Cut at a separator where that loses little; else mid-part, which keeps more of
    # what tells names apart (norm1/… and norm2/…)
    for match in _SEPARATOR.finditer(name):
        if width - 3 <= len(name) - match.end() + 1 <= width:
            return "…" + name[match.end():]
    return "…" + name[len(name) - width + 1:]


def layer_labels(names, width: int = LAYER_LABEL_WIDTH) -> tuple[list[str], list[str]]:
    """Tick labels for layer names in axis order, none over ``width`` characters, and the
    key lines that give back what the labels leave out (empty when every name fits).

    When a name is too long, every label starts with its layer's number on the axis (1, 2,
    ...); the path parts that all long names share at their start (``__block__``, a torch
    module path's ``block.``) and the end they share (``_output_0``, ONNX's name for a
    node's first output) are dropped from every name that carries them, a stored ``__``
    shown as the ``/`` it stands for; a name still too long keeps its last parts after
    "…" and is spelled out in the key, by its number."""
    names = [str(name) for name in names]
    if all(len(name) <= width for name in names):
        return names, []
    long = [name for name in names if len(name) > width]
    start = _common_start(long) if len(long) > 1 else ""
    end = _common_end(long) if len(long) > 1 else ""
    labels, cut = [], []
    for number, name in enumerate(names, 1):
        core = name
        if start and core.startswith(start) and len(core) > len(start):
            core = core[len(start):]
        if end and core.endswith(end) and len(core) > len(end):
            core = core[:-len(end)]
        core = core.replace("__", "/").lstrip("/.:")
        label = _tail(core, width - len(str(number)) - 1)
        labels.append(f"{number} {label}")
        if label != core:
            cut.append(f"{number} {name}")
    dropped = " and ".join(part for part in (f"start {start!r}" if start else "",
                                             f"end {end!r}" if end else "") if part)
    key = ["layers numbered along the axis"
           + (f"; {dropped} dropped from the names" if dropped else "")
           + ("; '__' (a stored '/') shown as '/'" if any("__" in n for n in names) else "")
           + ("; names cut with … in full:" if cut else ""), *cut]
    return labels, key


def layer_key_text(key: list[str], characters: int) -> str:
    """``layer_labels``' key as lines of at most ``characters``: its first line wrapped,
    then the names cut, side by side."""
    if not key:
        return ""
    lines = textwrap.wrap(key[0], characters)
    line = ""
    for entry in key[1:]:
        if line and len(line) + 3 + len(entry) > characters:
            lines.append(line)
            line = ""
        line = f"{line}   {entry}" if line else entry
    return "\n".join([*lines, *([line] if line else [])])
