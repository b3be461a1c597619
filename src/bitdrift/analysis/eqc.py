"""Equivalence classes (EQCs) of bit-identical results, and the per-layer analysis pass.

Equality is bitwise: same float format, same shape, same bytes. So -0.0 and +0.0 are in
different classes, and two NaNs are equal only if their bits are.

The representative of a device is its most frequent output over the repeats; a tie goes
to the output that occurred first (lowest repeat index). Classes are numbered 1, 2, ...
in order of first appearance over the devices in the order given (config order in the
workflow, argument order on the command line).

Everything here streams one (model, sample, layer) at a time: memory is bounded by one
layer over all devices and does not grow with the number of layers.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bitdrift.analysis.remaining_precision import (
    RemainingPrecisionAccumulator,
    as_float64,
    significant_bits,
)
from bitdrift.record.hdf5 import INTEGER_DTYPES, DigestOnly, RecordError
from bitdrift.record.reader import Record, group_by_model

EQC_COLUMNS = ["model", "sample", "device", "eqc", "deterministic", "distinct_outputs",
               "majority_count"]
# Appended to eqc.csv: whether the device computed in its declared format (see
# bitdrift.analysis.effective_precision.summary).
EQC_EXTRA_COLUMNS = ["effective_precision"]
EQC_LAYER_COLUMNS = ["model", "sample", "layer", "position", "device", "eqc", "deterministic",
                     "distinct_outputs", "majority_count"]
# Appended to eqc_layers.csv: the device's declared precision (pairs are compared within one).
EQC_LAYER_EXTRA_COLUMNS = ["precision"]
PRECISION_COLUMNS = ["model", "sample", "layer", "position", "n_eqc", "remaining_precision",
                     "remaining_precision_uncapped", "median_remaining_precision",
                     "deviating_fraction"]
# Appended after the contract's columns: which devices entered, the layer's class, and
# the statistical significant bits (empty unless asked for: `--significant-bits`).
PRECISION_EXTRA_COLUMNS = ["precision", "n_devices", "layer_class", "significant_bits_mean",
                           "significant_bits_min", "significant_bits_reference",
                           "reduced_precision_devices",
                           # the same over the devices left when those are set aside
                           # (empty where none is flagged): how far one device bounds it
                           "remaining_precision_without_reduced",
                           # why a layer has no remaining precision (a quantized
                           # layer's integers: bits of a float format only)
                           "not_analysed"]


class OutputKey:
    """Identity of one output under bitwise equality: float format, shape and every byte.

    Equality compares all bytes (about 15x faster than hashing them with SHA-256, which
    was a third of the analysis time); the hash looks only at the ends of the buffer, so
    two outputs that share it are still told apart by equality. A key holds its output
    (no copy): one layer over all devices at a time, as the analysis streams.
    """

    __slots__ = ("header", "bits", "_hash")

    def __init__(self, values: np.ndarray, float_format: str):
        values = np.ascontiguousarray(values)
        self.header = (float_format, values.shape, values.dtype.str)
        self.bits = values.reshape(-1).view(np.uint8)
        self._hash = hash((self.header, self.bits[:512].tobytes(), self.bits[-512:].tobytes()))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return (isinstance(other, OutputKey) and self._hash == other._hash
                and self.header == other.header and np.array_equal(self.bits, other.bits))


def output_key(values: np.ndarray, float_format: str) -> OutputKey:
    """Identity of one output under bitwise equality."""
    return OutputKey(values, float_format)


@dataclass
class DeviceSummary:
    device: str
    key: OutputKey  # representative's identity
    deterministic: bool
    distinct_outputs: int
    majority_count: int


def class_count_frequency(per_sample):
    """How many samples have each number of classes (``per_sample``: a pandas Series,
    sample -> classes), the commonest count first and of equally common ones the smaller
    first: the order the findings and the EQC figure's title say them in."""
    frequency = per_sample.value_counts()
    return frequency.sort_index().sort_values(ascending=False, kind="stable")


def summarize_repeats(device: str, repeats: np.ndarray, float_format: str):
    """Return (summary, representative array) for one device's repeats of one tensor."""
    keys = [output_key(repeat, float_format) for repeat in repeats]
    counts = Counter(keys)
    # Counter keeps insertion order, so max() returns the first-seen key among ties.
    representative_key = max(counts, key=counts.get)
    representative = repeats[keys.index(representative_key)]
    summary = DeviceSummary(
        device=device,
        key=representative_key,
        deterministic=len(counts) == 1,
        distinct_outputs=len(counts),
        majority_count=counts[representative_key],
    )
    return summary, representative


