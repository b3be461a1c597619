"""The importer of the study's published records (bitdrift.atlas.published) on a subset of them
committed in tests/data/unanticipated/ (SOURCE.md): bitdrift's classes, remaining
precision and identify against numpy computed from the JSON files directly."""

import base64
import csv
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from bitdrift.atlas.published import MODEL_FILES
from bitdrift.cli import main
from bitdrift.record.reader import Record

DATA = Path(__file__).parents[1] / "data" / "unanticipated" / "equivalence_classes"
MODEL = "cifar10_medium"


def _decoded(entry) -> np.ndarray:
    """Their convert_json_to_np, written again here."""
    return np.frombuffer(base64.b64decode(entry["bytes"]), dtype=entry["dtype"]) \
        .reshape(entry["shape"])


def _truth():
    """Per sample: platform (CLOUD/KIND/HOST-DEVICE) -> the bytes of their published
    prediction (a GPU's: their most frequent run), straight from the JSON files."""
    found = {}
    for path in sorted(DATA.glob("*/*/*.json")):
        platform, _, rest = str(path.relative_to(DATA)).rpartition(f"-{MODEL}-i")
        entry = json.loads(path.read_text())["prediction"]
        found.setdefault(int(rest.removesuffix(".json")), {})[platform] = \
            _decoded(entry).tobytes()
    return found


def _partition(by_platform: dict) -> set:
    """Which platforms share identical bytes, as a set of frozensets."""
    groups = {}
    for platform, key in by_platform.items():
        groups.setdefault(key, set()).add(platform)
    return {frozenset(group) for group in groups.values()}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("published") / "records"
    assert main(["import-published", str(DATA), "--out", str(out)]) == 0
    return out


def _platform(record: Record) -> str:
    """The platform a record came from, as its published files name it."""
    files = json.loads(record.attr("published_source"))["files"]
    return files[0].rpartition(f"-{MODEL}-i")[0]


def test_one_record_per_platform_with_the_runs_as_repeats(imported):
    records = sorted((imported / MODEL).glob("*.h5"))
    platforms = {path.parent.relative_to(DATA).as_posix() + "/" +
                 path.name.rpartition(f"-{MODEL}-i")[0] for path in DATA.glob("*/*/*.json")}
    assert len(records) == len(platforms) == 18
    for path in records:
        with Record(path) as record:
            assert record.samples == [0, 1, 6] and record.precision == "float32"
            assert record.attr("model_sha256") == MODEL_FILES[MODEL][1]
            source = DATA / json.loads(record.attr("published_source"))["files"][0]
            published = json.loads(source.read_text())
            runs = record.tensor(0, "output").values
            # every run of the file as a repeat, in the file's order
            expected = _decoded(published.get("all_predictions", published["prediction"]))
            assert runs.dtype == np.float32
            np.testing.assert_array_equal(runs, expected.reshape(runs.shape))
            assert record.fingerprint["cpu"]["brand"] == published["cpu_info"]["brand_raw"]
            if "gpu" in path.name:
                assert record.fingerprint["accelerator"]["name"] == \
                    published["device"]["physical_description"]["name"]
    # the Tesla M60's 10 runs of sample 0: 10 repeats read back, the distinct ones stored
    # once each (record format 4), as many as numpy finds in the file
    path = imported / MODEL / "aws-gpu-g3s.xlarge-Tesla_M60.h5"
    source = next(DATA.glob("aws/gpu/g3s.xlarge-Tesla_M60-*-i0.json"))
    runs = _decoded(json.loads(source.read_text())["all_predictions"])
    with Record(path) as record:
        assert record.tensor(0, "output").values.shape == (10, 10)
    with h5py.File(path) as handle:
        assert handle["samples/0/output"].shape[0] == len(np.unique(runs.reshape(10, -1),
                                                                     axis=0)) > 1


def test_eqc_classes_equal_numpy_grouping_of_the_published_predictions(imported, tmp_path):
    records = sorted(str(path) for path in (imported / MODEL).glob("*.h5"))
    assert main(["eqc", *records, "--out", str(tmp_path / "eqc.csv")]) == 0
    with open(tmp_path / "eqc.csv") as handle:
        rows = list(csv.DictReader(handle))
    platforms = {}
    for path in records:
        with Record(path) as record:
            platforms[record.device] = _platform(record)
    truth = _truth()
    counts = {}
    for sample, by_platform in truth.items():
        found = {}
        for row in rows:
            if int(row["sample"]) == sample:
                found.setdefault(row["eqc"], set()).add(platforms[row["device"]])
        # The same platforms together, so the same number of classes: bitdrift's majority
        # of the runs (first seen among ties) is their published prediction here, the
        # M60's 5-to-5 split of sample 0 included
        assert {frozenset(group) for group in found.values()} == _partition(by_platform)
        counts[sample] = len(found)
    assert counts == {0: 12, 1: 13, 6: 13}
    # not deterministic: their count of the most frequent run is below the runs
    for sample in truth:
        found = {platforms[row["device"]] for row in rows
                 if int(row["sample"]) == sample and row["deterministic"] == "False"}
        expected = set()
        for path in DATA.glob(f"*/gpu/*-{MODEL}-i{sample}.json"):
            published = json.loads(path.read_text())
            if published["count"] < len(_decoded(published["all_predictions"])):
                expected.add(str(path.relative_to(DATA)).rpartition(f"-{MODEL}-i")[0])
        assert found == expected and found


