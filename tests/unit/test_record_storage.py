"""Record format 4: distinct repeats stored once, digests, compression, digests-only
samples, bounded memory and a full disk; format 1-3 records still read."""

import hashlib
import sys
import tracemalloc

import h5py
import ml_dtypes
import numpy as np
import pytest

from bitdrift.analysis.eqc import eqc_tables
from bitdrift.record.hdf5 import DigestOnly, RecordError
from bitdrift.record.reader import Record, open_records
from bitdrift.record.repeats import RepeatWriter, batch_key, merge_repeats
from bitdrift.record.writer import RecordWriter, write_record
from tests.utils import BASE_ATTRS, on_mounts

ATTRS = {**BASE_ATTRS, "model": "m", "device": "d"}


def sha256(values: np.ndarray, float_format: str) -> bytes:
    """The digest as docs/record-format.md states it, computed here by hand."""
    return hashlib.sha256(f"{float_format}:{values.shape}:".encode() + values.tobytes()).digest()


def random_bits(shape, dtype, seed=0) -> np.ndarray:
    """Every bit pattern of the format is possible: NaNs with payloads, -0.0, subnormals."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(np.random.default_rng(seed).bytes(size), dtype).reshape(shape)


def test_identical_repeats_stored_once_and_read_back_as_every_repeat(tmp_path):
    first = np.random.default_rng(1).standard_normal((8, 8, 4)).astype(np.float32)
    other = first.copy()
    other[3, 3, 1] = np.nextafter(other[3, 3, 1], np.float32(np.inf))  # one ulp: differs
    layer = np.stack([first, first, other, first, other])
    path = tmp_path / "r.h5"
    write_record(path, ATTRS, {0: {"output": layer[:, 0, 0], "layers": [("conv", layer)]}})
    with h5py.File(path) as handle:  # the layout, read without bitdrift
        dataset = handle["samples/0/layers/conv"]
        assert dataset.shape == (2, 8, 8, 4)  # the first repeat and the one differing
        assert dataset.attrs["repeat_digest"].tolist() == [0, 0, 1, 0, 1]
        assert bytes(dataset.attrs["sha256"][1]) == sha256(other, "float32")
        assert dataset.compression == "gzip" and dataset.shuffle and dataset.fletcher32
        assert handle.attrs["format_version"] == 4
    with Record(path) as record:
        values = record.tensor(0, "conv").values
        assert values.shape == layer.shape and values.tobytes() == layer.tobytes()
        assert record.digests(0, "conv") == [sha256(repeat, "float32") for repeat in layer]
        assert record.has_values(0, "conv")


def test_identical_repeats_take_the_room_of_one(tmp_path):
    layer = np.random.default_rng(2).standard_normal((64, 64, 8)).astype(np.float32)
    sizes = {}
    for repeats in (1, 10):
        path = tmp_path / f"r{repeats}.h5"
        write_record(path, ATTRS, {0: {"output": np.stack([layer[0, 0]] * repeats),
                                       "layers": [("conv", np.stack([layer] * repeats))]}})
        sizes[repeats] = path.stat().st_size
    assert sizes[10] < 1.05 * sizes[1]
    assert sizes[10] < 0.2 * 10 * layer.nbytes  # what format 3 stored


@pytest.mark.parametrize("float_format", ["float16", "float32", "float64", "bfloat16"])
def test_compression_is_lossless_bit_for_bit(tmp_path, float_format):
    raw = {"float16": np.float16, "float32": np.float32, "float64": np.float64,
           "bfloat16": np.uint16}[float_format]
    bits = random_bits((3, 5, 7, 6), raw, seed=3)
    values = bits.view(ml_dtypes.bfloat16) if float_format == "bfloat16" else bits
    path = tmp_path / "r.h5"
    write_record(path, ATTRS, {0: {"output": values[:, 0, 0], "layers": [("x", values)]}})
    with Record(path) as record:
        tensor = record.tensor(0, "x")
        assert tensor.float_format == float_format
        assert tensor.values.dtype == raw and tensor.values.tobytes() == bits.tobytes()
        assert record.digests(0, "x") == [sha256(repeat, float_format) for repeat in bits]


def test_samples_outside_full_samples_keep_digests_and_their_output(tmp_path):
    rng = np.random.default_rng(4)
    samples = {index: {"output": rng.standard_normal((2, 10)).astype(np.float32),
                       "layers": [("dense", rng.standard_normal((2, 16)).astype(np.float32))]}
               for index in (0, 1, 6)}
    path = tmp_path / "r.h5"
    write_record(path, ATTRS, samples, full_samples=[6])
    with h5py.File(path) as handle:
        assert handle["samples/0/layers/dense"].shape == (0, 16)
        assert handle["samples/6/layers/dense"].shape == (2, 16)
    with Record(path) as record:
        assert not record.has_values(0, "dense") and record.has_values(6, "dense")
        with pytest.raises(DigestOnly, match=r"r\.h5: /samples/0/layers/dense holds the "
                                             "digests of its values only"):
            record.tensor(0, "dense")
        assert record.digests(1, "dense") == [sha256(row, "float32")
                                              for row in samples[1]["layers"][0][1]]
        assert record.tensor(1, "output").values.tobytes() == samples[1]["output"].tobytes()


def test_per_layer_classes_from_digests_equal_those_from_values(tmp_path, capsys):
    """Two devices that differ in one layer of sample 1: the classes read from the
    digests of a record without sample 1's values are those of the full records."""
    rng = np.random.default_rng(5)
    base = {index: {"output": np.repeat(rng.standard_normal((1, 10)).astype(np.float32), 2, 0),
                    "layers": [("dense", np.repeat(rng.standard_normal((1, 16))
                                                   .astype(np.float32), 2, 0))]}
            for index in (0, 1)}
    changed = {index: {"output": content["output"],
                       "layers": [("dense", content["layers"][0][1].copy())]}
               for index, content in base.items()}
    changed[1]["layers"][0][1][1, 4] += 1  # device b: its second repeat differs in sample 1
    tables = {}
    for full in (None, [0]):
        paths = []
        for device, samples in (("a", base), ("b", changed)):
            paths.append(tmp_path / f"{device}{full}.h5")
            write_record(paths[-1], {**ATTRS, "device": device}, samples, full_samples=full)
        records = open_records(paths)
        tables[str(full)] = eqc_tables(records)[1]
        for record in records:
            record.close()
    assert "layers recorded as digests only on a, b" in capsys.readouterr().err
    layer = tables["[0]"].query("sample == 1 and layer == 'dense'")
    assert layer["eqc"].tolist() == [1, 1]  # the majority (first among ties) is equal
    assert layer["deterministic"].tolist() == [True, False]
    assert tables["[0]"].equals(tables["None"])


