"""The shared local run of the workflow tests (the reference for the SLURM test).

Tests read the session's run; a test that changes results works on its own copy
(:func:`copy_run`), so no test depends on what another one did to the shared workdir.
"""

import shutil

import pytest

from tests.utils import ROOT, snakemake, write_inputs


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


@pytest.fixture
def own_run(run, tmp_path):
    """A private copy of the session's run (files, timestamps and Snakemake's metadata)."""
    workdir, config = run
    copy = tmp_path / "workflow"
    shutil.copytree(workdir, copy, symlinks=True)
    return copy, copy / config.name
