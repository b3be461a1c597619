"""A finished run in a checkout, moved or copied whole with its results, is finished where
it lands: the jobs of the reference model (bitdrift.inputs.reference_set, the atlas's
model) named their inputs and the atlas by absolute path, so Snakemake ran them again
('Set of input files has changed since last execution')."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bitdrift import paths
from tests.utils import copy_checkout

pytestmark = pytest.mark.workflow
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
TARGETS = [paths.atlas_record_file("tf_1thread"), paths.table_file("atlas")]


def snakemake_in(checkout: Path, *args) -> subprocess.CompletedProcess:
    # The checkout's own library: the Snakefile puts its src/ first, and so do its jobs
    return subprocess.run([SNAKEMAKE, *TARGETS, "--cores", "2", *args, "--configfile",
                           "tiny.yaml"], cwd=checkout, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(checkout / "src")})


def test_a_finished_checkout_moved_elsewhere_reruns_nothing(tmp_path):
    checkout = copy_checkout(tmp_path / "checkout")
    (checkout / "tiny.yaml").write_text(yaml.safe_dump({
        "samples": [0, 1], "analysis": {"precision": "float32"},
        "datasets": {"digits": {"source": "digits", "limit_train": 64, "limit_test": 8}},
        "models": {"small": {"architecture": "cifar10_small", "dataset": "digits",
                             "train": {"epochs": 1, "batch_size": 32, "seeds": [3]}}},
        "devices": {"tf_1thread": {"accelerator": "cpu", "backend": "tensorflow",
                                   "threads": 1}},
        "atlas": {"devices": ["tf_1thread"]}}))
    ran = snakemake_in(checkout)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "run_inference" in ran.stdout + ran.stderr
    moved = tmp_path / "elsewhere" / "checkout"
    shutil.copytree(checkout, moved, symlinks=True)  # timestamps kept, as `mv` or `cp -a`
    shutil.rmtree(checkout)  # nothing of the old place is left to be read
    planned = snakemake_in(moved, "-n")
    said = planned.stdout + planned.stderr
    assert planned.returncode == 0, said[-3000:]
    assert "Nothing to be done" in said, said[-3000:]
