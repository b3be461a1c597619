import h5py
import numpy as np
import pytest

from bitdrift.analysis.eqc import (
    EQC_COLUMNS,
    EQC_EXTRA_COLUMNS,
    PRECISION_COLUMNS,
    eqc_tables,
    precision_table,
)
from bitdrift.record.hdf5 import RecordError
from bitdrift.record.reader import open_records

A = np.array([1.0, 2.0, 3.0], np.float32)
B = np.array([1.0, 2.0, 3.0000002], np.float32)  # last bit of one element
C = np.array([1.0, -2.0, 3.0], np.float32)  # sign


def repeats(*outputs):
    return np.stack(outputs)


def test_classes_numbered_by_first_appearance_in_argument_order(make_record):
    paths = [make_record("d1", {0: repeats(B, B)}), make_record("d2", {0: repeats(A, A)}),
             make_record("d3", {0: repeats(B, B)}), make_record("d4", {0: repeats(C, C)})]
    final, _ = eqc_tables(open_records(paths))
    assert list(final.columns) == EQC_COLUMNS + EQC_EXTRA_COLUMNS
    assert final["eqc"].tolist() == [1, 2, 1, 3]
    assert final["deterministic"].all()
    # another order numbers differently: order is the caller's
    final, _ = eqc_tables(open_records(paths[::-1]))
    assert final["eqc"].tolist() == [1, 2, 3, 2]


def test_non_deterministic_device_uses_most_frequent_output(make_record):
    paths = [make_record("ref", {0: repeats(A)}),
             make_record("noisy", {0: repeats(B, A, B)})]
    final, _ = eqc_tables(open_records(paths))
    noisy = final[final["device"] == "noisy"].iloc[0]
    assert not noisy["deterministic"]
    assert noisy["distinct_outputs"] == 2 and noisy["majority_count"] == 2
    assert noisy["eqc"] == 2  # B, not the reference's A


def test_tie_goes_to_first_occurring_output(make_record):
    paths = [make_record("ref", {0: repeats(A)}), make_record("tie", {0: repeats(B, A)})]
    final, _ = eqc_tables(open_records(paths))
    assert final["eqc"].tolist() == [1, 2]
    assert final["majority_count"].tolist() == [1, 1]


def test_negative_zero_and_nan_are_bitwise(make_record):
    zero, neg_zero = np.array([0.0], np.float32), np.array([-0.0], np.float32)
    nan = np.array([np.nan], np.float32)
    paths = [make_record("z", {0: repeats(zero)}), make_record("nz", {0: repeats(neg_zero)}),
             make_record("n1", {0: repeats(nan)}), make_record("n2", {0: repeats(nan.copy())})]
    final, _ = eqc_tables(open_records(paths))
    assert final["eqc"].tolist() == [1, 2, 3, 3]


def test_per_layer_tables_and_precision(make_record):
    layers = {0: [("conv", repeats(A, A)), ("relu", repeats(A, A))]}
    layers_b = {0: [("conv", repeats(B, B)), ("relu", repeats(A, A))]}
    paths = [make_record("d1", {0: repeats(A, A)}, layers=layers),
             make_record("d2", {0: repeats(B, B)}, layers=layers_b)]
    records = open_records(paths)
    _, per_layer = eqc_tables(records)
    assert per_layer.groupby("layer")["eqc"].max().to_dict() == {"conv": 2, "relu": 1,
                                                                 "output": 2}
    table = precision_table(records)
    assert list(table.columns[: len(PRECISION_COLUMNS)]) == PRECISION_COLUMNS
    rows = table.set_index("layer")
    assert rows.loc["relu", "n_eqc"] == 1 and rows.loc["relu", "remaining_precision"] == 23
    assert rows.loc["conv", "remaining_precision"] == 22
    assert rows.loc["output", "position"] == 2
    assert rows.loc["conv", "deviating_fraction"] == pytest.approx(1 / 3)


def test_mismatched_model_hash_is_refused_with_file_name(make_record):
    good = make_record("d1", {0: repeats(A)})
    other = make_record("d2", {0: repeats(A)}, model_sha256="x" * 64)
    with pytest.raises(RecordError, match=r"net_d2\.h5.*model_sha256"):
        eqc_tables(open_records([good, other]))


def test_mismatched_samples_are_refused(make_record):
    one = make_record("d1", {0: repeats(A)})
    two = make_record("d2", {0: repeats(A), 1: repeats(A)})
    with pytest.raises(RecordError, match="samples"):
        eqc_tables(open_records([one, two]))


