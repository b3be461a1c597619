"""The answer, first: per model, in at most five lines, how many equivalence classes the
devices form (and which precisions that counts), the most bits two devices lose and which
two, whether a predicted label changes between devices, and the setting that tells the
most classes apart; a quantized model's distance to its float model on a line of its own.
The classes and the setting are read from the tables (eqc.csv, explain.csv,
device_classes.csv); the bits and the labels from the records' final outputs
(:func:`final_outputs`), the outputs the classes compare; the quantized models' lines from
quantization_error.csv."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bitdrift.report.findings.text import and_list, first_listed, sample_names

HEADING = "In short"


@dataclass
class Farthest:
    """The two devices of one precision whose final outputs share the fewest leading
    mantissa bits on some sample: the remaining precision of the devices (the i* of a set
    is its largest pairwise i*, bitdrift.analysis.remaining_precision)."""

    bits: int  # mantissa bits they share (0: sign or exponent differ)
    mantissa: int
    devices: tuple[str, str]
    sample: int
    sign_or_exponent: bool  # they differ above the mantissa
    tied: int = 1  # the pairs as far apart, these two among them


@dataclass
class ModelOutputs:
    """What the answer reads of one model's records: each device's precision, its
    predicted label per sample (the argmax of the final output's last axis, a tuple where
    the output has several rows; None where the last axis holds one value), and per float
    format of two devices or more, each pair's most dropped bits over the samples and the
    first sample where it drops them: {format: {(a, b): (dropped, sample)}}."""

    precisions: dict[str, str] = field(default_factory=dict)
    labels: dict[int, dict[str, tuple | None]] = field(default_factory=dict)
    pairs: dict[str, dict[tuple[str, str], tuple[int, int]]] = field(default_factory=dict)

    def farthest(self, float_format: str, leave_out=()) -> Farthest | None:
        """The pair of ``float_format`` that drops the most bits (the first of equals),
        devices in ``leave_out`` left out; None where fewer than two devices remain."""
        from bitdrift.analysis.remaining_precision import MANTISSA_BITS

        pairs = {pair: found for pair, found in self.pairs.get(float_format, {}).items()
                 if not set(pair) & set(leave_out)}
        if not pairs:
            return None
        pair = max(pairs, key=lambda pair: pairs[pair][0])
        dropped, sample = pairs[pair]
        mantissa = MANTISSA_BITS[float_format]
        return Farthest(bits=max(mantissa - dropped, 0), mantissa=mantissa, devices=pair,
                        sample=sample, sign_or_exponent=dropped > mantissa,
                        tied=sum(found[0] == dropped for found in pairs.values()))


def final_outputs(records) -> dict[str, ModelOutputs]:
    """{model: ModelOutputs} from the records (failure records left out): each device's
    final output on each sample the model's records share, its repeats summarized as the
    classes do (the commonest repeat), the deployed model's output where the records hold
    it (bitdrift.record.reader.group_by_model)."""
    from bitdrift.analysis.eqc import summarize_repeats
    from bitdrift.analysis.remaining_precision import (
        MANTISSA_BITS,
        as_float64,
        dropped_bits,
    )
    from bitdrift.record.hdf5 import OUTPUT, FailedDevice
    from bitdrift.record.reader import Record, group_by_model

    found: dict[str, ModelOutputs] = {}
    opened = []
    try:
        for path in records:
            if not Path(path).is_file():  # as the fingerprints: a record never written
                continue
            try:
                opened.append(Record(path))
            except FailedDevice:  # a device that did not run: the failures section says so
                continue
        for model, group in group_by_model(opened):
            outputs = found.setdefault(model, ModelOutputs())
            samples = sorted(set.intersection(*(set(record.samples) for record in group)))
            representative: dict[str, dict[int, np.ndarray]] = {}
            formats: dict[str, str] = {}
            for record in group:
                outputs.precisions[record.device] = record.precision
                for sample in samples:
                    tensor = record.tensor(sample, OUTPUT)
                    formats[record.device] = tensor.float_format
                    _, values = summarize_repeats(record.device, tensor.values,
                                                  tensor.float_format)
                    representative.setdefault(record.device, {})[sample] = values
                    outputs.labels.setdefault(sample, {})[record.device] = _label(
                        as_float64(values, tensor.float_format))
            by_format: dict[str, list[str]] = {}
            for device, float_format in formats.items():
                by_format.setdefault(float_format, []).append(device)
            for float_format, devices in by_format.items():
                if len(devices) < 2 or float_format not in MANTISSA_BITS:
                    continue
                pair_bits = outputs.pairs.setdefault(float_format, {})
                for a, b in itertools.combinations(devices, 2):
                    for sample in samples:  # the first sample of the most dropped bits
                        dropped = dropped_bits(representative[a][sample],
                                               representative[b][sample], float_format)
                        if (a, b) not in pair_bits or dropped > pair_bits[(a, b)][0]:
                            pair_bits[(a, b)] = (dropped, sample)
    finally:
        for record in opened:
            record.close()
    return found


def _label(values: np.ndarray) -> tuple | None:
    """The argmax of the last axis, per row; None where that axis holds one value (a
    regression's output names no label)."""
    values = np.asarray(values)
    if values.ndim == 0 or values.shape[-1] < 2:
        return None
    return tuple(int(index) for index in np.argmax(values.reshape(-1, values.shape[-1]),
                                                   axis=1))


def _per_sample(counts: pd.Series) -> str:
    """``13 classes on each of the 3 samples``; counts that vary: their range and the
    commonest count's share."""
    from bitdrift.analysis.eqc import class_count_frequency

    if counts.nunique() == 1:
        each = "the sample" if len(counts) == 1 else f"each of the {len(counts)} samples"
        count = counts.iloc[0]
        return f"{count} class{'' if count == 1 else 'es'} on {each}"
    common, times = next(iter(class_count_frequency(counts).items()))
    return (f"{counts.min()} to {counts.max()} classes per sample ({common} on {times} of "
            f"the {len(counts)} samples)")


def _main_precision(precisions: dict[str, str]) -> str:
    """The precision of the most devices (float32 among equals): the one whose classes and
    bits the answer says first."""
    counts = pd.Series(list(precisions.values())).value_counts()
    most = counts[counts == counts.max()].index
    return "float32" if "float32" in most else str(most[0])


def _classes_line(model: str, rows: pd.DataFrame, precisions: dict[str, str]) -> str:
    devices = list(dict.fromkeys(rows["device"]))
    of = {device: precisions.get(device, "unknown") for device in devices}
    main = _main_precision(of)
    kept = rows[rows["device"].map(of) == main]
    line = (f"{model}: {_per_sample(kept.groupby('sample')['eqc'].nunique())} among its "
            f"{kept['device'].nunique()} {main} devices (bit-identical final outputs form a "
            "class)")
    others = list(dict.fromkeys(value for value in of.values() if value != main))
    if others:
        line += (f"; counting every precision ({', '.join([main, *others])}), "
                 f"{_per_sample(rows.groupby('sample')['eqc'].nunique())} among all "
                 f"{len(devices)} devices")
    return line + "."


def _shared(found: Farthest, kind: str) -> str:
    a, b = found.devices
    notes = (["they differ in sign or exponent"] if found.sign_or_exponent else []) + (
        [f"one of {found.tied} pairs as far apart"] if found.tied > 1 else [])
    return (f"{a} and {b} share {found.bits} of {kind}'s {found.mantissa} mantissa bits on "
            f"sample #{found.sample}" + (f" ({'; '.join(notes)})" if notes else ""))


def _bits_lines(model: str, outputs: ModelOutputs, reduced=()) -> list[str]:
    """The most bits two devices of the main precision lose, and which two; where one of
    them computes below its declared format (``reduced``: the effective-precision check),
    the most among the others too. The other precisions' fewest shared bits on a line of
    their own."""
    if not outputs.pairs:
        return []
    main = _main_precision(outputs.precisions)
    kind = main if main in outputs.pairs else next(iter(outputs.pairs))
    first = outputs.farthest(kind)
    if first.bits == first.mantissa:
        lines = [f"{model}: the most bits lost: none; every {kind} device gives the same bits "
                 "on every sample."]
    else:
        line = f"{model}: the most bits lost: {_shared(first, kind)}"
        below = [device for device in first.devices if device in set(reduced)]
        if below:
            rest = outputs.farthest(kind, leave_out=reduced)
            line += (f"; without {and_list(below)}, which "
                     + ("computes" if len(below) == 1 else "compute")
                     + " below the declared format, "
                     + (f"{rest.devices[0]} and {rest.devices[1]} share {rest.bits} on sample "
                        f"#{rest.sample}" if rest else "no two devices are left"))
        lines = [line + "."]
    others = [f"{name} {found.bits} of {found.mantissa}" for name, found in
              ((name, outputs.farthest(name)) for name in outputs.pairs if name != kind)]
    if others:
        lines.append(f"{model}: the fewest bits shared within each other precision: "
                     + ", ".join(others) + ".")
    return lines


def labels_line(model: str, outputs: ModelOutputs) -> str | None:
    if not outputs.labels:
        return None
    devices = len(outputs.precisions)
    samples = len(outputs.labels)
    if any(label is None for labels in outputs.labels.values() for label in labels.values()):
        return (f"{model}: predicted labels not compared: the final output's last axis holds "
                "one value (no argmax).")
    changed = {sample: labels for sample, labels in outputs.labels.items()
               if len(set(labels.values())) > 1}
    what = "predicted label (argmax of the final output)"
    if not changed:
        return (f"{model}: the {what} is the same on all {devices} devices on each of the "
                f"{samples} recorded samples.")
    # per device, the samples where its label is not the one most devices give
    off: dict[str, int] = {}
    for labels in changed.values():
        common = pd.Series([str(label) for label in labels.values()]).value_counts().index[0]
        for device, label in labels.items():
            if str(label) != common:
                off[device] = off.get(device, 0) + 1
    ranked = sorted(off.items(), key=lambda item: -item[1])
    return (f"{model}: the {what} differs between devices on {len(changed)} of the "
            f"{samples} recorded samples ({sample_names(changed)}); off the most devices' "
            "label: " + first_listed((f"{device} ({count})" for device, count in ranked),
                                     listed=4, shown=3) + ".")


def _pairs_split(signature: pd.Series, values: pd.Series) -> int:
    """How many pairs of devices in different classes (``signature``: a device's classes
    on every sample) differ in ``values`` (an attribute's value per device)."""
    devices = list(signature.index)
    return sum(1 for a, b in itertools.combinations(devices, 2)
               if signature[a] != signature[b] and values[a] != values[b])


def _setting_line(model: str, rows: pd.DataFrame, explain: pd.DataFrame,
                  settings: pd.DataFrame) -> str | None:
    """The attribute of explain's sets (device_classes.csv holds each device's values)
    that tells apart the most pairs of devices in different classes."""
    signature = rows.pivot_table(index="device", columns="sample", values="eqc",
                                 aggfunc="first").apply(tuple, axis=1)
    if signature.nunique() == 1:
        return f"{model}: one class: no setting to explain."
    if settings.empty or "model" not in settings:
        return None
    mine = settings[settings["model"] == model].set_index("device")
    # the table holds every model's attributes: another model's are empty here
    names = [column for column in mine.columns if column not in ("model", "device_class")
             and mine[column].notna().any()]
    mine = mine[names].map(lambda value: "" if pd.isna(value) else str(value))
    signature = signature[signature.index.isin(mine.index)]
    if not names or len(signature) < 2:
        return None
    apart = sum(1 for a, b in itertools.combinations(signature.index, 2)
                if signature[a] != signature[b])
    split = {name: _pairs_split(signature, mine[name]) for name in names}
    best = max(names, key=lambda name: split[name])  # the first of the most
    line = (f"{model}: the setting that tells the most classes apart: `{best}`, which splits "
            f"{split[best]} of the {apart} pairs of devices in different classes")
    final = explain[(explain.get("model") == model)
                    & (explain.get("layer", pd.Series("output", index=explain.index))
                       .astype(str) == "output")] if not explain.empty else explain
    if len(final):
        # a sample no set explains has no attributes: empty (pandas 3 keeps NaN through
        # astype(str), so it is filled first)
        together = list(dict.fromkeys(name for cell in final["attributes"].fillna("")
                                      .astype(str) for name in cell.split(";") if name))
        determined = final["determined"].astype(str).str.lower().eq("true")
        what = ("every class" if determined.all() else
                f"the classes of {int(determined.sum())} of {len(final)} samples")
        if 1 < len(together) <= 4:
            line += (f"; {and_list([f'`{name}`' for name in together])} together determine "
                     f"{what} (explain.csv)")
        elif len(together) > 4:
            line += f"; explain.csv's {len(together)} settings together determine {what}"
    return line + "."


def answer(eqc: pd.DataFrame, precisions: dict[str, str], explain: pd.DataFrame,
           settings: pd.DataFrame, outputs: dict[str, ModelOutputs] | None,
           effective: pd.DataFrame | None = None,
           quantized: dict[str, str] | None = None) -> list[str]:
    """At most five lines per model (classes, bits and the other precisions' bits,
    labels, setting), each said where its table or records are there, and a quantized
    model's distance to its float model last (``quantized``: {model: line},
    bitdrift.report.findings.quantization.quantization_answer); ``effective``: the
    effective-precision check (effective_precision.csv), whose reduced devices the bits
    line names."""
    lines: list[str] = []
    outputs = outputs or {}
    effective = effective if effective is not None else pd.DataFrame()
    reduced = set(effective.loc[effective["reduced"].astype(str).str.lower() == "true",
                                "device"].astype(str)) \
        if {"reduced", "device"} <= set(effective.columns) else set()
    models = list(dict.fromkeys([*(eqc["model"] if not eqc.empty else []), *outputs,
                                 *(quantized or {})]))
    for model in models:
        rows = eqc[eqc["model"] == model] if not eqc.empty else eqc
        found = outputs.get(model)
        said = [_classes_line(model, rows, precisions) if len(rows) else None,
                *(_bits_lines(model, found, reduced) if found else []),
                labels_line(model, found) if found else None,
                _setting_line(model, rows, explain, settings) if len(rows) else None,
                (quantized or {}).get(model)]
        lines += [line for line in said if line]
    return lines or ["No record ran: nothing to answer."]
