"""Identify at atlas scale: an index of output digests, built once from many records.

``bitdrift identify --against`` reads every known record for every query. An atlas of
thousands of records (every machine a lab has measured) is indexed instead: per (model
digest, input digest, sample, layer, float format) the index holds each record's output
digest (SHA-256 of format, shape and bytes; the majority of its repeats, as the classes
use) and its output's raw bits in one matrix. An exact match is then a dictionary look-up
per sample, and the nearest records by remaining precision one vectorised XOR over the
matrix. Records of different model digests (or inputs) are under different keys: a query
is never matched across models.

The index is an HDF5 file (``bitdrift index RECORDS --out atlas.h5``), written atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from bitdrift.errors import RecordError
from bitdrift.record.hdf5 import OUTPUT, output_digest
from bitdrift.record.reader import Record

INDEX_FORMAT = 1


@dataclass
class Entry:
    """One key's records: row i is record ``records[i]``."""

    records: np.ndarray  # indices into Index.labels
    digests: list[bytes]
    bits: np.ndarray  # (rows, elements) raw bits as unsigned integers
    lookup: dict[bytes, list[int]] = field(init=False)  # digest -> rows

    def __post_init__(self):
        self.lookup = {}
        for row, digest in enumerate(self.digests):
            self.lookup.setdefault(digest, []).append(row)


def _indexed(record: Record, sample: int, layer: str) -> tuple[tuple, np.ndarray, str]:
    """The index key of one record's tensor, its representative (the majority of its
    repeats, as the classes use) and its float format."""
    from bitdrift.analysis.eqc import summarize_repeats

    tensor = record.tensor(sample, layer)
    float_format = tensor.float_format
    _, representative = summarize_repeats(record.device, tensor.values, float_format)
    key = (record.attr("model_sha256"), record.attr("input_sha256"), int(sample),
           float_format, tuple(representative.shape))
    return key, representative, float_format


@dataclass
class Match:
    matched: bool
    records: list[str]  # labels of the matched (or nearest) records
    remaining_precision: float  # of the query against them (matched: the full mantissa)
    keys: int  # samples compared


class Index:
    """An atlas index in memory."""

    def __init__(self, labels: list[str], layer: str, entries: dict[tuple, Entry]):
        self.labels, self.layer, self.entries = labels, layer, entries

    @classmethod
    def build(cls, records: list[Record], layer: str = OUTPUT) -> Index:
        from bitdrift.analysis.remaining_precision import integer_view

        labels, rows = [], {}
        for number, record in enumerate(records):
            labels.append(f"{record.device} ({record.path})")
            for sample in record.samples:
                key, representative, float_format = _indexed(record, sample, layer)
                rows.setdefault(key, []).append(
                    (number, output_digest(representative, float_format),
                     integer_view(representative, float_format).ravel()))
        entries = {key: Entry(np.array([number for number, _, _ in found]),
                              [digest for _, digest, _ in found],
                              np.stack([bits for _, _, bits in found]))
                   for key, found in rows.items()}
        return cls(labels, layer, entries)

    def write(self, path: str | Path) -> None:
        import io

        from bitdrift.atomic import write_bytes

        # Built in memory, written in one plain write: on a full disk h5py's own file
        # handling crashed the process (segmentation fault in its object teardown)
        buffer = io.BytesIO()
        with h5py.File(buffer, "w") as handle:
            handle.attrs.update({"format": INDEX_FORMAT, "layer": self.layer,
                                 "labels": json.dumps(self.labels)})
            for number, (key, entry) in enumerate(self.entries.items()):
                group = handle.create_group(f"entries/{number}")
                group.attrs["key"] = json.dumps(list(key))
                group.create_dataset("records", data=entry.records)
                group.create_dataset("digests", data=np.frombuffer(b"".join(entry.digests),
                                                                    np.uint8).reshape(-1, 32))
                group.create_dataset("bits", data=entry.bits)
        write_bytes(path, buffer.getvalue())

    @classmethod
    def read(cls, path: str | Path) -> Index:
        try:
            with h5py.File(path, "r") as handle:
                if handle.attrs.get("format") != INDEX_FORMAT:
                    raise RecordError(f"{path}: not a bitdrift atlas index of format "
                                      f"{INDEX_FORMAT}")
                labels = json.loads(handle.attrs["labels"])
                if not isinstance(labels, list) or not all(isinstance(label, str)
                                                           for label in labels):
                    raise ValueError("attribute 'labels' is not a list of record names")
                layer = str(handle.attrs["layer"])
                entries = {}
                for group in handle["entries"].values():
                    key = json.loads(group.attrs["key"])
                    if not isinstance(key, list) or len(key) != 5 or \
                            not isinstance(key[4], list):
                        raise ValueError(f"entries/{group.name.rsplit('/', 1)[-1]}: "
                                         "attribute 'key' is not [model, inputs, sample, "
                                         "format, shape]")
                    key = (key[0], key[1], int(key[2]), key[3], tuple(key[4]))
                    entries[key] = Entry(group["records"][()],
                                         [bytes(row) for row in group["digests"][()]],
                                         group["bits"][()])
        except (OSError, KeyError, ValueError, TypeError) as error:
            raise RecordError(f"{path}: not a readable atlas index ({error})") from error
        return cls(labels, layer, entries)

    def identify(self, query: Record) -> Match:
        """The indexed records whose outputs equal the query's bitwise on every sample it
        shares with the index; else those nearest by remaining precision (all tied)."""
        from bitdrift.analysis.remaining_precision import MANTISSA_BITS, bit_length, integer_view

        candidates: set[int] | None = None
        dropped = np.zeros(len(self.labels), dtype=np.int64)
        present = np.zeros(len(self.labels), dtype=np.int64)  # keys a record is under
        compared, mantissa = 0, None
        models = {key[0] for key in self.entries}
        if query.attr("model_sha256") not in models:
            raise RecordError(f"{query.path}: its model digest "
                              f"{query.attr('model_sha256')[:12]}... is not in the index "
                              f"({len(models)} model digest(s)); it is never matched across "
                              "models")
        for sample in query.samples:
            key, representative, float_format = _indexed(query, sample, self.layer)
            entry = self.entries.get(key)
            if entry is None:
                continue
            compared += 1
            mantissa = MANTISSA_BITS[float_format]
            rows = entry.lookup.get(output_digest(representative, float_format), [])
            matching = {int(entry.records[row]) for row in rows}
            candidates = matching if candidates is None else candidates & matching
            bits = integer_view(representative, float_format).ravel()
            per_row = bit_length(np.bitwise_xor(entry.bits, bits)).max(axis=1) \
                if bits.size else np.zeros(len(entry.records), dtype=np.int64)
            np.maximum.at(dropped, entry.records, per_row)
            present[entry.records] += 1
        if not compared:
            raise RecordError(f"{query.path}: the index holds no output of its model and "
                              "inputs in its float format (same samples)")
        if candidates:
            return Match(True, [self.labels[i] for i in sorted(candidates)], float(mantissa),
                         compared)
        # Only records indexed under every key the query was compared on are candidates.
        dropped = np.where(present == compared, dropped, np.iinfo(np.int64).max)
        if not (present == compared).any():
            raise RecordError(f"{query.path}: no indexed record has all of its "
                              f"{compared} compared samples")
        best = int(dropped.min())
        nearest = [self.labels[i] for i in np.flatnonzero(dropped == best)]
        return Match(False, nearest, float(max(mantissa - best, 0)), compared)
