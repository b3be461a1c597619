"""Quantized models against their float model (quantization_error.csv, read back by
bitdrift.analysis.quantization_error.summarize): per quantized model, the SQNR range over
the devices at the final output, the device furthest from the float model and the layer
where it parts from the others, the largest error in units of the quantization scale, and
the predicted labels that change; a line of the answer per quantized model."""

from __future__ import annotations

import math

import pandas as pd

from bitdrift.report.findings.text import and_list, cut, first_listed

HEADING = "Quantized models against their float model"
# A layer name in a cell or a line: ONNX names run to 50 characters
LAYER_WIDTH = 60


def _db(value: float) -> str:
    return "inf (equal)" if math.isinf(value) and value > 0 else f"{value:.1f}"


def _range(summary) -> str:
    """``35.7-38.1``; one number where both ends read the same."""
    low, high = (_db(value) for value in summary.sqnr_range)
    return low if low == high else f"{low}-{high}"


def _furthest(summary) -> str:
    sqnr = _db(summary.output_sqnr.get(summary.furthest, math.nan))
    if summary.parts_at is None and len(summary.devices) > 1:
        return f"none apart (lowest: {summary.furthest}, {sqnr} dB)"
    return f"{summary.furthest} ({sqnr} dB)"


def _parts(summary) -> str:
    from bitdrift.analysis.quantization_error import PARTS_DB

    if len(summary.devices) == 1:
        return "one device: none to part from"
    if summary.parts_at is None:
        return (f"none: {summary.furthest} falls at most {PARTS_DB} dB further below the "
                "others at any layer")
    first = summary.parts_at == summary.first_layer(summary.furthest)
    return (f"`{cut(summary.parts_at, LAYER_WIDTH)}`, "
            + (f"{summary.parts_by:.1f} dB below the best other device at its first "
               "recorded layer" if first else f"{summary.parts_by:.1f} dB further below "
               "the best other device than at its layer before"))


def _scales(summary) -> str:
    if summary.largest_in_scales is None:
        return "no fixed scale (computed per batch)"
    device, layer = summary.largest_in_scales_at
    return f"{summary.largest_in_scales:.2f} ({device}, `{cut(layer, LAYER_WIDTH)}`)"


def _labels(summary) -> str:
    """`ort_haswell 1 of 2`; none changed: `none of 2 on each device`."""
    if not summary.labels:
        return "not compared"
    changed = [(device, counts) for device, counts in summary.labels.items() if counts[1]]
    totals = {counts[0] for counts in summary.labels.values()}
    if not changed:
        return f"none of {first_listed(sorted(totals))} on each device"
    return first_listed(f"{device} {count} of {labels}" for device, (labels, count)
                        in changed)


def quantization_table(summaries) -> pd.DataFrame:
    """A row per quantized model."""
    return pd.DataFrame([{
        "quantized model": summary.model,
        "float model": summary.float_model,
        "devices": len(summary.devices),
        "samples": summary.samples,
        "output SQNR (dB)": _range(summary),
        "furthest device": _furthest(summary),
        "where it parts": _parts(summary),
        "largest error (scales)": _scales(summary),
        "labels changed": _labels(summary),
    } for summary in summaries])


def quantization(table: pd.DataFrame) -> list:
    """The section's items: what is compared, a table of a row per quantized model, and a
    line per model where a device parts from the others."""
    from bitdrift.analysis.quantization_error import summarize

    summaries = summarize(table) if not table.empty else []
    if not summaries:
        return ["No quantized model ran beside its float model on a common device."]
    items: list = [
        "The SQNR in dB (higher is closer) of each quantized model against its float "
        "model on the same device (quantization_error.csv, quantization_error.pdf); the "
        "furthest device (lowest output SQNR) parts where its shortfall below the best "
        "other device grows most.",
        quantization_table(summaries)]
    for summary in summaries:
        if summary.parts_at is None:
            continue
        others = [device for device in summary.devices if device != summary.furthest]
        items.append(
            f"{summary.model}: {summary.furthest} parts from {and_list(others)} at "
            f"`{cut(summary.parts_at, LAYER_WIDTH)}` (its shortfall below the best of "
            f"them grows by {summary.parts_by:.1f} dB there) and ends at "
            f"{_db(summary.output_sqnr[summary.furthest])} dB against "
            f"{_db(summary.sqnr_range[1])} dB; labels changed: "
            f"{_labels(summary)}.")
    return items


def quantization_answer(table: pd.DataFrame) -> dict[str, str]:
    """{quantized model: its line in the answer}."""
    from bitdrift.analysis.quantization_error import summarize

    lines = {}
    for summary in summarize(table) if not table.empty else []:
        where = ""
        if summary.parts_at is not None:
            where = (f"; furthest {summary.furthest} "
                     f"({_db(summary.output_sqnr[summary.furthest])} dB), parting at "
                     f"`{cut(summary.parts_at, LAYER_WIDTH)}`")
        lines[summary.model] = (
            f"{summary.model}: output SQNR {_range(summary)} dB against its float model "
            f"{summary.float_model} over {len(summary.devices)} device"
            f"{'s' * (len(summary.devices) != 1)}{where}; predicted labels changed: "
            f"{_labels(summary)} (quantization_error.csv).")
    return lines
