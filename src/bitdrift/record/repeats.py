"""A repeat's outputs on disk, and their merge into the record.

Each repeat (bitdrift.run.repeat) writes its outputs to a file of its own, an .npz written
one array at a time (RepeatWriter): per output (a layer's position, or DEPLOYED) and
batch, the digests of the batch's rows (digest_key) and the values of the rows it keeps
(batch_key); beside them ``meta`` (JSON: the layers, their outputs' shapes, the
fingerprint, ...), the first repeat's ``argmax`` and the checked layers' ``weights/``.
The file is private to a run: the parent (bitdrift.run.inference) merges the repeats'
files into one record (merge_repeats) a layer at a time, and removes them.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from bitdrift.progress import progress
from bitdrift.record.hdf5 import DEPLOYED, OUTPUT, output_digest
from bitdrift.record.writer import RecordWriter


def batch_key(position: int | str, batch: int) -> str:
    """The key of one batch of one output (a layer's position, or DEPLOYED) in a repeat's
    file: the values of the rows it keeps (RepeatWriter.add_batch)."""
    return f"{position}_batch{batch}"


def digest_key(position: int | str, batch: int) -> str:
    """The key of the digests of one batch's rows of one output."""
    return f"{position}_digests{batch}"


def _raw(values: np.ndarray) -> np.ndarray:
    """bfloat16 as its raw bits (uint16): numpy's files hold no bfloat16."""
    return values.view(np.uint16) if values.dtype.name == "bfloat16" else values


class RepeatWriter:
    """A repeat's outputs as an .npz written one array at a time (numpy.savez's layout:
    np.load reads it, lazily per key), so that the worker need not hold them all."""

    def __init__(self, path: str | Path):
        import zipfile

        self._zip = zipfile.ZipFile(path, "w", allowZip64=True)
        # per output (a layer's position, or DEPLOYED): [shape of one sample's, dtype]
        self.shapes: dict[str, list] = {}

    @property
    def positions(self) -> int:
        """How many outputs (layer positions) were added."""
        return sum(1 for key in self.shapes if key.isdigit())

    def add_batch(self, position: int | str, number: int, values: np.ndarray,
                  samples: list[int], keep: set[int] | None) -> None:
        """One batch of one output: each row's digest (bitdrift.record.hdf5.output_digest), and
        the values of the rows whose sample is in ``keep`` (None: every row)."""
        values = _raw(np.asarray(values))
        float_format = "bfloat16" if values.dtype == np.uint16 else values.dtype.name
        self.shapes.setdefault(str(position), [list(values.shape[1:]), values.dtype.str])
        self.add(digest_key(position, number), np.array(
            [np.frombuffer(output_digest(row, float_format), np.uint8) for row in values],
            np.uint8).reshape(len(values), 32))
        chosen = [row for row, sample in enumerate(samples) if keep is None or sample in keep]
        self.add(batch_key(position, number), values[chosen])

    def add(self, key: str, value: np.ndarray) -> None:
        with self._zip.open(f"{key}.npy", "w", force_zip64=True) as handle:
            np.lib.format.write_array(handle, _raw(np.asanyarray(value)), allow_pickle=False)

    def close(self) -> None:
        self._zip.close()


def merge_repeats(writer: RecordWriter, files: list, meta: dict, samples: list[int],
                  full: list[int], selected: set[int], batch_size: int, deployed: bool,
                  traced: Path | None, traced_batches: list[int] | None = None) -> bool:
    """The repeats' files merged into the record a layer at a time: per layer, each
    repeat's batches read in turn (np.load reads one key at a time) and each sample's row
    added to its tensor, which keeps a repeat identical to one already written as its
    digest only. Memory: one batch of one layer. Returns whether the traced repeat's
    outputs equal the measured majority bit for bit (True without a traced repeat), on
    its batches (``traced_batches``; None: every batch)."""
    bfloat16 = bool(meta["bfloat16"])
    layer_entries = meta["layers"]
    last = meta["outputs"] - 1
    keep = set(full)
    match = True
    with contextlib.ExitStack() as stack:
        repeats = [stack.enter_context(np.load(path)) for path in files]
        traced_data = stack.enter_context(np.load(traced)) if traced else None

        def rows(data, position, numbers=None):
            """(row, digest, values or None where the repeat kept the digest only)."""
            for number in range(meta["batches"]) if numbers is None else numbers:
                digests, values = data[digest_key(position, number)], \
                    data[batch_key(position, number)]
                kept = iter(values)
                for offset, digest in enumerate(digests):
                    row = number * batch_size + offset
                    whole = position in (last, DEPLOYED) or samples[row] in keep
                    yield row, digest.tobytes(), next(kept) if whole else None
                del values

        outputs = [(position, position in selected) for position in range(last + 1)
                   if position in selected or position == last]
        if deployed:
            outputs.append((DEPLOYED, False))
        for position, is_layer in progress(outputs, "layers merged"):
            tensors: list[list] = [[] for _ in samples]
            for row, sample in enumerate(samples):
                if is_layer:
                    name, layer_class = layer_entries[position]
                    tensors[row].append(writer.tensor(sample, name, position=position,
                                                      class_name=layer_class,
                                                      values=sample in keep,
                                                      bfloat16=bfloat16))
                if position == last:
                    tensors[row].append(writer.tensor(sample, OUTPUT, final=True,
                                                      bfloat16=bfloat16))
                elif position == DEPLOYED:
                    tensors[row].append(writer.tensor(sample, DEPLOYED, final=True,
                                                      bfloat16=bfloat16))
            shape, dtype = meta["shapes"][str(position)]
            for data in repeats:
                for row, digest, values in rows(data, position):
                    for tensor in tensors[row]:
                        if values is None:
                            tensor.add_digest(digest, shape, dtype)
                        else:
                            tensor.add(values)
            if traced_data is not None and position != DEPLOYED:
                for row, digest, _ in rows(traced_data, position, traced_batches):
                    # the majority of the measured repeats, a tie to the first seen
                    majority = Counter(tensors[row][0].digests).most_common(1)[0][0]
                    match = match and majority == digest
            for found in tensors:
                for tensor in found:
                    tensor.close()
    return match


class FirstRepeats(Mapping):
    """{layer: repeat 0 of every full sample, stacked}, each read from the record being
    written when asked (the replay takes a layer and its input at a time)."""

    def __init__(self, writer: RecordWriter, names: list[str], samples: list[int]):
        self._writer, self._names, self._samples = writer, names, samples

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(name)
        return np.stack([self._writer.read(sample, name).values[0]
                         for sample in self._samples])

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)
