"""The analyses that read whole records stream them: their peak memory (tracemalloc, which
sees every numpy buffer h5py reads into) stays within a few layers over all devices, far
below the records' size, and their results equal a numpy truth read from the files with
h5py directly."""

import tracemalloc

import h5py
import numpy as np
import pytest

from bitdrift.record.reader import open_records

DEVICES, SAMPLES, LAYERS, REPEATS, ELEMENTS = 4, 2, 12, 2, 32768
# The layer where device d first differs from device 0 (None: never): its own bit flip
PARTS = {1: 3, 2: 7, 3: None}
LAYER_BYTES = DEVICES * REPEATS * ELEMENTS * 4  # one layer over all devices, all repeats
# every value the records hand out (on disk less: repeats stored once, compressed)
VALUES_BYTES = DEVICES * SAMPLES * LAYERS * REPEATS * ELEMENTS * 4


@pytest.fixture
def big_records(make_record):
    """Records of DEVICES devices, each of SAMPLES x LAYERS layers of ELEMENTS float32
    values (repeats identical); device d flips a low mantissa bit from layer PARTS[d] on."""
    rng = np.random.default_rng(0)
    base = {(sample, layer): rng.normal(size=ELEMENTS).astype(np.float32)
            for sample in range(SAMPLES) for layer in range(LAYERS)}
    files = []
    for device in range(DEVICES):
        layers, outputs = {}, {}
        for sample in range(SAMPLES):
            named = []
            for layer in range(LAYERS):
                values = base[(sample, layer)].copy()
                part = PARTS.get(device)
                if part is not None and layer >= part:
                    bits = values.view(np.uint32)
                    bits[device * 11] ^= np.uint32(1 << (device - 1))  # bit d-1 of one value
                named.append((f"layer{layer:02d}", np.stack([values] * REPEATS)))
            layers[sample] = named
            output = np.arange(10, dtype=np.float32) + (device in (1, 2))  # two classes
            outputs[sample] = np.stack([output] * REPEATS)
        files.append(make_record(f"d{device}", outputs, layers=layers))
    # the records hold far more than one layer (as values read; the files, storing
    # identical repeats once and compressed, are smaller on disk)
    assert VALUES_BYTES > 20 * LAYER_BYTES
    return files


def peak_of(function, *args, **kwargs):
    function(*args, **kwargs)  # once first: what it imports is not counted
    tracemalloc.start()
    try:
        result = function(*args, **kwargs)
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def truth_first_part(files, device_a: int, device_b: int, sample: int):
    """(first layer where two records' repeat 0 differ, the bits they still share there),
    from the HDF5 files with numpy alone."""
    with h5py.File(files[device_a], "r") as a, h5py.File(files[device_b], "r") as b:
        group_a, group_b = a[f"samples/{sample}/layers"], b[f"samples/{sample}/layers"]
        names = sorted(group_a, key=lambda name: group_a[name].attrs["position"])
        for name in names:
            xor = group_a[name][0].view(np.uint32) ^ group_b[name][0].view(np.uint32)
            if xor.any():
                return name, 23 - int(xor.max()).bit_length()
    return "", None


def test_divergence_streams_one_layer_at_a_time(big_records):
    from bitdrift.analysis.divergence import divergence_table

    records = open_records(big_records)
    table, peak = peak_of(divergence_table, records)
    # keeping every layer's outputs (as it did) holds LAYERS x SAMPLES of them
    assert peak < 4 * LAYER_BYTES, peak
    checked = 0
    for row in table.itertuples():
        a, b = int(row.device_a[1:]), int(row.device_b[1:])
        layer, remaining = truth_first_part(big_records, a, b, row.sample)
        assert (row.first_layer or "") == layer, row
        if layer:
            assert row.remaining_precision_at_first == remaining
            checked += 1
    assert checked >= 4  # d0-d1 and d0-d2 on both samples at least


