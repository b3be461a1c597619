"""The analyses that read whole records stream them: their peak memory (tracemalloc, which
sees every numpy buffer h5py reads into) stays within a few layers over all devices, far
below the records' size, and their results equal a numpy truth read from the files with
h5py directly."""

import tracemalloc

import h5py
import numpy as np
import pytest

from bitdrift.record import open_records

DEVICES, SAMPLES, LAYERS, REPEATS, ELEMENTS = 4, 2, 12, 2, 32768
# The layer where device d first differs from device 0 (None: never): its own bit flip
PARTS = {1: 3, 2: 7, 3: None}
LAYER_BYTES = DEVICES * REPEATS * ELEMENTS * 4  # one layer over all devices, all repeats


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
    total = sum(f.stat().st_size for f in files)
    assert total > 20 * LAYER_BYTES  # the records hold far more than one layer
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
    from bitdrift.divergence import divergence_table

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
    from bitdrift.eqc import precision_rows

    records = open_records(big_records)
    rows, peak = peak_of(precision_rows, records, "float32", significant=True)
    # the significant bits work on float64 copies of one layer over the devices
    assert peak < 8 * LAYER_BYTES < sum(path.stat().st_size for path in big_records) / 3, peak
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