def test_precision_and_identify_run_on_the_imported_records(imported, tmp_path, capsys):
    records = sorted((imported / MODEL).glob("*.h5"))
    cpus = [str(path) for path in records if "-cpu-" in path.name]
    assert main(["precision", *cpus, "--out", str(tmp_path / "p.csv"),
                 "--workers", "1"]) == 0
    with open(tmp_path / "p.csv") as handle:
        rows = {int(row["sample"]): row for row in csv.DictReader(handle)}
    truth = _truth()
    for sample, row in rows.items():
        outputs = np.stack([np.frombuffer(key, np.float32) for platform, key
                            in truth[sample].items() if "/cpu/" in platform])
        bits = outputs.view(np.uint32)
        # the study's definition: the fewest low bits whose dropping makes every CPU agree
        dropped = next(i for i in range(33) if (bits >> i == bits[0] >> i).all())
        assert int(row["n_eqc"]) == len(set(truth[sample][p] for p in truth[sample]
                                            if "/cpu/" in p))
        assert int(row["remaining_precision_uncapped"]) == 23 - dropped
        assert float(row["remaining_precision"]) == max(0, 23 - dropped)
    # Haswell on AWS and on Google Cloud give the same bits
    unknown = imported / MODEL / "gcloud-cpu-intel_haswell_4-Intel_Xeon.h5"
    others = [str(path) for path in records if path != unknown]
    assert main(["identify", str(unknown), "--against", *others]) == 0
    said = capsys.readouterr().out
    assert "matched" in said and "aws-cpu-c4.xlarge-Intel_Xeon_E5-2666_v3" in said


def test_a_damaged_file_is_one_line_naming_it(tmp_path, capsys):
    folder = tmp_path / "equivalence_classes"
    shutil.copytree(DATA, folder)
    damaged = folder / "aws" / "cpu" / \
        "c4.xlarge-Intel_Xeon__E5-2666_v3_-cifar10_medium-i1.json"
    damaged.write_text(damaged.read_text()[:500])  # truncated
    out = tmp_path / "records"
    assert main(["import-published", str(folder), "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(damaged) in err[0] and "not readable JSON" in err[0]
    assert not out.exists()  # nothing written
    damaged.write_text(json.dumps({**json.loads((DATA / damaged.relative_to(folder))
                                                .read_text()), "model_type": "resnet"}))
    assert main(["import-published", str(folder), "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(damaged) in err[0] and "model_type 'resnet'" in err[0]
    unknown = folder / "aws" / "cpu" / "c4.xlarge-Intel_Xeon__E5-2666_v3_-vgg16-i1.json"
    damaged.rename(unknown)
    assert main(["import-published", str(folder), "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(unknown) in err[0] and "unknown model 'vgg16'" in err[0]


def test_an_existing_record_or_other_samples_are_refused_in_one_line(imported, tmp_path,
                                                                      capsys):
    # a second import into the same folder never overwrites a record
    before = (imported / MODEL / "aws-gpu-g3s.xlarge-Tesla_M60.h5").read_bytes()
    assert main(["import-published", str(DATA), "--out", str(imported)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists; refusing to overwrite it" in err[0]
    assert (imported / MODEL / "aws-gpu-g3s.xlarge-Tesla_M60.h5").read_bytes() == before
    # nor into the folder it reads
    assert main(["import-published", str(DATA), "--out", str(DATA)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is also an input" in err[0]
    # their clone's root, not its results
    clone = tmp_path / "unaNNticipated"
    shutil.copytree(DATA, clone / "experiments" / "results" / "equivalence_classes")
    assert main(["import-published", str(clone), "--out", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "experiments/results/equivalence_classes" in err[0]
    # --datasets: a samples.npy that is not the published one
    samples = tmp_path / "datasets" / "cifar10" / "samples.npy"
    samples.parent.mkdir(parents=True)
    np.save(samples, np.zeros((8, 32, 32, 3), np.float32))
    assert main(["import-published", str(DATA), "--out", str(tmp_path / "out"),
                 "--datasets", str(tmp_path / "datasets")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(samples) in err[0] and "not the published" in err[0]
    assert not (tmp_path / "out").exists()