def test_a_record_of_format_3_is_read_as_before(tmp_path):
    """The layout of format 3, written with h5py directly: every repeat in full."""
    path = tmp_path / "old.h5"
    layer = np.random.default_rng(6).standard_normal((3, 4, 4, 2)).astype(np.float16)
    output = np.random.default_rng(7).standard_normal((3, 10)).astype(np.float16)
    with h5py.File(path, "w") as handle:
        for key, value in {**ATTRS, "fingerprint": "{}", "format_version": 3}.items():
            handle.attrs[key] = value
        handle.create_dataset("samples/2/output", data=output, fletcher32=True)
        dataset = handle.create_dataset("samples/2/layers/conv", data=layer, fletcher32=True)
        dataset.attrs["position"] = 0
    with Record(path) as record:
        assert record.samples == [2] and record.value_samples == [2]
        assert record.tensor(2, "conv").values.tobytes() == layer.tobytes()
        assert record.has_values(2, "conv")
        assert record.digests(2, "output") == [sha256(row, "float16") for row in output]


def test_digest_attributes_that_do_not_fit_the_rows_are_refused(tmp_path):
    path = tmp_path / "r.h5"
    write_record(path, ATTRS, {0: {"output": np.zeros((2, 3), np.float32)}})
    with h5py.File(path, "r+") as handle:
        handle["samples/0/output"].attrs["repeat_digest"] = np.array([0, 5], np.int32)
    with pytest.raises(RecordError, match="do not describe its 1 rows"):
        Record(path).tensor(0, "output")


