"""The tiny test config end to end through Snakemake: tables, figures, report, incremental."""

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bitdrift.eqc import EQC_COLUMNS, PRECISION_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.workflow


def snakemake(workdir, *args, configfile):
    command = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d",
               str(workdir), "--configfile", str(configfile), "--cores", "2", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("workflow")
    config = workdir / "config.yaml"
    shutil.copy(ROOT / "tests/config/config.yaml", config)
    snakemake(workdir, "all", configfile=config)
    snakemake(workdir, "--report", str(workdir / "results/report.html"), configfile=config)
    return workdir, config


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
    for name in ("eqc.pdf", "remaining_precision.pdf"):
        data = (workdir / "results/figures" / name).read_bytes()
        assert data.startswith(b"%PDF") and len(data) > 5000
    report = (workdir / "results/report.html").read_text(errors="replace")
    assert "eqc.pdf" in report and "remaining_precision.pdf" in report


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
