"""Snakemake runs shared by the workflow tests (the local run is the reference for SLURM)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def snakemake(workdir, *args, configfile, timeout=1200, executor=("--cores", "2"), env=None,
              check=True):
    """Run the workflow in `workdir`; `configfile` is one path or a list (later ones
    overlay earlier ones). With check=False the completed process is returned as is."""
    configfiles = configfile if isinstance(configfile, list) else [configfile]
    command = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
               "-d", str(workdir), "--configfile", *map(str, configfiles), *executor, *args]
    # On timeout subprocess.run kills snakemake outright: on SIGTERM it would wait for
    # running jobs, and a stuck cluster must fail the test, not hang it.
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env=None if env is None else {**os.environ, **env})
    if not check:
        return result
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout + result.stderr


def write_inputs(workdir):
    """Input files the test config names: a tiny CelebA folder in the real CSV layout
    (24 train and 12 test images; blond, male and young drawn at random)."""
    from tests.unit.test_datasets import make_celeba

    rng = np.random.default_rng(1)
    rows = [(f"{i:06d}.jpg", 0 if i <= 24 else 2, *rng.choice([1, -1], size=3))
            for i in range(1, 37)]
    make_celeba(Path(workdir) / "celeba", rows)


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """The tiny test config, run locally once per session."""
    workdir = tmp_path_factory.mktemp("workflow")
    config = workdir / "config.yaml"
    shutil.copy(ROOT / "tests/config/config.yaml", config)
    write_inputs(workdir)
    snakemake(workdir, "all", configfile=config)
    snakemake(workdir, "--report", str(workdir / "results/report.html"), configfile=config)
    return workdir, config