def test_writing_a_record_holds_one_layer_in_memory(tmp_path):
    """A record of 24 layers of 1 MiB each, written through RecordWriter: Python's peak
    allocation stays near one layer, far below the record."""
    layer_bytes = 1 << 20
    tracemalloc.start()
    try:
        with RecordWriter(tmp_path / "big.h5") as writer:
            writer.set_attrs(ATTRS)
            for position in range(24):
                values = np.random.default_rng(position).standard_normal(
                    layer_bytes // 4).astype(np.float32)
                tensor = writer.tensor(0, f"layer{position}", position=position)
                for _ in range(3):
                    tensor.add(values)
                tensor.close()
                del values
            output = writer.tensor(0, "output", final=True)
            output.add(np.zeros(10, np.float32))
            output.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * layer_bytes, peak
    with Record(tmp_path / "big.h5") as record:
        assert record.tensor(0, "layer23").values.shape == (3, layer_bytes // 4)


def test_merging_repeats_holds_one_batch_of_one_layer(tmp_path):
    """The parent's merge of the repeats' files (bitdrift.record.repeats.merge_repeats): 3
    repeats x 4 samples x 12 layers of 512 KiB per sample, read back equal to the
    repeats' values; Python's peak allocation stays near one batch of one layer. Sample 2
    is outside full_samples: its repeats' files hold its layers' digests only."""
    samples, full, batch, positions, repeats = [5, 1, 7, 2], [5, 1, 7], 2, 12, 3
    row_bytes = 512 << 10

    def values(position, sample, repeat):
        seed = position * 100 + sample + (repeat if position == 4 else 0)  # layer 4 varies
        return np.random.default_rng(seed).standard_normal(row_bytes // 4).astype(np.float32)

    files = []
    for repeat in range(repeats):
        files.append(tmp_path / f"repeat{repeat}.npz")
        out = RepeatWriter(files[-1])
        for position in range(positions):
            for number in range(len(samples) // batch):
                names = samples[number * batch:(number + 1) * batch]
                out.add_batch(position, number, np.stack([
                    values(position, sample, repeat) for sample in names]), names,
                    None if position == positions - 1 else set(full))
        shapes = out.shapes
        out.close()
    with np.load(files[0]) as data:  # sample 2 is the second row of batch 1
        assert data[batch_key(0, 1)].shape == (1, row_bytes // 4)
    meta = {"bfloat16": False, "outputs": positions, "batches": len(samples) // batch,
            "layers": [[f"layer{p}", "Dense"] for p in range(positions)], "shapes": shapes}
    tracemalloc.start()
    try:
        with RecordWriter(tmp_path / "r.h5") as writer:
            writer.set_attrs(ATTRS)
            assert merge_repeats(writer, files, meta, samples, full, set(range(positions)),
                                 batch, False, None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * batch * row_bytes, peak  # the record's values: 96 x that
    with Record(tmp_path / "r.h5") as record:
        for sample in samples:
            for position in (0, 4, 11):
                truth = np.stack([values(position, sample, r) for r in range(repeats)])
                assert record.digests(sample, f"layer{position}") == [
                    sha256(repeat, "float32") for repeat in truth]
                if sample in full or position == 11:
                    info = record.layers(sample)[-1] if position == 11 else f"layer{position}"
                    stored = record.tensor(sample, info).values
                    assert stored.tobytes() == truth.tobytes()
        assert not record.has_values(2, "layer0")
    with h5py.File(tmp_path / "r.h5") as handle:
        assert handle["samples/7/layers/layer0"].shape[0] == 1
        assert handle["samples/7/layers/layer4"].shape[0] == 3
        assert handle["samples/2/layers/layer4"].shape == (0, row_bytes // 4)


def test_a_record_stopped_between_layers_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt), RecordWriter(tmp_path / "r.h5") as writer:
        writer.set_attrs(ATTRS)
        tensor = writer.tensor(0, "layer", position=0)
        tensor.add(np.ones(100, np.float32))
        tensor.close()
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


WRITE_BIG = """
import sys, numpy as np
from bitdrift.errors import BitdriftError
from bitdrift.record.writer import write_record
from tests.utils import BASE_ATTRS
layers = [(f"l{i}", np.random.default_rng(i).standard_normal((2, 65536)).astype(np.float32))
          for i in range(8)]
try:
    write_record(sys.argv[1], {**BASE_ATTRS, "model": "m", "device": "d"},
                 {0: {"output": np.zeros((2, 10), np.float32), "layers": layers}})
except BitdriftError as error:
    print(error, file=sys.stderr)
    sys.exit(6)
"""


def test_a_disk_that_fills_while_writing_is_one_line_and_leaves_no_record(tmp_path):
    """A 256 KiB disk and a record of ~4 MiB: h5py crashed tearing down a file whose
    write failed (exit 139, dozens of tracebacks); the writer says it in one line."""
    disk = tmp_path / "disk"
    done = on_mounts({disk: "size=256k"}, [sys.executable, "-c", WRITE_BIG, disk / "r.h5"])
    assert done["status"] == 6, done
    lines = done["stderr"].strip().splitlines()
    assert lines == [f"{disk / 'r.h5'}: cannot be written (No space left on device); no "
                     "record was left"], done["stderr"]
    assert done["left"][str(disk)] == []


def test_writer_refuses_a_record_without_its_attributes(tmp_path):
    with pytest.raises(RecordError, match="missing attributes"), \
            RecordWriter(tmp_path / "r.h5") as writer:
        writer.set_attrs({"model": "m"})
    assert list(tmp_path.iterdir()) == []


def test_divergence_of_digest_only_samples_names_the_layer_without_a_precision(tmp_path):
    """Two devices whose final outputs and one layer differ in sample 1, recorded with
    sample 1's layers as digests only: the divergence table still names the first
    parting layer (from the digests), and leaves its remaining precision empty, while
    sample 0 (values kept) gets a number equal to numpy's count of the shared bits."""
    from bitdrift.analysis.divergence import divergence_table

    rng = np.random.default_rng(9)
    base = {index: {"output": np.repeat(rng.standard_normal((1, 10)).astype(np.float32), 2, 0),
                    "layers": [("conv", np.repeat(rng.standard_normal((1, 8))
                                                  .astype(np.float32), 2, 0)),
                               ("dense", np.repeat(rng.standard_normal((1, 16))
                                                   .astype(np.float32), 2, 0))],
                    "layer_classes": ["Conv2D", "Dense"]}
            for index in (0, 1)}
    changed = {index: {"output": content["output"].copy(),
                       "layers": [(name, values.copy()) for name, values in content["layers"]],
                       "layer_classes": content["layer_classes"]}
               for index, content in base.items()}
    for index in (0, 1):  # device b parts at dense in both samples, both repeats
        changed[index]["layers"][1][1][:, 3] = np.nextafter(
            changed[index]["layers"][1][1][:, 3], np.float32(np.inf))
        changed[index]["output"][:, 0] += 1
    paths = [tmp_path / "a.h5", tmp_path / "b.h5"]
    for path, (device, samples) in zip(paths, (("a", base), ("b", changed)), strict=True):
        write_record(path, {**ATTRS, "device": device}, samples, full_samples=[0])
    records = open_records(paths)
    table = divergence_table(records)
    for record in records:
        record.close()
    parted = table[table["class_a"] != table["class_b"]].set_index("sample")
    assert parted.loc[0, "first_layer"] == parted.loc[1, "first_layer"] == "dense"
    a = base[0]["layers"][1][1][0]
    b = changed[0]["layers"][1][1][0]
    differing = int(np.max(a.view(np.uint32) ^ b.view(np.uint32))).bit_length()
    assert parted.loc[0, "remaining_precision_at_first"] == 23 - differing
    assert np.isnan(parted.loc[1, "remaining_precision_at_first"])