def test_remaining_precision_rows_stream(big_records):
    """The ablation tables' rows (precision_rows, which ablation_layers and
    precision_casting read): per layer the classes and remaining precision, each layer
    read once over all devices and let go."""
    from bitdrift.analysis.eqc import precision_rows

    records = open_records(big_records)
    rows, peak = peak_of(precision_rows, records, "float32", significant=True)
    # the significant bits work on float64 copies of one layer over the devices
    assert peak < 8 * LAYER_BYTES < VALUES_BYTES / 2, peak
    assert len(rows) == SAMPLES * (LAYERS + 1)
    for row in rows:
        if row["layer"] == "output":
            continue
        arrays = []
        for path in big_records:
            with h5py.File(path, "r") as handle:
                arrays.append(handle[f"samples/{row['sample']}/layers/{row['layer']}"][0])
        bits = np.stack(arrays).view(np.uint32)
        assert row["n_eqc"] == len({bytes(line) for line in bits.view(np.uint8)})
        differing = np.bitwise_or.reduce(bits ^ bits[0], axis=0)
        assert row["remaining_precision"] == 23 - int(differing.max()).bit_length()


# -- the export reference ---------------------------------------------------------------------
CONVS, FILTERS, SIDE, TEST_IMAGES = 6, 64, 32, 96
PER_IMAGE = CONVS * SIDE * SIDE * FILTERS * 4  # every Conv2D layer's output of one image
REFERENCE_CODE = f"""
import json, resource, sys
import keras, numpy as np
from bitdrift.backends.keras import export
from bitdrift.inputs.datasets import read_test_images
from bitdrift.inputs.models import layer_probe

model_path, dataset, out, batch_bytes, check_bytes = sys.argv[1:6]
keras.utils.set_random_seed(0)
x = inputs = keras.Input((32, 32, 3))
for _ in range({CONVS}):
    x = keras.layers.Conv2D({FILTERS}, 3, padding="same", activation="relu")(x)
x = keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(x))
keras.Model(inputs, x).save(model_path)
model = keras.saving.load_model(model_path)
probe, _ = layer_probe(keras, model)
images = read_test_images(dataset, list(range({TEST_IMAGES}))).astype("float32")
# the truth, computed apart: every layer on the check images, and the classes
truth = [keras.ops.convert_to_numpy(v) for v in probe(images[:export.CHECK_IMAGES])]
classes = np.concatenate([np.argmax(keras.ops.convert_to_numpy(model(images[i:i + 8])), -1)
                          for i in range(0, len(images), 8)])
np.savez(out + ".truth.npz", classes=classes, *truth)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
export.REFERENCE_BATCH_BYTES, export.CHECK_BYTES = int(batch_bytes), int(check_bytes)
export.CHECK_FLOOR = 1
export.write_reference(model_path, dataset, out)
print(json.dumps({{"grew": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
                  * 1024}}))
"""


def write_reference_in_tensorflow(tmp_path, batch_bytes: int, check_bytes: int):
    """A model of CONVS 32x32x64 Conv2D layers, its reference written by
    bitdrift.backends.keras.export in a TensorFlow process; (how much its peak RSS grew while
    writing it,
    the reference's path, the truth computed there by Keras apart from it)."""
    import json
    import os
    import subprocess
    import sys

    from bitdrift.inputs.datasets import prepare_dataset

    dataset = tmp_path / "digits.h5"
    prepare_dataset("digits", {"source": "digits", "limit_train": 8,
                               "limit_test": TEST_IMAGES}, dataset)
    out = tmp_path / "reference.npz"
    said = subprocess.run(
        [sys.executable, "-c", REFERENCE_CODE, str(tmp_path / "convs.keras"), str(dataset),
         str(out), str(batch_bytes), str(check_bytes)], check=True, capture_output=True,
        text=True, env={**os.environ, "KERAS_BACKEND": "tensorflow",
                        "TF_CPP_MIN_LOG_LEVEL": "3"})
    grew = json.loads(said.stdout.strip().splitlines()[-1])["grew"]
    with np.load(f"{out}.truth.npz") as data:
        truth = [data[f"arr_{index}"] for index in range(CONVS + 2)]
        classes = data["classes"]
    return grew, out, truth, classes


