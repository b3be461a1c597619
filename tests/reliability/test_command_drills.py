"""Drills a careless or careful user runs into with the commands and records: each case
is refused with the file or key named (one line, a documented exit status), or analysed
correctly, and nothing is overwritten or lost."""

import json
import os
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np
import pandas as pd
import pytest

from bitdrift.analysis.eqc import eqc_tables, precision_table
from bitdrift.atomic import WORK_MARK, work_folder
from bitdrift.cli import main
from bitdrift.config import ConfigError, validate_config
from bitdrift.record.reader import open_records

A = np.array([1.0, 2.0, 3.0], np.float32)
B = np.array([1.0, 2.0, 3.0000002], np.float32)


def repeats(*outputs):
    return np.stack(outputs)


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("bitdrift: error: ") and "\n" not in err, err
    return err


# -- 1. outputs are never inputs -------------------------------------------------------
@pytest.mark.parametrize("command", ["eqc", "precision"])
def test_out_naming_an_input_record_is_refused_and_the_record_kept(make_record, command,
                                                                  capsys):
    first, second = make_record("d1", {0: repeats(A)}), make_record("d2", {0: repeats(B)})
    before = first.read_bytes()
    assert main([command, str(first), str(second), "--out", str(first)]) == 2
    assert "is also an input" in one_line_error(capsys)
    assert first.read_bytes() == before


@pytest.mark.parametrize("command", ["eqc", "precision"])
def test_a_record_the_shell_put_after_out_is_refused(make_record, command, capsys):
    # `bitdrift eqc --out *.h5`: the first record becomes --out, not an input
    first, second = make_record("d1", {0: repeats(A)}), make_record("d2", {0: repeats(B)})
    before = first.read_bytes()
    assert main([command, "--out", str(first), str(second)]) == 2
    assert "is a record, model or dataset file" in one_line_error(capsys)
    assert first.read_bytes() == before
    renamed = first.with_name("looks_like_a_table")  # an HDF5 record under any name
    shutil.copy(first, renamed)
    assert main([command, str(second), "--out", str(renamed)]) == 2
    assert renamed.read_bytes() == before


def test_plot_eqc_never_writes_over_its_records(make_record, tmp_path, capsys):
    first, second = make_record("d1", {0: repeats(A)}), make_record("d2", {0: repeats(B)})
    table = tmp_path / "eqc.csv"
    assert main(["eqc", str(first), str(second), "--out", str(table)]) == 0
    capsys.readouterr()
    before = second.read_bytes()
    assert main(["plot-eqc", str(first), "--eqc", str(table), "--out", str(second)]) == 2
    one_line_error(capsys)
    assert second.read_bytes() == before


# -- 4. a layer named `output` -----------------------------------------------------------
def test_a_layer_named_output_neither_duplicates_rows_nor_takes_the_final_statistics(
        make_record):
    final_a, final_b = A, A.copy()  # final outputs identical: full precision
    middle_a = np.array([1.0, 2.0, 3.0], np.float32)
    middle_b = np.array([1.0, 2.0, np.nextafter(np.float32(3), np.float32(4))], np.float32)
    files = [make_record(device, {0: repeats(final)},
                         layers={0: [("conv", repeats(final)), ("output", repeats(middle))]})
             for device, final, middle in (("d1", final_a, middle_a), ("d2", final_b, middle_b))]
    records = open_records(files)
    final, layers = eqc_tables(records)
    assert len(final) == 2  # one row per device, not doubled by the layer
    assert final["eqc"].tolist() == [1, 1]
    table = precision_table(records).set_index("layer")
    assert table.loc["output", "remaining_precision"] == 23  # the final output
    assert table.loc["layers/output", "remaining_precision"] == 22  # the layer's own
    assert table.loc["layers/output", "position"] < table.loc["output", "position"]
    assert set(layers["layer"]) == {"conv", "layers/output", "output"}


# -- 5. shapes are compared -------------------------------------------------------------
def test_same_count_other_layout_is_refused_naming_both_files(make_record):
    nhwc = make_record("d1", {0: np.zeros((1, 2, 3, 4), np.float32)})
    nchw = make_record("d2", {0: np.zeros((1, 4, 2, 3), np.float32)})
    with pytest.raises(Exception, match=r"d2\.h5: sample 0, output: shape .*net_d1\.h5"):
        eqc_tables(open_records([nhwc, nchw]))
    other_count = make_record("d3", {0: np.zeros((1, 5), np.float32)})
    assert main(["precision", str(nhwc), str(other_count), "--out",
                 str(nhwc.with_name("p.csv"))]) == 3


# -- 10. one-line errors --------------------------------------------------------------
def test_plot_precision_on_the_wrong_table_is_one_line(make_record, tmp_path, capsys):
    first, second = make_record("d1", {0: repeats(A)}), make_record("d2", {0: repeats(B)})
    table = tmp_path / "eqc.csv"
    assert main(["eqc", str(first), str(second), "--out", str(table)]) == 0
    capsys.readouterr()
    assert main(["plot-precision", str(table), "--out", str(tmp_path / "p.pdf")]) == 3
    assert "not a table from `bitdrift precision`" in one_line_error(capsys)


def test_plot_eqc_with_hundreds_of_columns(make_record, tmp_path):
    outputs = {sample: repeats(A) for sample in range(220)}
    files = [make_record(device, outputs) for device in ("d1", "d2")]
    table = tmp_path / "eqc.csv"
    assert main(["eqc", *map(str, files), "--out", str(table)]) == 0
    assert main(["plot-eqc", *map(str, files), "--eqc", str(table), "--out",
                 str(tmp_path / "e.pdf")]) == 0
    assert (tmp_path / "e.pdf").read_bytes().startswith(b"%PDF")


def test_plot_eqc_with_thousands_of_samples_stays_readable(make_record, tmp_path):
    from PIL import Image

    outputs = {sample: repeats(A if sample % 3 else B) for sample in range(3000)}
    files = [make_record(device, outputs) for device in ("d1", "d2", "d3")]
    table = tmp_path / "eqc.csv"
    assert main(["eqc", *map(str, files), "--out", str(table)]) == 0
    assert main(["plot-eqc", *map(str, files), "--eqc", str(table), "--out",
                 str(tmp_path / "e.pdf")]) == 0
    width, height = Image.open(tmp_path / "e.png").size
    assert width < 4000 and height < 2000, (width, height)


def test_plot_eqc_with_two_models_of_other_devices(make_record, tmp_path):
    """Two models, each with devices the other lacks: one figure, a block per model (the
    grid once had a row per device of either model, and its colours failed on the empty
    cells)."""
    files = [make_record(device, {0: repeats(output), 1: repeats(output)}, model=model)
             for model, devices in (("m1", {"d1": A, "d2": B, "d3": A}),
                                    ("m2", {"d1": B, "d4": A}))
             for device, output in devices.items()]
    table = tmp_path / "eqc.csv"
    assert main(["eqc", *map(str, files), "--out", str(table)]) == 0
    assert main(["plot-eqc", *map(str, files), "--eqc", str(table), "--out",
                 str(tmp_path / "e.pdf")]) == 0
    assert (tmp_path / "e.png").read_bytes().startswith(b"\x89PNG")


