"""The tiny test config end to end through Snakemake: tables, figures, report, incremental."""

import subprocess
import sys
import zipfile

import h5py
import numpy as np
import pandas as pd
import pytest
import yaml

from bitdrift.eqc import EQC_COLUMNS, PRECISION_COLUMNS

from .conftest import snakemake

pytestmark = pytest.mark.workflow


def test_tables_follow_the_contract_and_agree(run):
    workdir, config = run
    settings = yaml.safe_load(config.read_text())
    devices, samples = list(settings["devices"]), settings["samples"]
    eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
    assert list(eqc.columns) == EQC_COLUMNS
    assert len(eqc) == len(devices) * len(samples)
    assert eqc["device"].tolist()[: len(devices)] == devices  # config order
    assert eqc.groupby("sample")["eqc"].apply(lambda s: s.iloc[0]).eq(1).all()
    assert eqc["deterministic"].all()
    # TensorFlow and torch kernels differ: more than one class per sample
    assert (eqc.groupby("sample")["eqc"].max() > 1).all()
    precision = pd.read_csv(workdir / "results/tables/precision.csv")
    assert list(precision.columns[: len(PRECISION_COLUMNS)]) == PRECISION_COLUMNS
    output_rows = precision[precision["layer"] == "output"].set_index("sample")
    for sample, rows in eqc.groupby("sample"):
        assert output_rows.loc[sample, "n_eqc"] == rows["eqc"].nunique()
        assert output_rows.loc[sample, "remaining_precision"] < 23
    assert precision["remaining_precision"].between(0, 23).all()
    assert (precision["remaining_precision_uncapped"] >= precision["remaining_precision"]).where(
        precision["remaining_precision"] > 0, True).all()
    per_layer = pd.read_csv(workdir / "results/tables/eqc_layers.csv")
    assert set(per_layer["layer"]) == set(precision["layer"])


def test_figures_and_report_exist(run):
    workdir, _ = run
    for name in ("eqc.pdf", "remaining_precision.pdf", "backprop_variation.pdf",
                 "bifurcation_volume.pdf", "maxpool_training.pdf"):
        data = (workdir / "results/figures" / name).read_bytes()
        assert data.startswith(b"%PDF") and len(data) > 5000
    report = (workdir / "results/report.html").read_text(errors="replace")
    assert "eqc.pdf" in report and "remaining_precision.pdf" in report
    assert "maxpool_training.pdf" in report


def test_maxpool_tables(run):
    workdir, _ = run
    zero = pd.read_csv(workdir / "results/tables/maxpool_zero_program.csv")
    at_zero = zero[(zero["x"] == "x1") & (zero["t"] == 0.0)]
    assert set(at_zero["derivative"].abs()) == {1.5}  # Tables 1 and 3 at every precision
    volume = pd.read_csv(workdir / "results/tables/bifurcation_volume.csv")
    assert volume["setting"].tolist() == ["lenet5_b16_fp32"]
    assert volume[["M", "R"]].values.tolist() == [[2, 2]]
    assert volume["share_batches"].between(0, 1).all()


def test_adding_a_device_recomputes_only_that_device(run):
    workdir, config = run
    settings = yaml.safe_load(config.read_text())
    settings["devices"]["torch_2threads"] = {"accelerator": "cpu", "backend": "torch",
                                             "threads": 2, "repeats": 1}
    extended = workdir / "extended.yaml"
    extended.write_text(yaml.safe_dump(settings))
    dry_run = snakemake(workdir, "all", "-n", configfile=extended)
    jobs = {line.split()[0]: int(line.split()[1]) for line in dry_run.splitlines()
            if len(line.split()) == 2 and line.split()[1].isdigit()}
    assert jobs.get("run_inference") == 1
    assert "prepare_dataset" not in jobs and "train_model" not in jobs
    assert jobs.get("cluster_equivalence_classes") == 1


def tampered_copy(model, target):
    """The model with one weight changed in its last bits: what a record made from a
    slightly different model (another training, another checkpoint) would carry."""
    with zipfile.ZipFile(model) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    weights = target.with_suffix(".weights.h5")
    weights.write_bytes(members["model.weights.h5"])
    with h5py.File(weights, "r+") as handle:
        kernels = []
        handle.visititems(lambda name, obj: kernels.append(obj)
                          if isinstance(obj, h5py.Dataset) and obj.ndim == 2 else None)
        values = kernels[-1][()]
        values.flat[0] = np.nextafter(values.flat[0], np.float32(np.inf))
        kernels[-1][...] = values
    members["model.weights.h5"] = weights.read_bytes()
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def bitdrift_infer(workdir, config, device, *args):
    command = [sys.executable, "-m", "bitdrift.cli", "infer", "--config", str(config),
               "--model", "small", "--device", device, *args]
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def test_external_device_is_merged_and_a_mismatched_one_refused(run, tmp_path):
    workdir, config = run
    settings = yaml.safe_load(config.read_text())
    settings["devices"]["laptop"] = {"accelerator": "cpu", "backend": "torch", "threads": 1,
                                     "repeats": 1, "external": True}
    extended = workdir / "external.yaml"
    extended.write_text(yaml.safe_dump(settings))
    record = workdir / "results/inference/small/laptop.h5"
    # Measured "off-cluster": the same command a user runs on the other machine.
    bitdrift_infer(workdir, extended, "laptop", "--out", str(record))
    dry_run = snakemake(workdir, "all", "-n", configfile=extended)
    assert "run_inference" not in dry_run  # never scheduled
    snakemake(workdir, "all", configfile=extended)
    eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
    laptop, torch = (eqc[eqc["device"] == name].set_index("sample")["eqc"]
                     for name in ("laptop", "torch_1thread"))
    assert laptop.equals(torch)  # same software, same machine: same class

    tampered = tmp_path / "tampered.keras"
    tampered_copy(workdir / "results/models/small/seed_3/model.keras", tampered)
    bitdrift_infer(workdir, extended, "laptop", "--out", str(record),
                   "--model-file", str(tampered))
    result = snakemake(workdir, "results/tables/eqc.csv", configfile=extended, check=False)
    assert result.returncode != 0
    log = (workdir / "logs/cluster_equivalence_classes/all.log").read_text()
    assert "laptop.h5: device 'laptop' was run on another model" in log, log
    record.unlink()  # leave the shared run as it was for the other tests
    snakemake(workdir, "all", configfile=config)
