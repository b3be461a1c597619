"""benchmarks/compression.py on a small real record: the bytes it counts against numpy and
zlib's, and its round-trip check refusing a codec that is not lossless."""

import csv
import importlib.util
import sys
import zlib

import numpy as np
import pytest

from bitdrift.record.writer import write_record
from tests.utils import BASE_ATTRS, ROOT

SPEC = importlib.util.spec_from_file_location("benchmark_compression",
                                              ROOT / "benchmarks" / "compression.py")
compression = sys.modules[SPEC.name] = importlib.util.module_from_spec(SPEC)  # its dataclasses
SPEC.loader.exec_module(compression)
# HDF5's Fletcher-32 filter appends its checksum to each chunk.
CHECKSUM_BYTES = 4


def _layers() -> list[tuple[str, np.ndarray]]:
    """Two identical repeats of a convolution's output and of its ReLU (half zeros)."""
    rng = np.random.default_rng(7)
    conv = rng.standard_normal((6, 6, 8)).astype(np.float32)
    return [("conv", np.stack([conv, conv])), ("relu", np.stack([np.maximum(conv, 0)] * 2))]


@pytest.fixture
def record(tmp_path):
    """A format-4 record: sample 0 keeps its layers' values, sample 1 their digests only."""
    path = tmp_path / "record.h5"
    layers = _layers()
    output = np.zeros((2, 10), np.float32)
    write_record(path, {**BASE_ATTRS, "model": "m", "device": "d"},
                 {index: {"output": output, "layers": layers,
                          "layer_classes": ["Conv2D", "Activation"]} for index in (0, 1)},
                 full_samples=[0])
    return path


def _shuffled(values: np.ndarray) -> bytes:
    """HDF5's byte shuffle: the first byte of every value, then the second, ..."""
    return values.view(np.uint8).reshape(-1, values.itemsize).T.tobytes()


def test_bytes_counted_match_numpy_and_zlib(record, tmp_path, capsys):
    table = tmp_path / "compression.csv"
    compression.main([str(record), "--csv", str(table)])  # every codec: each reads back
    rows = {row["codec"]: row for row in csv.DictReader(table.open())}
    assert list(rows) == list(compression.codecs())
    # One distinct repeat per layer, sample 0 only (sample 1 holds digests).
    distinct = [values[0] for _, values in _layers()]
    raw = sum(values.nbytes for values in distinct)
    assert {int(row["raw_bytes"]) for row in rows.values()} == {raw}
    assert int(rows["none"]["stored_bytes"]) == raw + CHECKSUM_BYTES * len(distinct)
    assert int(rows["shuffle+gzip-1"]["stored_bytes"]) == sum(
        len(zlib.compress(_shuffled(values), 1)) + CHECKSUM_BYTES for values in distinct)
    by_class = {(row["layer_class"], row["codec"]): row for row in
                csv.DictReader((tmp_path / "compression_by_class.csv").open())}
    relu = distinct[1]
    assert float(by_class["Activation", "none"]["zero_share"]) == \
        round(np.count_nonzero(relu == 0) / relu.size, 4)
    assert "+0.000%" in capsys.readouterr().out  # the sanity line: the record's own bytes


def test_a_codec_that_is_not_lossless_is_refused(record, tmp_path):
    # HDF5's scale-offset filter keeps 2 decimal digits of a float: lossy.
    with pytest.raises(SystemExit, match=r"scaleoffset-2: .*/samples/0/layers/conv read "
                                         "back differs .* not lossless"):
        compression.measure(compression.record_layers([str(record)]),
                            {"scaleoffset-2": {"scaleoffset": 2}}, tmp_path)
