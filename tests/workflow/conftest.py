"""Snakemake runs shared by the workflow tests (the local run is the reference for SLURM)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

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


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """The tiny test config, run locally once per session."""
    workdir = tmp_path_factory.mktemp("workflow")
    config = workdir / "config.yaml"
    shutil.copy(ROOT / "tests/config/config.yaml", config)
    snakemake(workdir, "all", configfile=config)
    snakemake(workdir, "--report", str(workdir / "results/report.html"), configfile=config)
    return workdir, config
