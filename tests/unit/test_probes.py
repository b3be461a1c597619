"""Forensic probes (bitdrift.studies.probes): the search runs only its own devices, probe
files round-trip through inference, and the evaluation's counts and identify answers
equal a count made another way."""

import subprocess
import sys

import h5py
import numpy as np
import pytest
import yaml

from bitdrift.config import ConfigError, load_config
from bitdrift.errors import InferenceError, StudyError
from bitdrift.inputs.datasets import load_source
from bitdrift.record.reader import Record
from bitdrift.run.inference import check_before_repeats
from bitdrift.studies.probes.cli import search_arguments
from bitdrift.studies.probes.evaluation import (
    evaluate_probes,
    evaluation_rows,
    identify,
    partition,
    probe_tables,
    write_evaluation_set,
)
from bitdrift.studies.probes.search import search_probes, write_images
from tests.utils import ROOT

SEARCH = ["tf_1thread", "torch_1thread"]
HELD_OUT = ["tf_sse41", "ort_1thread"]


def _config(folder, **probes):
    """The test config's devices, and a probes section searching on two of them."""
    config = yaml.safe_load((ROOT / "tests/config/config.yaml").read_text())
    for key in ("maxpool", "training_variance", "ablation"):
        config.pop(key, None)
    config["datasets"] = {"digits": config["datasets"]["digits"]}
    config["probes"] = {"model": "small", "search_devices": SEARCH, **probes}
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# -- evaluation on hand-built outputs -----------------------------------------------------
def _outputs(table):
    """{device: rows of one-element outputs} from {device: [values per row]}."""
    return {d: np.array(values, np.float32).reshape(-1, 1) for d, values in table.items()}


def test_partition_classes_and_identify_against_hand_counts():
    # rows 0, 1: natural; row 2: a probe. a=b on every row; c differs from a only on the
    # probe; d=e on natural rows, apart on the probe.
    outputs = _outputs({"a": [1, 5, 7], "b": [1, 5, 7], "c": [1, 5, 8], "d": [2, 6, 9],
                        "e": [2, 6, 10], "f": [3, 6, 9]})
    assert partition(outputs, list(outputs), [0]) == [["a", "b", "c"], ["d", "e"], ["f"]]
    assert partition(outputs, list(outputs), [0, 1, 2]) == [["a", "b"], ["c"], ["d"], ["e"],
                                                            ["f"]]
    truth = partition(outputs, list(outputs), [0, 1, 2])
    # Only a and b share a class; on row 0 a matches b and c (wrong), on row 2 b only.
    assert identify(outputs, list(outputs), [0], ["a", "b", "c"], truth) == {
        "queries": 2, "identified": 0, "accuracy": 0.0}
    assert identify(outputs, list(outputs), [2], list(outputs), truth) == {
        "queries": 2, "identified": 2, "accuracy": 1.0}


def test_probe_tables_count_on_held_out_devices_only():
    outputs = _outputs({"a": [1, 5, 7], "b": [1, 5, 7], "c": [1, 5, 8], "d": [2, 6, 9],
                        "e": [2, 6, 10], "f": [3, 6, 9]})
    tables = probe_tables(outputs, probe_rows=[2], natural_rows=[0, 1],
                          search_devices=["a", "f"])
    assert tables["held_out"] == ["b", "c", "d", "e"]
    by = {row["measure"]: row["classes"] for row in tables["summary"]}
    # On b, c, d, e: the probe gives 7,8,9,10 (4 classes); sample 0 gives 1,1,2,2 (2);
    # both natural samples together still 2.
    assert by["best probe"] == 4
    assert by["best natural sample"] == 2
    assert by["finest partition, all natural samples"] == 2
    assert by["finest partition, natural samples and probes"] == 4
    probe = tables["per_input"][0]
    assert (probe["classes_held_out"], probe["classes_search"], probe["classes_all"]) == \
        (4, 2, 4)  # 7, 8, 9, 10 (f equals d)


# -- the search, on real devices ----------------------------------------------------------
@pytest.fixture(scope="module")
def searched(small_model_copy, tmp_path_factory):
    """Probes searched on tf_1thread and torch_1thread for an untrained Cifar10-small, with
    every file the search opens in this process noted (Python's open and h5py.File)."""
    folder = tmp_path_factory.mktemp("probes")
    dataset, model = small_model_copy(folder)
    config = load_config(_config(folder, probes=2, generations=1, population=8))
    # Records of the held-out devices where the workflow keeps them: the search must not
    # open them (nor anything else of those devices).
    opened = []

    def audit(event, args):
        if event == "open" and opened is not None and isinstance(args[0], (str, bytes)):
            opened.append(str(args[0]))

    sys.addaudithook(audit)
    real_file = h5py.File

    class NotingFile(real_file):  # the real h5py.File, noting its path
        def __init__(self, name, *args, **kwargs):
            opened.append(str(name))
            super().__init__(name, *args, **kwargs)

    h5py.File = NotingFile
    try:
        out = folder / "probes.h5"
        provenance = search_probes(**search_arguments(config, str(model), str(dataset)),
                                   out=out)
    finally:
        h5py.File = real_file
    seen = list(opened)
    opened.clear()
    opened = None  # the hook stays installed (it cannot be removed) but notes nothing
    return {"folder": folder, "dataset": dataset, "model": model, "out": out,
            "provenance": provenance, "opened": seen, "config": config}


def test_the_search_never_runs_or_reads_a_held_out_device(searched):
    assert searched["provenance"]["devices"] == SEARCH
    assert any(path.endswith("tf_1thread.h5") for path in searched["opened"])
    touched = [path for path in searched["opened"] if any(d in path for d in HELD_OUT)]
    assert touched == []
    with h5py.File(searched["out"], "r") as handle:
        assert sorted(handle["search_outputs"]) == sorted(SEARCH)