def test_the_export_reference_is_written_in_bounded_memory(tmp_path):
    """The reference of a model whose layers hold PER_IMAGE bytes an image: with batches
    of 2 images and 2**14 check values a layer (the model's 8 layers share 8 x 2**14
    values' bytes, CHECK_BYTES), writing it grows the process by far less
    than the 64-image batch it ran in (96 MB of outputs held at once) or every layer in
    full; what it keeps is Keras' own values at every stride-th place, the layers'
    largest magnitudes and the classes, and a runtime's outputs still map by it."""
    from bitdrift.backends.exported.expected import mapped_positions, read_reference

    grew, out, truth, classes = write_reference_in_tensorflow(tmp_path, 2 * PER_IMAGE,
                                                              4 * 8 * 2**14)
    assert grew < 64 * PER_IMAGE / 3, grew
    reference = read_reference(out)
    assert list(reference.argmax) == list(classes)
    assert reference.check_strides[:CONVS] == [32] * CONVS  # 8 x 32 x 32 x 64 / 2**14
    assert reference.check_strides[CONVS:] == [1, 1]  # the pooling and the Dense: whole
    for position, full in enumerate(truth):
        assert reference.check_shape(position) == full.shape
        stride = reference.stride(position)
        kept = full.reshape(len(full), -1)[:, ::stride]
        scale = np.abs(full).max()
        # batches of 2 against one of 8: a convolution may round its last bits otherwise
        assert np.abs(reference.check_outputs[position] - kept).max() <= 1e-5 * scale
        if stride > 1:
            assert reference.check_scales[position] == pytest.approx(scale, rel=1e-5)
    assert mapped_positions(truth, reference) == ["float32"] * len(truth)
    swapped = [truth[1], truth[0], *truth[2:]]  # another layer's values of the same shape
    assert mapped_positions(swapped, reference)[:2] == [None, None]


def test_a_reference_whose_sampling_is_damaged_is_refused_in_one_line(tmp_path):
    import json

    from bitdrift.backends.exported.expected import read_reference
    from bitdrift.errors import RecordError

    meta = {"layers": [["conv", "Conv2D"]], "checked": {}, "check_indices": [0],
            "argmax_indices": [0], "model_sha256": "m", "check_shapes": [[1, 4]],
            "check_strides": [0], "check_scales": [1.0]}
    path = tmp_path / "reference.npz"
    np.savez(path, meta=json.dumps(meta), argmax=np.zeros(1), **{"check/0": np.zeros((1, 4))})
    with pytest.raises(RecordError, match=r"reference.npz: not a bitdrift export reference.*"
                                          r"check_strides are not counts.*export_reference"):
        read_reference(path)


def test_the_class_tables_stream(big_records):
    """eqc.csv and eqc_layers.csv (eqc_tables): per layer each device's class, one layer
    over all devices at a time; the classes are those of the files' bytes."""
    from bitdrift.analysis.eqc import eqc_tables

    records = open_records(big_records)
    (final, layers), peak = peak_of(eqc_tables, records)
    assert peak < 4 * LAYER_BYTES, peak
    assert len(final) == DEVICES * SAMPLES
    for (sample, layer), part in layers.groupby(["sample", "layer"]):
        where = "output" if layer == "output" else f"layers/{layer}"
        seen: dict[bytes, int] = {}
        for path, device in zip(big_records, range(DEVICES), strict=True):
            with h5py.File(path, "r") as handle:
                bits = handle[f"samples/{sample}/{where}"][0].tobytes()
            expected = seen.setdefault(bits, len(seen) + 1)
            assert part.set_index("device").loc[f"d{device}", "eqc"] == expected
