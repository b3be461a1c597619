import json

import h5py
import ml_dtypes
import numpy as np
import pytest

from bitdrift.atomic import atomic_output
from bitdrift.record.hdf5 import RecordError
from bitdrift.record.reader import Record
from bitdrift.record.writer import write_record
from tests.utils import BASE_ATTRS


def test_round_trip_keeps_dtype_positions_and_fingerprint(tmp_path):
    path = tmp_path / "r.h5"
    layers = [("conv/1", np.ones((2, 4, 4, 3), np.float16)),
              ("dense", np.zeros((2, 10), np.float16))]
    write_record(path, {**BASE_ATTRS, "model": "m", "device": "d", "precision": "float16"},
                 {6: {"output": np.zeros((2, 10), np.float16), "layers": layers,
                      "layer_classes": ["Conv2D", "Dense"]}})
    with Record(path) as record:
        assert record.samples == [6]
        assert record.fingerprint == {"hostname": "test"}
        infos = record.layers(6)
        assert [(i.name, i.position, i.class_name) for i in infos] == [
            ("conv__1", 0, "Conv2D"), ("dense", 1, "Dense"), ("output", 2, "")]
        tensor = record.tensor(6, "conv__1")
        assert tensor.values.dtype == np.float16 and tensor.values.shape == (2, 4, 4, 3)
    with h5py.File(path) as handle:
        assert handle["samples/6/layers/conv__1"].attrs["name"] == "conv/1"
        assert json.loads(handle.attrs["fingerprint"]) == {"hostname": "test"}


def test_bfloat16_is_stored_as_raw_bits(tmp_path):
    path = tmp_path / "bf.h5"
    values = np.array([[1.0, 2.5]], dtype=ml_dtypes.bfloat16)
    write_record(path, {**BASE_ATTRS, "model": "m", "device": "d", "precision": "bfloat16"},
                 {0: {"output": values}})
    with h5py.File(path) as handle:
        assert handle["samples/0/output"].dtype == np.uint16
        assert handle["samples/0/output"].attrs["bfloat16_raw_bits"]
    tensor = Record(path).tensor(0, "output")
    assert tensor.float_format == "bfloat16"
    assert tensor.values.tolist() == values.view(np.uint16).tolist()


def test_missing_attribute_is_named_with_the_file(tmp_path):
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as handle:
        handle.attrs["model"] = "m"
        handle.create_dataset("samples/0/output", data=np.zeros((1, 2), np.float32))
    with pytest.raises(RecordError, match=r"bad\.h5: missing root attribute.*device"):
        Record(path)


def test_corrupt_file_is_rejected_with_its_name(tmp_path):
    path = tmp_path / "corrupt.h5"
    path.write_bytes(b"this is not hdf5")
    with pytest.raises(RecordError, match=r"corrupt\.h5: not a readable HDF5"):
        Record(path)


def test_truncated_file_is_rejected(tmp_path):
    path = tmp_path / "cut.h5"
    write_record(path, {**BASE_ATTRS, "model": "m", "device": "d"},
                 {0: {"output": np.zeros((1, 1000), np.float32)}})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(RecordError, match=r"cut\.h5"):
        Record(path).tensor(0, "output")


def test_output_must_be_float_or_a_quantized_layers_integers(tmp_path):
    path = tmp_path / "int.h5"
    write_record(path, {**BASE_ATTRS, "model": "m", "device": "d"},
                 {0: {"output": np.zeros((1, 3), np.int64)}})
    with pytest.raises(RecordError, match="neither float nor a quantized layer's"):
        Record(path).tensor(0, "output")
    # a quantized layer's codes and accumulators are kept with their own dtype
    for dtype in (np.uint8, np.int8, np.int32):
        values = np.array([[0, 127, 5]], dtype)
        write_record(path, {**BASE_ATTRS, "model": "m", "device": "d"},
                     {0: {"output": values}})
        found = Record(path).tensor(0, "output").values
        assert found.dtype == dtype and found.tolist() == values.tolist()


def test_atomic_output_leaves_nothing_when_interrupted(tmp_path):
    target = tmp_path / "out.h5"
    with pytest.raises(KeyboardInterrupt), atomic_output(target) as tmp:
        tmp.write_bytes(b"half")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def _record_with_layers(path, count):
    rng = np.random.default_rng(1)
    layers = [(f"layer{i}", rng.normal(size=(2, 8)).astype(np.float32)) for i in range(count)]
    layers.append(("output", rng.normal(size=(2, 3)).astype(np.float32)))  # a layer so named
    write_record(path, {**BASE_ATTRS, "model": "m", "device": "d"},
                 {0: {"output": np.ones((2, 3), np.float32), "layers": layers}})
    return dict(layers)


def test_layer_labels_are_those_of_layers_without_reading_attributes(tmp_path):
    _record_with_layers(tmp_path / "r.h5", 3)
    listed = Record(tmp_path / "r.h5").layer_labels(0)
    with Record(tmp_path / "r.h5") as record:
        assert listed == {info.label for info in record.layers(0)}
        assert record.layer_labels(0) == listed
    assert {"layers/output", "output"} <= listed


def test_renewed_handle_reads_the_same_values(tmp_path, monkeypatch):
    # A record renews its HDF5 handle after READS_PER_HANDLE reads (memory bound); the
    # values read across renewals must be the stored ones, every time.
    import bitdrift.record.reader

    stored = _record_with_layers(tmp_path / "r.h5", 5)
    monkeypatch.setattr(bitdrift.record.reader, "READS_PER_HANDLE", 2)
    with Record(tmp_path / "r.h5") as record:
        for _ in range(3):
            for info in record.layers(0):
                values = record.tensor(0, info).values
                expected = np.ones((2, 3), np.float32) if info.final else stored[info.name]
                np.testing.assert_array_equal(values, expected)
        assert record._reads <= 2


def test_reopened_record_reads_on_its_own_handle(tmp_path):
    stored = _record_with_layers(tmp_path / "r.h5", 2)
    record = Record(tmp_path / "r.h5")
    copy = record.reopened()
    record.close()
    assert (copy.device, copy.samples, copy.fingerprint) == ("d", [0], {"hostname": "test"})
    np.testing.assert_array_equal(copy.tensor(0, "layer1").values, stored["layer1"])
    copy.close()