def test_an_invalid_dendrogram_precision_is_refused(make_record, tmp_path):
    with pytest.raises(SystemExit) as refused:
        main(["plot-eqc", "x.h5", "--eqc", "e.csv", "--out", "e.pdf", "--precision", "f32"])
    assert refused.value.code == 2


def _config(**changes):
    config = {"samples": [0], "datasets": {"d": {"source": "digits", "limit_test": 8}},
              "models": {"m": {"architecture": "cifar10_small", "dataset": "d"}},
              "devices": {"cpu": {"accelerator": "cpu", "backend": "torch", "threads": 2}}}
    for key, value in changes.items():
        config[key] = value
    return config


def test_floats_for_integers_are_refused_naming_the_key():
    config = _config(devices={"cpu": {"accelerator": "cpu", "backend": "torch",
                                      "threads": 2.0}})
    with pytest.raises(ConfigError, match=r"devices\.cpu\.threads: 2\.0 is not of type"):
        validate_config(config)


def test_samples_beyond_the_test_set_are_refused_at_parse_time():
    with pytest.raises(ConfigError, match=r"samples: \[9\] beyond the test set of dataset 'd'"):
        validate_config(_config(samples=[0, 9]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real dataset and model file (torch backend, untrained weights) for `infer`."""
    folder = tmp_path_factory.mktemp("infer")
    config = folder / "config.yaml"
    import yaml

    config.write_text(yaml.safe_dump(_config()))
    dataset = folder / "d.h5"
    assert main(["prepare-dataset", "--config", str(config), "--dataset", "d",
                 "--out", str(dataset)]) == 0
    code = ("import os; os.environ['KERAS_BACKEND'] = 'torch'; import keras; "
            "from bitdrift.inputs.models import build_model; "
            "build_model(keras, {'architecture': 'cifar10_small'}, (32, 32, 3), 10)"
            f".save({str(folder / 'model.keras')!r})")
    subprocess.run([sys.executable, "-c", code], check=True)
    return folder, config, dataset, folder / "model.keras"


def test_infer_problems_are_found_before_any_repeat(trained, tmp_path, capsys):
    folder, config, dataset, model = trained
    base = ["infer", "--config", str(config), "--model", "m", "--device", "cpu",
            "--dataset-file", str(dataset)]
    # one_line_error: nothing but the error, so no repeat (a fresh framework) was started
    assert main([*base, "--model-file", str(tmp_path / "missing.keras"),
                 "--out", str(tmp_path / "r.h5")]) == 4
    assert "missing.keras: model file does not exist" in one_line_error(capsys)
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    assert main([*base, "--model-file", str(model), "--out", str(blocked / "r.h5")]) == 2
    assert one_line_error(capsys) == \
        f"bitdrift: error: --out {blocked / 'r.h5'}: {blocked} is a file, not a folder"
    with h5py.File(dataset) as handle:
        n_test = handle["x_test"].shape[0]
    beyond = tmp_path / "beyond.yaml"
    import yaml

    settings = _config(samples=[n_test + 3])
    settings["datasets"]["d"].pop("limit_test")
    beyond.write_text(yaml.safe_dump(settings))
    assert main(["infer", "--config", str(beyond), "--model", "m", "--device", "cpu",
                 "--dataset-file", str(dataset), "--model-file", str(model),
                 "--out", str(tmp_path / "r.h5")]) == 3  # the workflow's check, same code
    assert f"samples [{n_test + 3}] beyond the test set (indices 0..{n_test - 1}); config " \
        "key samples" in one_line_error(capsys)


def test_outputs_never_replace_defaulted_inputs_or_each_other(trained, tmp_path, capsys,
                                                             make_record):
    """An --out equal to the model or dataset file the command reads (given or by
    default) is refused before anything runs, and so are two outputs on one path."""
    folder, config, dataset, model = trained
    before = {path: path.read_bytes() for path in (model, dataset)}
    base = ["infer", "--config", str(config), "--model", "m", "--device", "cpu",
            "--dataset-file", str(dataset), "--model-file", str(model)]
    for target in (model, dataset):
        assert main([*base, "--out", str(target)]) == 2
        assert "is also an input" in one_line_error(capsys)
    train = ["train", "--config", str(config), "--model", "m", "--seed", "0",
             "--dataset-file", str(dataset)]
    for flag in ("--out-logits", "--out-model"):
        assert main([*train, flag, str(dataset)]) == 2
        assert f"{flag} {dataset} is also an input" in one_line_error(capsys)
    assert {path: path.read_bytes() for path in (model, dataset)} == before
    first, second = make_record("d1", {0: repeats(A)}), make_record("d2", {0: repeats(B)})
    same = tmp_path / "same.csv"
    assert main(["eqc", str(first), str(second), "--out", str(same), "--layers-out",
                 str(same)]) == 2
    assert "also the output of --out" in one_line_error(capsys)
    assert main(["explain", str(first), str(second), "--out", str(same), "--classes-out",
                 str(same)]) == 2
    one_line_error(capsys)
    assert not same.exists()
    a_file = tmp_path / "not_a_folder"
    a_file.write_text("")
    assert main(["training-stats", str(first), "--out-dir", str(a_file)]) == 2
    assert "is a file, not a folder" in one_line_error(capsys)


def test_plot_eqc_table_refuses_a_device_without_a_record(make_record, tmp_path, capsys):
    first, second = make_record("d1", {0: repeats(A)}), make_record("d2", {0: repeats(B)})
    eqc, classes = tmp_path / "eqc.csv", tmp_path / "classes.csv"
    assert main(["eqc", str(first), str(second), "--out", str(eqc)]) == 0
    assert main(["explain", str(first), str(second), "--out", str(tmp_path / "x.csv"),
                 "--classes-out", str(classes)]) == 0
    capsys.readouterr()
    assert main(["plot-eqc-table", str(first), "--eqc", str(eqc), "--classes", str(classes),
                 "--out", str(tmp_path / "t.pdf")]) == 3
    assert "names device(s) d2 with no record" in one_line_error(capsys)
    # one device under two models is one row per model column, not an error
    other = make_record("d1", {0: repeats(A)}, model="net2")
    both = tmp_path / "both.csv"
    assert main(["eqc", str(first), str(second), str(other), "--out", str(both)]) == 0
    assert main(["explain", str(first), str(second), str(other), "--out",
                 str(tmp_path / "y.csv"), "--classes-out", str(classes)]) == 0
    table = tmp_path / "table.csv"
    assert main(["plot-eqc-table", str(first), str(second), str(other), "--eqc", str(both),
                 "--classes", str(classes), "--out", str(tmp_path / "t.pdf"),
                 "--table-out", str(table)]) == 0
    rows = pd.read_csv(table).set_index("device")
    assert sorted(rows.index) == ["d1", "d2"] and rows.loc["d1", "net2#0"] == "1"


# -- 11. interrupted jobs and flipped bits ------------------------------------------------
def _start_infer(trained, tmp_path):
    """`bitdrift infer` under way: its repeats' work folder beside its output exists."""
    folder, config, dataset, model = trained
    command = [sys.executable, "-m", "bitdrift.cli", "infer", "--config", str(config),
               "--model", "m", "--device", "cpu", "--dataset-file", str(dataset),
               "--model-file", str(model), "--out", str(tmp_path / "r.h5")]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not list(tmp_path.glob(WORK)) and time.time() < deadline:
        time.sleep(0.1)
    assert list(tmp_path.glob(WORK)), "infer never started its repeats"
    return process, command


WORK = f".r.h5{WORK_MARK}*"


def test_sigterm_leaves_no_temporary_folder(trained, tmp_path):
    process, _ = _start_infer(trained, tmp_path)
    process.terminate()
    process.wait(timeout=60)
    assert process.returncode != 0
    assert not list(tmp_path.glob(WORK))
    assert not (tmp_path / "r.h5").exists()


def test_the_folder_of_a_killed_job_is_beside_its_output_and_gone_at_its_next_start(
        trained, tmp_path):
    """SIGKILL cannot be handled: the work folder stays, beside the job's output (never in
    /tmp), and the next start of the same job removes it before making its own."""
    process, command = _start_infer(trained, tmp_path)
    (left,) = tmp_path.glob(WORK)
    process.kill()
    process.wait(timeout=60)
    assert left.exists() and not (tmp_path / "r.h5").exists()
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not left.exists() and not list(tmp_path.glob(WORK))
    assert (tmp_path / "r.h5").exists()


def test_folders_of_killed_jobs_are_removed_by_the_next_one(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".r.h5{WORK_MARK}{dead.pid}-abc"
    stale.mkdir()
    live = tmp_path / f".r.h5{WORK_MARK}{os.getpid()}-xyz"
    live.mkdir()
    with work_folder(tmp_path / "r.h5") as mine:
        assert mine.parent == tmp_path and mine.exists()
    assert not stale.exists() and live.exists() and not mine.exists()


def test_one_flipped_bit_in_a_record_is_refused(make_record, tmp_path, capsys):
    first, second = make_record("d1", {0: repeats(A)}), make_record("d2", {0: repeats(A)})
    with h5py.File(second) as handle:
        offset = handle["samples/0/output"].id.get_chunk_info(0).byte_offset
    data = bytearray(second.read_bytes())
    data[offset] ^= 0x01  # the lowest bit of the first stored byte
    second.write_bytes(bytes(data))
    assert main(["eqc", str(first), str(second), "--out", str(tmp_path / "e.csv")]) == 3
    assert "d2.h5" in one_line_error(capsys)
    assert not (tmp_path / "e.csv").exists()


def _damage_headers(path, names):
    """Overwrite the signature of each named object's header (HDF5's OHDR): the name is
    still listed, the object cannot be opened."""
    with h5py.File(path) as handle:
        addresses = [h5py.h5o.get_info(handle[name].id).addr for name in names]
    data = bytearray(path.read_bytes())
    for address in addresses:
        assert data[address:address + 4] == b"OHDR"
        data[address:address + 4] = b"XXXX"
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("command", ["eqc", "precision", "divergence"])
@pytest.mark.parametrize("damaged, said", [
    (["samples/0/layers/l1"], "samples/0/layers/l1 cannot be read: its object header is "
                              "damaged"),
    (["samples/0/layers/l0", "samples/0/layers/l1", "samples/0/output"],
     "samples/0/output cannot be read: its object header is damaged")])
def test_a_damaged_dataset_header_is_one_line_naming_file_and_dataset(
        make_record, tmp_path, capsys, command, damaged, said):
    """One layer's header damaged was an AttributeError ('NoneType' object has no
    attribute 'attrs'); every header damaged, 'samples/0 has no dataset output' for a
    dataset that is there but cannot be read."""
    layers = {0: [("l0", repeats(A)), ("l1", repeats(A))]}
    first = make_record("d1", {0: repeats(A)}, layers=layers)
    second = make_record("d2", {0: repeats(B)}, layers=layers)
    _damage_headers(first, damaged)
    out = tmp_path / "out.csv"
    assert main([command, str(first), str(second), "--out", str(out)]) == 3
    assert one_line_error(capsys).startswith(f"bitdrift: error: {first}: {said} (")
    assert not out.exists()


def test_version_prints(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("bitdrift ")


def test_readme_precision_example_needs_no_guessing(make_record, tmp_path, capsys):
    """Records of two precisions: the error says to choose one with --precision."""
    first = make_record("d1", {0: repeats(A)})
    second = make_record("d2", {0: repeats(A.astype(np.float64))}, precision="float64")
    assert main(["precision", str(first), str(second), "--out", str(tmp_path / "p.csv")]) == 3
    assert "--precision" in one_line_error(capsys)
    assert main(["precision", str(first), str(second), "--out", str(tmp_path / "p.csv"),
                 "--precision", "float32"]) == 0
    assert pd.read_csv(tmp_path / "p.csv")["n_devices"].eq(1).all()


# -- 2. the provenance check cannot be bypassed ------------------------------------------
def test_a_record_of_an_unexpected_model_or_in_another_device_place_is_refused(
        make_record, tmp_path, capsys):
    folder = tmp_path / "results/inference/cifar10_small"
    folder.mkdir(parents=True)
    good = make_record("tf", {0: repeats(A)}, model="cifar10_small")
    shutil.move(good, folder / "tf.h5")
    bogus = make_record("x", {0: repeats(B)}, model="c10s")
    shutil.move(bogus, folder / "x.h5")
    expect = ["--expect", "cifar10_small", "model.keras", "digits.h5"]
    out = str(tmp_path / "e.csv")
    assert main(["eqc", str(folder / "tf.h5"), str(folder / "x.h5"), "--out", out,
                 *expect]) == 3
    assert "model 'c10s' is not one of the expected models" in one_line_error(capsys)
    renamed = folder / "torch.h5"  # device 'tf' under another device's name
    shutil.copy(folder / "tf.h5", renamed)
    assert main(["eqc", str(folder / "tf.h5"), str(renamed), "--out", out, *expect]) == 3
    assert "holds device 'tf'" in one_line_error(capsys)
    assert not (tmp_path / "e.csv").exists()


@pytest.fixture
def mounted(tmp_path):
    """Two tmpfs mounts (root, as CI runs): one read-only, one full."""
    readonly, full = tmp_path / "readonly", tmp_path / "full"
    for folder, options in ((readonly, "ro"), (full, "size=64k")):
        folder.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                       check=True)
    try:
        with open(full / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass
        yield readonly, full
    finally:
        for folder in (readonly, full):
            subprocess.run(["umount", str(folder)], check=False)


def test_a_read_only_or_full_disk_is_one_line_and_leaves_no_part(make_record, mounted,
                                                                 capsys):
    readonly, full = mounted
    first, second = make_record("d1", {0: repeats(A)}), make_record("d2", {0: repeats(B)})
    for folder, reason in ((readonly, "Read-only file system"),
                           (full, "No space left on device")):
        out = folder / "eqc.csv"
        assert main(["eqc", str(first), str(second), "--out", str(out)]) == 6
        assert f"{out}: cannot be written ({reason})" in one_line_error(capsys)
        assert [path.name for path in folder.iterdir()] in ([], ["filler"])
    assert main(["plot-eqc", str(first), str(second), "--eqc", str(full / "x.csv"),
                 "--out", str(full / "eqc.pdf")]) == 3  # no table there: read error first
    one_line_error(capsys)


def _layered(make_record, device, value, layers=40):
    """A record with many layers: its per-layer table takes several KiB."""
    outputs = {0: repeats(value), 1: repeats(value)}
    return make_record(device, outputs, layers={sample: [(f"layer_{i}", repeats(value))
                                                         for i in range(layers)]
                                                for sample in outputs})


def _left(folder):
    return sorted(path.name for path in folder.iterdir() if path.name != "filler")


def _room(full, nbytes):
    """Fill the disk again, then free ``nbytes``: a writer gets that far and no further."""
    filler = full / "filler"
    with open(filler, "ab", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError:
            pass
    os.truncate(filler, filler.stat().st_size - nbytes)


def test_every_writer_on_a_full_disk_is_one_line_and_leaves_none_of_its_outputs(
        make_record, mounted, tmp_path):
    """On a disk with a little room left, each writer runs out midway: `index` (h5py
    crashed in its teardown: exit 139 and dozens of tracebacks), `plot-eqc-table`
    (matplotlib's AttributeError), and `eqc` with room for its first table only (it left
    eqc.csv written and --layers-out missing). Each: exit 6, one line, nothing left."""
    _, full = mounted
    first, second = _layered(make_record, "d1", A), _layered(make_record, "d2", B)
    many = [make_record(f"r{i}", {0: repeats(np.full(64, i, np.float32)),
                                  1: repeats(np.full(64, -i, np.float32))})
            for i in range(60)]
    classes = tmp_path / "classes.csv"
    eqc = tmp_path / "eqc.csv"
    assert main(["eqc", str(first), str(second), "--out", str(eqc)]) == 0
    assert main(["explain", str(first), str(second), "--out", str(tmp_path / "x.csv"),
                 "--classes-out", str(classes)]) == 0
    commands = [["index", *map(str, many), "--out", str(full / "atlas.h5")],
                ["plot-eqc-table", str(first), str(second), "--eqc", str(eqc), "--classes",
                 str(classes), "--out", str(full / "t.pdf"), "--table-out",
                 str(full / "t.csv")],
                ["eqc", str(first), str(second), "--out", str(full / "eqc.csv"),
                 "--layers-out", str(full / "layers.csv")]]
    for command in commands:
        _room(full, 8192)
        done = subprocess.run([sys.executable, "-m", "bitdrift", *command],
                              capture_output=True, text=True)
        assert done.returncode == 6, (command[0], done.returncode, done.stderr[-2000:])
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "No space left on device" in lines[0], done.stderr
        assert _left(full) == [], command[0]


def test_a_kernels_dataset_of_the_wrong_shape_is_one_line(make_record, tmp_path, capsys):
    path = make_record("d1", {0: repeats(A)})
    with h5py.File(path, "r+") as handle:
        handle.create_dataset("kernels", data='["a", "list"]')
    assert main(["kernels", str(path), "--out", str(tmp_path / "k.csv")]) == 3
    assert "dataset 'kernels' is not a kernel record (a JSON list, not an object)" in \
        one_line_error(capsys)
    with h5py.File(path, "r+") as handle:
        del handle["kernels"]
        handle.create_dataset("kernels", data='{"traced": true, "layers": {"c": "x"}}')
    assert main(["kernels", str(path), "--out", str(tmp_path / "k.csv")]) == 3
    assert "layer 'c': not {signature: text, calls: [objects]}" in one_line_error(capsys)
    with h5py.File(path, "r+") as handle:  # a layer in its order without an entry (KeyError)
        del handle["kernels"]
        handle.create_dataset("kernels", data='{"traced": true, "order": ["c", "d"], '
                                              '"layers": {"c": {"signature": "x"}}}')
    assert main(["kernels", str(path), "--out", str(tmp_path / "k.csv")]) == 3
    assert one_line_error(capsys) == (f"bitdrift: error: {path}: dataset 'kernels' is not a "
                                      "kernel record ('order' names d, which 'layers' lacks)")
    assert not (tmp_path / "k.csv").exists()


@pytest.mark.parametrize("name", ["01", "٦", "²", "+1"])
def test_sample_groups_that_are_no_ascii_index_are_refused(make_record, name, capsys):
    path = make_record("d1", {0: repeats(A)})
    with h5py.File(path, "r+") as handle:
        handle.move("samples/0", f"samples/{name}")
    assert main(["eqc", str(path), "--out", str(path.with_suffix(".csv"))]) == 3
    assert f"{path}: sample group name {name!r} is not a test-set index" in \
        one_line_error(capsys)


def test_provenance_with_a_missing_or_foreign_model_file_is_one_line(trained, make_record,
                                                                    tmp_path, capsys):
    folder, config, dataset, model = trained
    record = make_record("d1", {0: repeats(A)}, model="m")
    folder_record = tmp_path / "m" / "d1.h5"
    folder_record.parent.mkdir()
    shutil.copy(record, folder_record)
    not_keras = tmp_path / "fake.keras"
    with __import__("zipfile").ZipFile(not_keras, "w") as archive:
        archive.writestr("hello.txt", "no config")
    for model_file, message in ((tmp_path / "gone.keras", "model file does not exist"),
                                (not_keras, "not a model bitdrift reads"),
                                (dataset, "an HDF5 file but not a Keras .h5 model"),
                                (model, "was run on another model")):
        assert main(["eqc", str(folder_record), "--out", str(tmp_path / "e.csv"),
                     "--expect", "m", str(model_file), str(dataset)]) == 3
        assert message in one_line_error(capsys)
    assert main(["eqc", str(folder_record), "--out", str(tmp_path / "e.csv"),
                 "--expect", "m", str(model), str(model)]) == 3  # a model as the dataset
    one_line_error(capsys)


@pytest.mark.parametrize("command", [
    ["probe", "--config", "c.yaml", "--out", "new.h5"],
    ["probe-set", "probes.h5", "--dataset", "d.h5", "--out", "ev.h5"],
    ["index", "a.h5", "--out", "atlas.h5"]])
def test_commands_that_write_data_files_may_name_them(command, tmp_path, monkeypatch):
    """The out-is-input guard knows each command's output kind: the probe commands' and
    index's documented HDF5 outputs are theirs to write (they were refused)."""
    from bitdrift.cli import build_parser, check_outputs

    monkeypatch.chdir(tmp_path)
    check_outputs(build_parser().parse_args(command))
    with pytest.raises(ConfigError, match="is a record, model or dataset file"):
        check_outputs(build_parser().parse_args(["eqc", "a.h5", "--out", "b.h5"]))
    with pytest.raises(ConfigError, match="also an input"):
        check_outputs(build_parser().parse_args(["probe-set", "p.h5", "--dataset", "d.h5",
                                                 "--out", "p.h5"]))


# -- issue 51: every failure one line, naming the file, key or folder ---------------------
def _written(folder) -> list[str]:
    """What a command left in ``folder`` (temporaries included: none may be left)."""
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []


@pytest.fixture
def parting(trained, tmp_path):
    """Two hand-made records of the `trained` model that part at its first Dense layer fed
    by a recorded layer (their model digest is the model file's), for `repro`."""
    from bitdrift.inputs.models import keras_file_layers, model_digest
    from bitdrift.record.writer import write_record
    from tests.utils import BASE_ATTRS

    _, _, _, model = trained
    layers = {layer["name"]: layer for layer in keras_file_layers(model)}
    dense = next(layer for layer in layers.values() if layer["class_name"] == "Dense"
                 and layers[layer["inbound"][0]]["class_name"] != "InputLayer")
    fed_by = dense["inbound"][0]
    inputs, units = dense["weights"][0].shape
    device = {"accelerator": "cpu", "backend": "torch", "precision": "float32",
              "batch_size": 2, "threads": 1, "env": {}}
    paths = []
    for name, value in (("d1", 1.0), ("d2", 1.5)):
        path = tmp_path / "records" / f"{name}.h5"
        path.parent.mkdir(exist_ok=True)
        write_record(path, {**BASE_ATTRS, "model": "m", "device": name,
                            "model_sha256": model_digest(model),
                            "device_config": json.dumps(device)},
                     {0: {"output": np.ones((1, 10), np.float32),
                          "layers": [(fed_by, np.ones((1, 1, inputs), np.float32)),
                                     (dense["name"], np.full((1, 1, units), value,
                                                             np.float32))]}})
        paths.append(path)
    return paths, model, dense["name"]


def test_repro_refusals_are_one_line_and_leave_nothing(parting, tmp_path, capsys):
    """A --model-file that is missing (FileNotFoundError), an --out that is a file
    (NotADirectoryError) or under one; an --out under folders that do not exist is made
    (FileNotFoundError at os.replace)."""
    (first, second), model, layer = parting
    base = ["repro", str(first), str(second)]
    out = tmp_path / "out"
    assert main([*base, "--model-file", str(tmp_path / "gone.keras"), "--out", str(out)]) == 3
    assert one_line_error(capsys) == (f"bitdrift: error: {tmp_path / 'gone.keras'}: model file "
                                      "does not exist (--model-file)")
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    assert main([*base, "--model-file", str(model), "--out", str(a_file)]) == 2
    assert one_line_error(capsys) == f"bitdrift: error: --out {a_file} is a file, not a folder"
    assert main([*base, "--model-file", str(model), "--out", str(a_file / "r")]) == 2
    assert one_line_error(capsys) == \
        f"bitdrift: error: --out {a_file / 'r'}: {a_file} is a file, not a folder"
    assert a_file.read_text() == "mine" and not out.exists()
    assert _written(tmp_path) == ["a_file", "records"]  # nothing half-written beside them
    deep = tmp_path / "new" / "deeper" / "repro"
    assert main([*base, "--model-file", str(model), "--out", str(deep)]) == 0
    capsys.readouterr()
    assert json.loads((deep / "expected.json").read_text())["layer"] == layer
    assert _written(deep.parent) == ["repro"]  # no staging folder left beside it


NOTHING_LEFT = "nothing of this command's output was left"


@pytest.mark.parametrize("case", ["read-only", "read-only mount", "mount", "full",
                                  "nearly full"])
def test_repro_on_a_read_only_full_or_mounted_folder_is_one_line(parting, tmp_path, case):
    """tmpfs mounts in a private namespace: --out inside a read-only one (EROFS), that
    mount itself, a writable mount as --out (a folder written whole is renamed into
    place; a mount point cannot be: EBUSY), a full one (ENOSPC), one with room for a part
    of the layer's weights (numpy's short write, an OSError without errno, escaped as
    'OSError: 40960 requested and 15328 written')."""
    import re

    from tests.utils import on_mounts

    (first, second), model, _ = parting
    disk = tmp_path / "disk"
    options, out, reason = {
        "read-only": ("ro", disk / "repro", "Read-only file system"),
        "read-only mount": ("ro", disk, "Read-only file system"),
        "mount": ("size=1m", disk, "--out is a mount point, which a folder written whole "
                                   "cannot replace: give a folder inside it"),
        "full": ("size=64k", disk / "repro", "No space left on device"),
        "nearly full": ("size=256k", disk / "repro", "a short write, [0-9]+ requested and "
                                                     "[0-9]+ written: the disk is full or "
                                                     "over quota")}[case]
    done = on_mounts({disk: options}, [sys.executable, "-m", "bitdrift", "repro", first,
                                       second, "--model-file", model, "--out", out],
                     fill=[disk] if "full" in case else [],
                     room=16384 if case == "nearly full" else 0)
    assert done["status"] == 6, done["stderr"]
    tail = "" if case == "mount" else f"; {NOTHING_LEFT}"
    said = f"bitdrift: error: {out}: cannot be written ({reason}){tail}"
    if case == "nearly full":
        assert re.fullmatch(re.escape(said).replace(re.escape(reason), reason),
                            done["stderr"].strip()), done["stderr"]
    else:
        assert done["stderr"].strip() == said
    assert done["left"] == {str(disk): []}
    assert _written(tmp_path) == ["disk", "records"]


SEQUENTIAL, OTHER = [[0, 1], [3, 2]], [[1, 2], [0, 3]]  # (t0 + t1) + t2, t0 + (t1 + t2)


def _orders(tree, name):
    return {"dense": {"trees": [tree], "terms": 3, "bias": False, "order": name,
                      "replay": "not replayed"}}


WRONG_ORDERS = {
    "a list": ([], "is a list, not an object"),
    "a string": ("sequential", "is a string, not an object"),
    "an int": (3, "is a number, not an object"),
    "an entry that is a string": ({"dense": "sequential"},
                                  "is not an order record (layer 'dense' is a string, not an "
                                  "object)"),
    "a term out of range": (_orders([[0, 9], [3, 2]], "sequential"),
                            "is not an order record (layer 'dense': tree 0, node 0: child 9 "
                            "is neither a term (0..2) nor an earlier node)"),
    "a node out of range": (_orders([[0, 1], [5, 2]], "sequential"),
                            "is not an order record (layer 'dense': tree 0, node 1: child 5 "
                            "is neither a term (0..2) nor an earlier node)"),
    "a node of one operand": (_orders([[0], [3, 1]], "sequential"),
                              "is not an order record (layer 'dense': tree 0, node 0 adds "
                              "fewer than two operands)"),
    "a term added twice": (_orders([[0, 1], [3, 1]], "sequential"),
                           "is not an order record (layer 'dense': tree 0, node 1: child 1 "
                           "is added a second time)"),
    "two sums that never meet": ({"dense": {**_orders(SEQUENTIAL, "sequential")["dense"],
                                            "terms": 4, "trees": [[[0, 1], [2, 3]]]}},
                                 "is not an order record (layer 'dense': tree 0: its nodes do "
                                 "not meet in one sum)"),
    "a place map naming no tree": (
        {"dense": {**_orders(SEQUENTIAL, "sequential")["dense"],
                   "places": {"grid": [1, 1], "searched": [[0, 0, 0]], "maps": [["1"]]}}},
        "is not an order record (layer 'dense': 'places' 'maps' are not 1 rows of 1 tree "
        "symbols each)"),
    "places without a grid": (
        {"dense": {**_orders(SEQUENTIAL, "sequential")["dense"], "places": {"maps": []}}},
        "is not an order record (layer 'dense': 'places' has no 'grid' [height, width])"),
}


@pytest.fixture
def ordered(tmp_path):
    """Records of two devices that part at a Dense layer, summed in other revealed orders,
    with kernels; their divergence table; and a writer of a third whose orders are given."""
    from bitdrift.record.writer import write_record
    from tests.utils import BASE_ATTRS

    def write(device, value, orders):
        path = tmp_path / f"{device}.h5"
        output = np.array([[1.0, 2.0, value]], np.float32)
        write_record(path, {**BASE_ATTRS, "model": "net", "device": device,
                            "accumulation_orders": json.dumps(orders)},
                     {0: {"output": output, "layers": [("dense", output)],
                          "layer_classes": ["Dense"]}},
                     kernels={"traced": True, "layers": {"dense": {"signature": "k",
                                                                   "calls": []}}})
        return path

    good = write("d1", 3.0, _orders(SEQUENTIAL, "sequential"))
    other = write("d2", 3.5, _orders(OTHER, "other"))
    divergence = tmp_path / "divergence.csv"
    assert main(["divergence", str(good), str(other), "--out", str(divergence)]) == 0
    return write, other, divergence


def _order_commands(files, divergence, out):
    return {"kernels": ["kernels", *files, "--out", str(out / "k.csv"), "--orders-out",
                        str(out / "o.csv")],
            "divergence": ["divergence", *files, "--out", str(out / "d.csv")],
            "explain": ["explain", *files, "--out", str(out / "x.csv")],
            "plot-orders": ["plot-orders", *files, "--divergence", str(divergence), "--out",
                            str(out / "o.pdf")]}


@pytest.mark.parametrize("command", ["kernels", "divergence", "explain", "plot-orders"])
@pytest.mark.parametrize("case", list(WRONG_ORDERS))
def test_accumulation_orders_of_the_wrong_type_are_one_line(ordered, tmp_path, capsys,
                                                            command, case):
    """A record from another tool may hold anything in `accumulation_orders`: each command
    that reads it refuses such a record naming the file and the attribute (exit 3), and
    writes none of its outputs (they were AttributeError and IndexError tracebacks)."""
    write, other, divergence = ordered
    value, message = WRONG_ORDERS[case]
    bad = write("d3", 3.0, value)
    out = tmp_path / "out"
    out.mkdir()
    capsys.readouterr()
    assert main(_order_commands([str(bad), str(other)], divergence, out)[command]) == 3
    assert one_line_error(capsys) == \
        f"bitdrift: error: {bad}: attribute 'accumulation_orders' {message}"
    assert _written(out) == []
    # the same record with valid orders goes through: the attribute was the fault
    good = write("d3", 3.0, _orders(SEQUENTIAL, "sequential"))
    assert main(_order_commands([str(good), str(other)], divergence, out)[command]) == 0


WRONG_ATTRIBUTES = [
    # (attribute, value, command, the message after "FILE: ")
    ("effective_precision", [], "eqc", "attribute 'effective_precision' is a list, not an "
                                       "object"),
    ("effective_precision", {"dense": "declared"}, "effective-precision",
     "attribute 'effective_precision': layer 'dense' is a string"),
    ("effective_precision", {"dense": {"reduced": True}}, "effective-precision",
     "attribute 'effective_precision': layer 'dense' is reduced without a number of "
     "'effective_bits'"),
    ("effective_precision", {"dense": {"reduced": "yes"}}, "precision",
     "attribute 'effective_precision': layer 'dense' 'reduced' is not true or false"),
    ("fingerprint", ["host"], "eqc", "root attribute 'fingerprint' is a list, not an object"),
    ("fingerprint", {"cpu": "x86"}, "explain",
     "root attribute 'fingerprint': 'cpu' is a string, not an object"),
    ("fingerprint", {"cpu": {"flags": "avx2 fma"}}, "explain",
     "root attribute 'fingerprint': 'cpu.flags' is a string, not a list"),
    ("fingerprint", {"cpu": {"flags": "avx2 fma"}}, "findings",
     "root attribute 'fingerprint': 'cpu.flags' is a string, not a list"),
    ("fingerprint", {"emulation": "Haswell"}, "findings",
     "root attribute 'fingerprint': 'emulation' is a string, not an object"),
    ("device_config", ["cpu"], "explain", "attribute 'device_config' is a list, not an object"),
    ("device_config", {"env": ["OMP_NUM_THREADS=1"]}, "explain",
     "attribute 'device_config': 'env' is not an object"),
    ("device_config", 4, "plot-generations",
     "attribute 'device_config' is a number, not an object"),
    ("argmax_agreement", [1, 2], "agreement",
     "attribute 'argmax_agreement' is a list, not an object"),
    ("argmax_agreement", {"images": "12"}, "agreement",
     "attribute 'argmax_agreement' has no number 'images', 'agreeing', 'share'"),
    ("unmapped_layers", "dense", "agreement",
     "attribute 'unmapped_layers' is a string, not a list"),
]


@pytest.mark.parametrize("attribute, value, command, message", WRONG_ATTRIBUTES)
def test_every_json_attribute_a_command_reads_is_checked_where_read(
        make_record, tmp_path, capsys, attribute, value, command, message):
    """The sweep: each JSON attribute of a record that a command reads, of the wrong type,
    is one line naming the file and the attribute (exit 3), and no output is left."""
    good = make_record("d1", {0: repeats(A)})
    eqc = tmp_path / "eqc.csv"
    assert main(["eqc", str(good), "--out", str(eqc)]) == 0
    stored = value if attribute == "fingerprint" else json.dumps(value)  # write_record
    bad = make_record("d2", {0: repeats(B)}, **{attribute: stored})  # dumps a fingerprint
    out = tmp_path / "out"
    out.mkdir()
    files = [str(good), str(bad)]
    tables = tmp_path / "tables"  # findings: a run's tables (none here) and its records
    tables.mkdir()
    extra = {"plot-generations": ["--eqc", str(eqc)], "findings": ["--tables", str(tables)]
             }.get(command, [])
    suffix = ".pdf" if command.startswith("plot") else ".md" if command == "findings" \
        else ".csv"
    capsys.readouterr()
    assert main([command, *files, *extra, "--out", str(out / f"o{suffix}")]) == 3
    assert one_line_error(capsys) == f"bitdrift: error: {bad}: {message}"
    assert _written(out) == []


@pytest.mark.parametrize("attribute, value, message", [
    ("samples_order", "0", "attribute 'samples_order' is a string, not a list"),
    ("samples_order", [7], "attribute 'samples_order' is not the record's samples in some "
                           "order ([0])"),
    ("device_config", [], "attribute 'device_config' is a list, not an object"),
    ("device_config", {"backend": "torch"}, "attribute 'device_config' lacks a valid "
                                            "'precision', 'batch_size', 'accelerator'")])
def test_repro_checks_the_attributes_it_reads(parting, tmp_path, capsys, attribute, value,
                                              message):
    import h5py

    (first, second), model, _ = parting
    with h5py.File(second, "r+") as handle:
        handle.attrs[attribute] = json.dumps(value)
    out = tmp_path / "out"
    assert main(["repro", str(first), str(second), "--model-file", str(model), "--out",
                 str(out)]) == 3
    assert one_line_error(capsys) == f"bitdrift: error: {second}: {message}"
    assert not out.exists() and _written(tmp_path) == ["records"]


def _output_commands(files, eqc, out):
    """Commands and the output option each is checked through (a sample of every kind:
    tables, a second table, a figure, an HDF5 index, a folder of tables). ``files``:
    two records, then two training runs."""
    return [(["eqc", *files[:2], "--out", "{}"], "--out"),
            (["eqc", *files[:2], "--out", str(out / "e.csv"), "--layers-out", "{}"],
             "--layers-out"),
            (["explain", *files[:2], "--out", str(out / "x.csv"), "--classes-out", "{}"],
             "--classes-out"),
            (["plot-eqc", *files[:2], "--eqc", str(eqc), "--out", "{}"], "--out"),
            (["index", *files[:2], "--out", "{}"], "--out"),
            (["training-stats", *files[2:], "--out-dir", "{}"], "--out-dir")]


def _records_and_runs(make_record, folder) -> list[str]:
    from tests.utils import write_run

    runs = [write_run(folder / f"run_{run}.h5", run=run, predictions=[0, 1, 1],
                      labels=[0, 1, 0], weights=[1.0, 2.0 + run]) for run in (0, 1)]
    return [str(make_record("d1", {0: repeats(A)})), str(make_record("d2", {0: repeats(B)})),
            *map(str, runs)]


def _with(command, path):
    return [str(path) if part == "{}" else part for part in command]


def test_every_output_goes_through_one_check(make_record, tmp_path, capsys):
    """An output that is a folder (IsADirectoryError), a folder output that is a file, an
    output under a file (FileExistsError): one line naming the option and the path, exit
    2, before anything runs; one under folders that do not exist: they are made."""
    files = _records_and_runs(make_record, tmp_path)
    eqc = tmp_path / "eqc.csv"
    assert main(["eqc", *files[:2], "--out", str(eqc)]) == 0
    out = tmp_path / "out"
    a_folder, a_file = out / "a_folder", out / "a_file"
    a_folder.mkdir(parents=True)
    a_file.write_text("mine")
    capsys.readouterr()
    for command, flag in _output_commands(files, eqc, out):
        in_the_way = a_file if flag == "--out-dir" else a_folder
        what = "is a file, not a folder" if flag == "--out-dir" else \
            "is a folder; give a file name"
        assert main(_with(command, in_the_way)) == 2, command
        assert one_line_error(capsys) == f"bitdrift: error: {flag} {in_the_way} {what}"
        under = a_file / "x.csv"
        assert main(_with(command, under)) == 2, command
        assert one_line_error(capsys) == \
            f"bitdrift: error: {flag} {under}: {a_file} is a file, not a folder"
        assert _written(out) == ["a_file", "a_folder"] and _written(a_folder) == []
        assert a_file.read_text() == "mine"
    for index, (command, flag) in enumerate(_output_commands(files, eqc, out)):
        new = tmp_path / f"new_{index}" / "deeper" / ("tables" if flag == "--out-dir"
                                                      else "x.h5" if command[0] == "index"
                                                      else "x.pdf" if "plot" in command[0]
                                                      else "x.csv")
        assert main(_with(command, new)) == 0, command
        assert new.exists()


@pytest.mark.parametrize("disk", ["read-only", "full"])
def test_every_output_on_a_read_only_or_full_disk_is_one_line(make_record, tmp_path, disk):
    """The same commands with their output on a read-only tmpfs (refused before they run)
    or a full one (met when written): one line naming the path, exit 6, nothing left."""
    from tests.utils import on_mounts

    files = _records_and_runs(make_record, tmp_path)
    eqc = tmp_path / "eqc.csv"
    assert main(["eqc", *files[:2], "--out", str(eqc)]) == 0
    mount = tmp_path / "disk"
    reason = "Read-only file system" if disk == "read-only" else "No space left on device"
    for command, flag in _output_commands(files, eqc, mount):
        if flag != "--out":  # the second output of a pair goes to the disk, the first too
            command = [str(mount / "first.csv") if part.startswith(str(mount)) else part
                       for part in command]
        target = mount / ("tables" if flag == "--out-dir" else "x.h5"
                          if command[0] == "index" else "x.pdf" if "plot" in command[0]
                          else "x.csv")
        done = on_mounts({mount: "ro" if disk == "read-only" else "size=64k"},
                         [sys.executable, "-m", "bitdrift", *_with(command, target)],
                         fill=[mount] if disk == "full" else [])
        assert done["status"] == 6, (command, done["stderr"])
        lines = done["stderr"].strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("bitdrift: error: ") and \
            f": cannot be written ({reason}); {NOTHING_LEFT}" in lines[0], done["stderr"]
        assert str(mount) in lines[0]
        assert done["left"] == {str(mount): []}, command


def _arm_userland(prefix, manifest):
    """A stand-in aarch64 userland under ``prefix`` (sys.prefix in the test): QEMU 10 that
    only answers --version, the root's python and the site as empty files, and
    ``manifest`` as its manifest.json (text, or JSON of anything)."""
    from bitdrift.emulation import aarch64

    (prefix / "bin").mkdir(parents=True)
    qemu = prefix / "bin" / "qemu-aarch64"
    qemu.write_text("#!/bin/sh\necho 'qemu-aarch64 version 10.0.13 (Debian 1:10.0.13)'\n")
    qemu.chmod(0o755)
    built = aarch64.folder(prefix)
    (built / "root" / aarch64.PYTHON).parent.mkdir(parents=True)
    (built / "root" / aarch64.PYTHON).write_text("")
    (built / "site").mkdir()
    (built / aarch64.MANIFEST).write_text(manifest if isinstance(manifest, str)
                                          else json.dumps(manifest))
    return built


def _pins():
    from bitdrift.emulation import aarch64

    return aarch64.requirements(("tensorflow",))


DAMAGED_MANIFESTS = {
    "a list": ([], "not a manifest of `bitdrift install-aarch64` (a list, not an object)"),
    "a string": ("\"litert\"", "not a manifest of `bitdrift install-aarch64` (a string, not "
                               "an object)"),
    "runtimes as a string": ({"runtimes": "tensorflow", "wheels": []},
                             "key 'runtimes' is not a list of runtimes"),
    "wheels as an int": ({"runtimes": ["tensorflow"], "wheels": 3},
                         "key 'wheels' is not a list of pins"),
    "an unknown runtime": ({"runtimes": ["torch"], "wheels": []},
                           "key 'runtimes' names torch, not an aarch64 runtime"),
}


@pytest.mark.parametrize("case", [*DAMAGED_MANIFESTS, "its root removed"])
def test_an_arm_device_with_a_damaged_userland_is_one_line(trained, tmp_path, monkeypatch,
                                                          capsys, case):
    """`infer` on an emulated Arm device whose userland's manifest is of the wrong JSON
    type (AttributeError, KeyError, TypeError) or whose root/ was deleted under a current
    manifest ("repeat 1 failed (exit 1); see log"): one line naming the file, exit 4,
    before any repeat, and no record."""
    import yaml

    folder, _, dataset, model = trained
    monkeypatch.setattr("sys.prefix", str(tmp_path / "env"))
    manifest, problem = DAMAGED_MANIFESTS.get(case, ({"runtimes": ["tensorflow"],
                                                      "wheels": _pins()}, None))
    built = _arm_userland(tmp_path / "env", manifest)
    if problem is None:  # a current manifest, its root gone
        import shutil as _shutil

        _shutil.rmtree(built / "root")
        problem = "the userland lacks root/usr/bin/python3.11 (removed since it was built)"
        named = built
    else:
        named = built / "manifest.json"
    config = tmp_path / "arm.yaml"
    config.write_text(yaml.safe_dump(_config(devices={"arm": {
        "accelerator": "cpu", "backend": "tensorflow", "emulate": "neoverse-n1"}})))
    out = tmp_path / "out" / "arm.h5"
    assert main(["infer", "--config", str(config), "--model", "m", "--device", "arm",
                 "--dataset-file", str(dataset), "--model-file", str(model),
                 "--out", str(out)]) == 4
    assert one_line_error(capsys) == (
        f"bitdrift: error: device key emulate: neoverse-n1: {named}: {problem}; run "
        "`bitdrift install-aarch64` to build it anew")
    assert _written(out.parent) == []


@pytest.mark.parametrize("case", list(DAMAGED_MANIFESTS))
def test_install_aarch64_builds_a_damaged_userland_anew(tmp_path, monkeypatch, capsys, case):
    """install-aarch64 reads the manifest of the build there to keep its runtimes: one
    of the wrong type is named and built anew, not a traceback. (The mirror here is a
    folder that does not exist: the build stops at its first download, exit 7.)"""
    monkeypatch.setattr("sys.prefix", str(tmp_path / "env"))
    built = _arm_userland(tmp_path / "env", DAMAGED_MANIFESTS[case][0])
    mirror = f"file://{tmp_path / 'no-mirror'}"
    assert main(["install-aarch64", "--mirror", mirror]) == 7
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == (f"bitdrift: {built / 'manifest.json'}: {DAMAGED_MANIFESTS[case][1]}; "
                        "building it anew")
    assert len(lines) == 2 and lines[1].startswith(
        f"bitdrift: error: cannot fetch {mirror}/dists/"), lines


def test_install_aarch64_refuses_a_mirror_that_is_no_url(capsys):
    for command in ("install-aarch64", "install-qemu"):
        assert main([command, "--mirror", "not-a-url"]) == 2
        assert one_line_error(capsys) == (
            "bitdrift: error: --mirror 'not-a-url': not the URL of a Debian mirror (e.g. "
            "https://deb.debian.org/debian, or file:///path for a local copy)")


@pytest.mark.parametrize("what", ["a file", "a link"])
def test_a_fork_server_folder_that_is_a_file_is_one_line(trained, tmp_path, monkeypatch,
                                                         capsys, what):
    """The fork servers' socket folder path taken by a regular file (FileExistsError) or a
    link to a folder: refused in one line naming it, as a folder of the wrong owner or
    mode is, before any repeat; the file is left as it was."""
    folder, config, dataset, model = trained
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("BITDRIFT_FRESH_WORKERS", raising=False)
    sockets = tmp_path / f"bitdrift-forkserver-{os.getuid()}"
    if what == "a file":
        sockets.write_text("mine")
    else:
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        sockets.symlink_to(tmp_path / "elsewhere")
    out = tmp_path / "out" / "r.h5"
    assert main(["infer", "--config", str(config), "--model", "m", "--device", "cpu",
                 "--dataset-file", str(dataset), "--model-file", str(model),
                 "--out", str(out)]) == 2
    assert one_line_error(capsys) == (
        f"bitdrift: error: {sockets} is {what}, not a folder private to this user; refusing "
        "to look for fork servers there (remove it, or set BITDRIFT_FRESH_WORKERS=1)")
    assert not out.exists() and _written(out.parent) == []
    assert what == "a link" or sockets.read_text() == "mine"


@pytest.mark.parametrize("attribute, value, why", [
    ("labels", '{"d1": 0}', "attribute 'labels' is not a list of record names"),
    ("entries/0:key", "5", "entries/0: attribute 'key' is not [model, inputs, sample, "
                           "format, shape]"),
    ("entries/0:key", '["m"]', "entries/0: attribute 'key' is not [model, inputs, sample, "
                               "format, shape]")])
def test_an_atlas_index_of_the_wrong_json_type_is_one_line(make_record, tmp_path, capsys,
                                                           attribute, value, why):
    """`identify --index` reads JSON from the index file: of another type, one line
    naming the file (exit 3), not a TypeError or IndexError."""
    first, second = make_record("d1", {0: repeats(A)}), make_record("d2", {0: repeats(B)})
    index = tmp_path / "atlas.h5"
    assert main(["index", str(first), str(second), "--out", str(index)]) == 0
    group, _, name = attribute.rpartition(":")
    with h5py.File(index, "r+") as handle:
        (handle[group] if group else handle).attrs[name or attribute] = value
    capsys.readouterr()
    assert main(["identify", str(first), "--index", str(index)]) == 3
    assert one_line_error(capsys) == \
        f"bitdrift: error: {index}: not a readable atlas index ({why})"


@pytest.mark.parametrize("meta", [[], {"layers": "conv2d", "checked": {}, "check_indices": [],
                                       "argmax_indices": [], "model_sha256": "m"}])
def test_an_export_reference_whose_meta_is_of_another_json_type_is_one_error(tmp_path, meta):
    from bitdrift.backends.exported.expected import read_reference
    from bitdrift.errors import RecordError

    path = tmp_path / "reference.npz"
    np.savez(path, meta=json.dumps(meta), argmax=np.zeros(2, np.int64))
    with pytest.raises(RecordError) as refused:
        read_reference(path)
    assert str(refused.value).startswith(
        f"{path}: not a bitdrift export reference, damaged or of another kind (ValueError: "
        "its meta is not {layers, checked, check_indices, argmax_indices, model_sha256} of "
        "JSON types list, dict, list, list, str)")