def test_probes_are_valid_inputs_and_scored_by_their_search_outputs(searched):
    data = load_source({"source": "probes", "path": str(searched["out"])})
    probes = data["x_test"]
    assert probes.shape == (2, 32, 32, 3) and probes.dtype == np.float32
    assert probes.min() >= 0.0 and probes.max() <= 1.0
    with h5py.File(searched["out"], "r") as handle:
        outputs = {d: handle["search_outputs"][d][()] for d in SEARCH}
    for k, score in enumerate(searched["provenance"]["scores"]):
        assert score == len({outputs[d][k].tobytes() for d in SEARCH})


@pytest.mark.parametrize("device", SEARCH)
def test_a_probe_file_round_trips_through_inference(searched, device, tmp_path):
    """`bitdrift infer` on the probe file as the dataset gives, bit for bit, the outputs
    the search saw on that device."""
    out = tmp_path / f"{device}.h5"
    config = _config(tmp_path)  # samples [0, 1]: both probes
    subprocess.run([sys.executable, "-m", "bitdrift", "infer", "--config", str(config),
                    "--model", "small", "--device", device, "--model-file",
                    str(searched["model"]), "--dataset-file", str(searched["out"]),
                    "--out", str(out)], check=True, cwd=tmp_path)
    with h5py.File(searched["out"], "r") as handle:
        expected = handle["search_outputs"][device][()]
    with Record(out) as record:
        for k in (0, 1):
            values = record.tensor(k, "output").values
            assert all(repeat.tobytes() == expected[k].tobytes() for repeat in values)


def test_evaluation_counts_equal_a_count_from_the_records(searched, tmp_path):
    """Every device runs the evaluation set (probes, then the natural samples) through the
    core's inference; the classes on the held-out devices are recounted from the records
    with numpy."""
    from bitdrift.run.inference import infer

    config = searched["config"]
    evaluation = tmp_path / "evaluation.h5"
    write_evaluation_set(searched["out"], searched["dataset"], evaluation)
    probe_rows, natural_rows = evaluation_rows(evaluation)
    assert (probe_rows, natural_rows) == ([12, 13], list(range(12)))  # 12 test images
    rows = probe_rows + natural_rows
    records = []
    for device in SEARCH + HELD_OUT:
        record = tmp_path / f"{device}.h5"
        export = reference = None
        if device == "ort_1thread":  # an exported runtime: the ONNX file and its reference
            from bitdrift.backends.keras.export import export_model, write_reference

            export, reference = tmp_path / "model.onnx", tmp_path / "reference.npz"
            export_model(searched["model"], "onnx", export)
            write_reference(searched["model"], searched["dataset"], reference)
        infer(model_name="small", device_name=device, device=config["devices"][device],
              model_path=searched["model"], dataset_path=evaluation, samples=rows,
              out=record, layers=False, kernels=False, export=export, reference=reference)
        records.append(record)
    out = {"classes": tmp_path / "c.csv", "summary": tmp_path / "s.csv",
           "identify": tmp_path / "i.csv", "figure": tmp_path / "probes.pdf"}
    tables = evaluate_probes(searched["out"], evaluation, records, out)
    raw = {}
    for path in records:
        with h5py.File(path, "r") as handle:
            device = handle.attrs["device"]
            raw[device] = [handle[f"samples/{row}/output"][0].tobytes() for row in rows]
    for row, entry in zip(rows, tables["per_input"], strict=True):
        assert entry["classes_held_out"] == len({raw[d][row] for d in HELD_OUT})
        assert entry["classes_all"] == len({raw[d][row] for d in raw})
    assert (tmp_path / "probes.png").stat().st_size > 0
    assert out["identify"].read_text().startswith("inputs,count,which,queried")


def test_a_device_set_with_one_class_stops_at_once(small_model_copy, tmp_path):
    dataset, model = small_model_copy(tmp_path)
    device = load_config(_config(tmp_path))["devices"]["tf_1thread"]
    with pytest.raises(StudyError, match="nothing to separate"):
        search_probes(model_name="small", model_path=model, dataset_path=dataset,
                      devices={"tf_1thread": device, "tf_1thread_again": dict(device)},
                      generations=3, out=tmp_path / "probes.h5")
    assert not (tmp_path / "probes.h5").exists()


def test_a_probe_file_of_another_input_shape_is_refused_naming_both(searched, tmp_path):
    other = tmp_path / "probes16.h5"
    write_images(np.zeros((2, 16, 16, 3), np.float32), other, attrs={"source": "probes"})
    with pytest.raises(InferenceError) as error:
        check_before_repeats(searched["model"], other, [0, 1], tmp_path / "r.h5")
    message = str(error.value)
    assert "(16, 16, 3)" in message and "(32, 32, 3)" in message and "\n" not in message


@pytest.mark.parametrize(("change", "key"), [
    ({"model": "nope"}, "probes.model"),
    ({"search_devices": ["tf_1thread", "gpu_x"]}, "probes.search_devices"),
    ({"search_devices": ["tf_1thread", "torch_1thread", "tf_sse41", "ort_1thread",
                         "torch_haswell", "ort_neoverse_n1"]}, "two scheduled"),
    # only tf_gpu left
    ({"search_devices": ["tf_1thread", "tf_gpu"]}, "one job on one node"),
])
def test_bad_probe_sections_are_refused_naming_the_key(tmp_path, change, key):
    path = _config(tmp_path)
    config = yaml.safe_load(path.read_text())
    config["devices"]["tf_gpu"] = {"accelerator": "gpu", "backend": "tensorflow"}
    config["probes"].update(change)
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=key):
        load_config(path)