def test_mixed_precisions_need_a_choice_for_remaining_precision(make_record):
    f32 = make_record("d32", {0: repeats(A)})
    f64 = make_record("d64", {0: repeats(A.astype(np.float64))}, precision="float64")
    records = open_records([f32, f64])
    final, _ = eqc_tables(records)
    assert final["eqc"].tolist() == [1, 2]  # different formats never share a class
    with pytest.raises(RecordError, match="--precision"):
        precision_table(records)
    table = precision_table(records, precision="float64")
    assert table["n_devices"].tolist() == [1]


def test_hand_written_file_in_documented_format(tmp_path, make_record):
    path = tmp_path / "hand.h5"
    with h5py.File(path, "w") as handle:
        for key, value in {"model": "net", "device": "laptop", "backend": "torch",
                           "precision": "float32", "fingerprint": "{}",
                           "model_sha256": "m" * 64, "input_sha256": "i" * 64}.items():
            handle.attrs[key] = value
        handle.create_dataset("samples/0/output", data=repeats(C, C, A))
    reference = make_record("d1", {0: repeats(A)})
    final, _ = eqc_tables(open_records([reference, path]))
    assert final["eqc"].tolist() == [1, 2]
    assert final["distinct_outputs"].tolist() == [1, 2]


def test_analysis_commands_do_not_import_frameworks(make_record, tmp_path):
    import subprocess
    import sys

    paths = [str(make_record("d1", {0: repeats(A)})), str(make_record("d2", {0: repeats(B)}))]
    code = (
        "import sys; from bitdrift.cli import main; "
        f"assert main(['eqc', *{paths!r}, '--out', {str(tmp_path / 'e.csv')!r}]) == 0; "
        f"assert main(['precision', *{paths!r}, '--out', {str(tmp_path / 'p.csv')!r}]) == 0; "
        # nor what only other commands run (emulators, package metadata): the
        # start-up is much of a small analysis
        "unused = {'bitdrift.emulation.cpus', 'importlib.metadata'} "
        "& set(sys.modules); assert not unused, unused; "
        f"assert main(['plot-eqc', *{paths!r}, '--eqc', {str(tmp_path / 'e.csv')!r}, "
        f"'--out', {str(tmp_path / 'e.pdf')!r}]) == 0; "
        "loaded = {'tensorflow', 'torch', 'keras'} & set(sys.modules); "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (tmp_path / "e.pdf").read_bytes().startswith(b"%PDF")


def test_parallel_workers_give_the_rows_of_one_process(make_record):
    from bitdrift.analysis.eqc import precision_rows

    rng = np.random.default_rng(1)
    base = rng.normal(size=(1, 1, 64)).astype(np.float32)
    paths = []
    for device in range(5):
        values = base.copy()
        values.view(np.uint32)[..., device * 3:device * 3 + 2] ^= np.uint32(device)
        layers = {s: [(f"layer{i}", values * (i + 1)) for i in range(6)] for s in (0, 1)}
        paths.append(make_record(f"d{device}", {0: values, 1: values}, layers=layers))
    records = open_records(paths)
    serial = precision_rows(records, "float32", significant=True, workers=1)
    parallel = precision_rows(records, "float32", significant=True, workers=2)
    assert len(serial) == 2 * 7 and parallel == serial
    # The parent closed its handles before the fork; its records read on as before.
    assert precision_rows(records, "float32", significant=True, workers=1) == serial
    with pytest.raises(RecordError, match="no record has precision 'float64'"):
        precision_rows(records, "float64", workers=2)


def test_remaining_precision_without_the_device_its_check_flags(make_record):
    """One device computes in bfloat16 (its check flags a layer): the table names it, and
    the remaining precision of the others is theirs alone. Truth built by hand: the other
    two are bit-identical (23 bits), and the bfloat16 output's difference from them is
    recounted here with numpy."""
    import json

    from bitdrift.analysis.remaining_precision import MANTISSA_BITS

    exact = np.array([1.1, -2.3, 3.7], np.float32)
    bf16 = (exact.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # truncated
    flagged = json.dumps({"dense": {"reduced": True, "format": "bfloat16",
                                    "effective_bits": 7.6}})
    paths = [make_record("f1", {0: repeats(exact)}), make_record("f2", {0: repeats(exact)}),
             make_record("bf", {0: repeats(bf16)}, effective_precision=flagged)]
    row = precision_table(open_records(paths)).set_index("layer").loc["output"]
    differing = np.bitwise_or.reduce(exact.view(np.uint32) ^ bf16.view(np.uint32))
    assert row["remaining_precision"] == MANTISSA_BITS["float32"] - int(differing).bit_length()
    assert row["reduced_precision_devices"] == "bf"
    assert row["remaining_precision_without_reduced"] == MANTISSA_BITS["float32"]
    unflagged = precision_table(open_records(paths[:2])).set_index("layer").loc["output"]
    assert unflagged["reduced_precision_devices"] == ""
    assert unflagged["remaining_precision_without_reduced"] is None or \
        np.isnan(unflagged["remaining_precision_without_reduced"])