def summarize_digests(device: str, digests: list[bytes]) -> DeviceSummary:
    """The summary of :func:`summarize_repeats` from the repeats' digests (bitdrift.record.hdf5.
    output_digest: equal digests, bit-identical values), for a tensor recorded as digests
    only; its key is the representative's digest."""
    counts = Counter(digests)
    representative = max(counts, key=counts.get)  # the first seen among ties, as above
    return DeviceSummary(device=device, key=representative, deterministic=len(counts) == 1,
                         distinct_outputs=len(counts), majority_count=counts[representative])


def number_classes(keys: list[OutputKey]) -> list[int]:
    """Class ids 1.. in order of first appearance."""
    ids: dict[OutputKey, int] = {}
    return [ids.setdefault(key, len(ids) + 1) for key in keys]


@dataclass
class LayerResult:
    model: str
    sample: int
    layer: str
    position: int
    devices: list[DeviceSummary]
    classes: list[int]
    precision: dict | None  # remaining precision stats over the analysed devices
    layer_class: str = ""
    final: bool = False  # the final output


def _common_samples(model: str, records: list[Record]) -> list[int]:
    reference = records[0]
    for record in records[1:]:
        if record.samples != reference.samples:
            raise RecordError(
                f"{record.path}: samples {record.samples} differ from {reference.path} "
                f"({reference.samples}) for model {model!r}"
            )
    return reference.samples


def _common_layers(records: list[Record], sample: int):
    reference = records[0].layers(sample)
    labels = [info.label for info in reference]
    common = set(labels)
    for record in records[1:]:
        common &= record.layer_labels(sample)
    left_out = [label for label in labels if label not in common]
    if left_out:
        print(f"bitdrift: sample {sample}: layers not in every record, left out of the "
              f"per-layer analysis: {left_out}", file=sys.stderr)
    return [info for info in reference if info.label in common]


def analyse(records: list[Record], precision: str | None = None, layers: bool = True,
            remaining_precision: bool = True,
            significant: bool = False) -> Iterator[LayerResult]:
    """One pass over all (model, sample, layer) of the records, streaming.

    ``precision`` selects the devices whose remaining precision is computed (records with
    that ``precision`` attribute); None means the precision shared by all records of a
    model, and an error if they differ. With ``remaining_precision=False`` only the classes
    are computed, so records of mixed precisions need no choice. ``significant`` adds the
    statistical significant bits of the analysed devices (:func:`precision.significant_bits`)
    against the model's first float64 device where it has one, else their mean.
    """
    for model, group, sample, info, analysed_precision in _layer_tasks(
            records, precision, layers, remaining_precision):
        yield _analyse_layer(model, group, sample, info, analysed_precision, significant)


def _layer_tasks(records: list[Record], precision, layers: bool, remaining_precision: bool):
    """(model, its records, sample, layer, analysed precision) in analysis order."""
    for model, group in group_by_model(records):
        analysed_precision = precision
        if remaining_precision and analysed_precision is None:
            precisions = sorted({record.precision for record in group})
            if len(precisions) > 1:
                raise RecordError(
                    f"records of model {model!r} have precisions {precisions}; choose one for "
                    "remaining precision with --precision"
                )
            analysed_precision = precisions[0]
        for sample in _common_samples(model, group):
            digest_only = [record.device for record in group
                           if sample not in record.value_samples]
            if layers and digest_only:
                print(f"bitdrift: model {model!r}, sample {sample}: layers recorded as digests "
                      f"only on {', '.join(digest_only)} (analysis.full_samples): they enter "
                      "the per-layer classes, not the remaining precision", file=sys.stderr)
            infos = _common_layers(group, sample) if layers else [
                info for info in group[0].layers(sample) if info.final]
            for info in infos:
                yield model, group, sample, info, analysed_precision


