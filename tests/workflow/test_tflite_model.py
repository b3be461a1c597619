"""A user's own LiteRT .tflite (converted here from a Keras model by TensorFlow's LiteRT
converter) with its own .npy inputs through the workflow, on LiteRT with XNNPACK and with
its reference kernels: no training or export rule, every tensor recorded by its name, and
eqc and divergence on those records; a .pt2 program litert-torch cannot convert
(torch.linalg.det) fails the LiteRT devices alone, the op in the failure record, while
torch eager runs it."""

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from bitdrift.record.reader import Record
from tests.unit.test_pt2_runtimes import Determinant
from tests.utils import snakemake

pytestmark = pytest.mark.workflow
DEVICES = {
    "litert_xnnpack": {"accelerator": "cpu", "backend": "litert", "threads": 1, "repeats": 2},
    "litert_reference": {"accelerator": "cpu", "backend": "litert", "threads": 1,
                         "op_resolver": "reference", "repeats": 2},
    "eager": {"accelerator": "cpu", "backend": "torch_export", "threads": 1, "repeats": 1},
}
SAMPLES = [0, 1, 3]


@pytest.fixture(scope="module")
def tflite_run(tflite_model_copy, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tflite_workflow")
    tflite_model_copy(workdir)
    rng = np.random.default_rng(3)
    np.save(workdir / "inputs.npy", rng.standard_normal((6, 6)).astype(np.float32))
    torch.export.save(torch.export.export(Determinant().eval(), (torch.zeros(2, 4),),
                                          dynamic_shapes=({0: torch.export.Dim("batch")},)),
                      workdir / "det.pt2")
    np.save(workdir / "det.npy", rng.standard_normal((6, 4)).astype(np.float32))
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump({
        "samples": SAMPLES, "analysis": {"precision": "float32"}, "devices": DEVICES,
        "models": {"mine": {"file": "model.tflite", "inputs": "inputs.npy"},
                   "det": {"file": "det.pt2", "inputs": "det.npy"}}}))
    result = snakemake(workdir, "all", configfile=config, check=False)
    return workdir, result.returncode, result.stdout + result.stderr


def test_litert_runs_the_tflite_and_fails_the_program_it_cannot_convert(tflite_run):
    workdir, returncode, said = tflite_run
    assert returncode != 0 and "2 device(s) failed" in said, said[-3000:]
    for rule in ("train_model", "export_model", "export_reference", "prepare_dataset"):
        assert f"rule {rule}:" not in said
    records = sorted(path.relative_to(workdir / "results/inference").as_posix()
                     for path in (workdir / "results/inference").rglob("*.h5"))
    assert records == ["det/eager.h5", "mine/litert_reference.h5", "mine/litert_xnnpack.h5"]
    failures = pd.read_csv(workdir / "results/tables/device_failures.csv")
    assert sorted(failures[["model", "device"]].values.tolist()) == [
        ["det", "litert_reference"], ["det", "litert_xnnpack"]]
    assert all("litert_torch.convert (litert-torch 0.10.0" in reason and
               "Lowering not found: aten._linalg_det.default" in reason
               for reason in failures["reason"])


def test_the_device_that_cannot_run_the_tflite_is_named(tflite_run):
    """Issue 63: torch eager cannot run a .tflite model; it was left out without a word
    and the findings counted the devices that ran as if it had never been configured. Now
    the run names it at its start and findings.md in its Machine section."""
    workdir, _, said = tflite_run
    skipped = ("skipped for model mine: torch_export cannot run a LiteRT .tflite flatbuffer "
               "(device eager)")
    assert f"bitdrift: {skipped}\n" in said
    findings = (workdir / "results/findings.md").read_text()
    assert f"- S{skipped[1:]}.\n" in findings
    assert "skipped for model det" not in said  # every device runs the .pt2 program


def test_eqc_and_divergence_read_the_tensors_by_their_names(tflite_run):
    workdir, _, _ = tflite_run
    records = {device: Record(workdir / f"results/inference/mine/{device}.h5")
               for device in ("litert_xnnpack", "litert_reference")}
    try:
        names = [info.name for info in records["litert_xnnpack"].layers(0)]
        assert names == [info.name for info in records["litert_reference"].layers(0)]
        eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
        mine = eqc[eqc["model"] == "mine"]
        divergence = pd.read_csv(workdir / "results/tables/divergence.csv")
        for sample in SAMPLES:
            # the classes recounted from the records' final outputs, bit for bit
            outputs = {device: record.tensor(sample, "output").values[0].tobytes()
                       for device, record in records.items()}
            assert mine[mine["sample"] == sample]["eqc"].nunique() == len(set(outputs.values()))
            rows = divergence[(divergence["model"] == "mine") & (divergence["sample"] == sample)]
            parted = [name for name in names if not np.array_equal(
                records["litert_xnnpack"].tensor(sample, name).values[0],
                records["litert_reference"].tensor(sample, name).values[0])]
            if len(set(outputs.values())) > 1:
                assert rows["first_layer"].tolist() == [parted[0]]
    finally:
        for record in records.values():
            record.close()