def _analyse_layer(model, group, sample, info, analysed_precision,
                   significant=False) -> LayerResult:
    summaries = []
    accumulator = None
    formats = set()
    shape = None
    analysed_values, reference, reference_name = [], None, "mean of the devices"
    integers = None  # the integer dtype of a quantized layer's values
    # All devices are read before any is analysed: interleaving HDF5 reads with the
    # NumPy work below made the analysis ~25 % slower (each evicts the other's caches).
    # One label is one dataset name in every record (the final output apart).
    try:
        tensors = [record.tensor(sample, info) for record in group]
    except DigestOnly:  # a sample outside analysis.full_samples: classes from the digests
        summaries = [summarize_digests(record.device, record.digests(sample, info))
                     for record in group]
        return LayerResult(model, sample, info.label, info.position, summaries,
                           number_classes([s.key for s in summaries]), None,
                           info.class_name, final=info.final)
    reduced = _reduced_at([r for r in group if r.precision == analysed_precision], info)
    declared = None  # the analysed devices but the reduced ones, where some are
    for record, tensor in zip(group, tensors, strict=True):
        # Equal element counts in another layout (NCHW vs NHWC) are not comparable values.
        if shape is None:
            shape, shape_path = tensor.values.shape[1:], record.path
        elif tensor.values.shape[1:] != shape:
            raise RecordError(
                f"{record.path}: sample {sample}, {info.label}: shape "
                f"{tensor.values.shape[1:]} differs from {shape} in {shape_path}; the "
                "records do not hold the same tensor")
        summary, representative = summarize_repeats(record.device, tensor.values,
                                                     tensor.float_format)
        summaries.append(summary)
        if significant and record.precision == "float64" and reference is None \
                and analysed_precision != "float64":
            reference = representative.reshape(-1).astype(np.float64)
            reference_name = f"float64 device {record.device}"
        if record.precision == analysed_precision and \
                tensor.float_format in INTEGER_DTYPES:
            integers = tensor.float_format  # classes on the bits; no float format's bits
        elif record.precision == analysed_precision:
            if significant:
                analysed_values.append(as_float64(representative, tensor.float_format)
                                       .reshape(-1))
            formats.add(tensor.float_format)
            if len(formats) == 1:
                if accumulator is None:
                    accumulator = RemainingPrecisionAccumulator(tensor.float_format)
                accumulator.add(representative)
                if reduced and record.device not in reduced:
                    if declared is None:
                        declared = RemainingPrecisionAccumulator(tensor.float_format)
                    declared.add(representative)
    if accumulator is None and integers is not None:
        # a quantized layer's integers: classes on their bits, as for floats; the remaining
        # precision is a float format's measure, so the row says why it has none
        stats = {"remaining_precision": np.nan, "remaining_precision_uncapped": np.nan,
                 "median_remaining_precision": np.nan, "deviating_fraction": np.nan,
                 "not_analysed": f"{integers} integers of a quantized layer: remaining "
                                 "precision is measured on float formats"}
    elif accumulator is None:
        stats = None
    elif len(formats) > 1:
        # Devices of one nominal precision computed this layer in different formats.
        stats = {"remaining_precision": np.nan, "remaining_precision_uncapped": np.nan,
                 "median_remaining_precision": np.nan, "deviating_fraction": np.nan}
    else:
        stats = accumulator.result()
    selected = [s.key for s, r in zip(summaries, group, strict=True)
                if r.precision == analysed_precision]
    if stats is not None:
        stats = {"n_eqc": len(set(selected)), **stats, "precision": analysed_precision,
                 "n_devices": len(selected),
                 "reduced_precision_devices": ";".join(reduced),
                 "remaining_precision_without_reduced":
                     declared.result()["remaining_precision"]
                     if declared is not None and len(formats) == 1 else None}
        if significant and len(formats) == 1 and integers is None:
            stats.update(significant_bits(np.stack(analysed_values), formats.pop(),
                                          reference),
                         significant_bits_reference=reference_name)
    return LayerResult(model, sample, info.label, info.position, summaries,
                       number_classes([s.key for s in summaries]), stats, info.class_name,
                       final=info.final)


def _reduced_at(records: list[Record], info) -> list[str]:
    """Devices whose effective-precision check flags this layer (the final output: any
    layer, since every layer feeds it)."""
    from bitdrift.analysis.effective_precision import reduced_layers

    devices = []
    for record in records:
        reduced = reduced_layers(record.effective_precision or {})
        if reduced and (info.final or info.name in reduced):
            devices.append(record.device)
    return devices


def layered_subgroup(group: list[Record]) -> list[Record] | None:
    """Of one model's records, those that record layers where others record the final
    output alone (a compiled graph: Inductor, ExecuTorch), in their order; None where all
    or none record layers, or one alone does (no pair to compare)."""
    layered = [record for record in group
               if len(record.layer_labels(record.samples[0])) > 1]
    return layered if 1 < len(layered) < len(group) else None


def eqc_tables(records: list[Record], layers: bool = True):
    """(final-output table, per-layer table) as documented in docs/analysis.md, as DataFrames."""
    import pandas as pd  # imported here: `bitdrift precision` writes rows without pandas

    from bitdrift.analysis.effective_precision import summary as effective_summary
    from bitdrift.analysis.effective_precision import unchecked_reason

    final_rows, layer_rows = [], []
    effective = {(record.model, record.device): effective_summary(
        record.effective_precision, unchecked_reason(record)) for record in records}
    precisions = {(record.model, record.device): record.precision for record in records}

    def row_of(result, summary, eqc, position):
        return {"model": result.model, "sample": result.sample, "layer": result.layer,
                "position": position, "device": summary.device, "eqc": eqc,
                "deterministic": summary.deterministic,
                "distinct_outputs": summary.distinct_outputs,
                "majority_count": summary.majority_count}

    # Where some devices record the final output alone (a compiled graph), the layers
    # common to all are the final output alone: the layers are those of the devices that
    # record them, among those devices (as divergence_table compares them), and the final
    # output keeps its place after them
    final_positions: dict[tuple, int] = {}
    for group in (layered_subgroup(group) for _, group in group_by_model(records)
                  if layers):
        for result in analyse(group or [], layers=True, remaining_precision=False):
            if result.final:
                final_positions[(result.model, result.sample)] = result.position
                continue
            layer_rows += [{**row_of(result, summary, eqc, result.position),
                            "precision": precisions[(result.model, summary.device)]}
                           for summary, eqc in zip(result.devices, result.classes,
                                                   strict=True)]
    for result in analyse(records, layers=layers, remaining_precision=False):
        position = final_positions.get((result.model, result.sample), result.position) \
            if result.final else result.position
        for summary, eqc in zip(result.devices, result.classes, strict=True):
            row = row_of(result, summary, eqc, position)
            layer_rows.append({**row, "precision": precisions[(result.model, summary.device)]})
            if result.final:
                checked = effective[(result.model, summary.device)]
                final_rows.append({**row, "effective_precision": checked})
    if final_positions:  # each model's and sample's rows together, in layer order
        models = list(dict.fromkeys(record.model for record in records))
        layer_rows.sort(key=lambda row: (models.index(row["model"]), row["sample"],
                                         row["position"]))
    return (pd.DataFrame(final_rows, columns=EQC_COLUMNS + EQC_EXTRA_COLUMNS),
            pd.DataFrame(layer_rows, columns=EQC_LAYER_COLUMNS + EQC_LAYER_EXTRA_COLUMNS))


def precision_rows(records: list[Record], precision: str | None = None,
                   significant: bool = False, workers: int = 1) -> list[dict]:
    """Rows of the remaining-precision table (PRECISION_COLUMNS + PRECISION_EXTRA_COLUMNS).

    ``workers`` > 1 analyses the layers in that many forked processes (each opens the
    records itself and holds one layer over all devices at a time); the rows and their
    order are those of one process.
    """
    tasks = _layer_tasks(records, precision, True, True)
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        tasks = list(tasks)
        if len(tasks) >= 2 * workers:
            rows = _parallel_rows(records, tasks, workers, significant)
            return _checked_rows(rows, precision)
    rows = [_precision_row(_analyse_layer(*task, significant)) for task in tasks]
    return _checked_rows(rows, precision)


def _precision_row(result: LayerResult) -> dict | None:
    if result.precision is None:
        return None
    return {"significant_bits_mean": None, "significant_bits_min": None,
            "significant_bits_reference": None, "not_analysed": None,
            "model": result.model, "sample": result.sample, "layer": result.layer,
            "position": result.position, **result.precision,
            "layer_class": result.layer_class}


def _checked_rows(rows: list, precision) -> list[dict]:
    rows = [row for row in rows if row is not None]
    if not rows and precision is not None:
        raise RecordError(f"no record has precision {precision!r}")
    return rows


_WORKER_RECORDS: dict[str, Record] = {}


def _open_in_worker(records: list[Record]) -> None:
    # Each forked worker opens its own HDF5 handles (the parent's must not cross a fork);
    # the records were validated in the parent.
    _WORKER_RECORDS.update((str(record.path), record.reopened()) for record in records)


def _worker_row(task) -> dict | None:
    model, paths, sample, info, analysed_precision, significant = task
    group = [_WORKER_RECORDS[path] for path in paths]
    return _precision_row(_analyse_layer(model, group, sample, info, analysed_precision,
                                         significant))


def _parallel_rows(records, tasks, workers: int, significant: bool) -> list:
    jobs = [(model, [str(record.path) for record in group], sample, info, analysed,
             significant) for model, group, sample, info, analysed in tasks]
    for record in records:
        record.suspend()  # no HDF5 file open across the fork; reopened on the next read
    context = multiprocessing.get_context("fork")
    with context.Pool(workers, initializer=_open_in_worker, initargs=(records,)) as pool:
        return pool.map(_worker_row, jobs, chunksize=max(1, len(jobs) // (4 * workers)))


def precision_table(records: list[Record], precision: str | None = None,
                    significant: bool = False):
    """The remaining-precision table as a DataFrame."""
    import pandas as pd

    return pd.DataFrame(precision_rows(records, precision, significant),
                        columns=PRECISION_COLUMNS + PRECISION_EXTRA_COLUMNS)
