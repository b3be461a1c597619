import contextlib
import os
import shutil
import signal
import tempfile

import numpy as np
import pytest

from bitdrift.record.writer import write_record
from tests.utils import BASE_ATTRS, ROOT, fork_servers_in, snakemake, write_inputs


@pytest.fixture(scope="session", autouse=True)
def private_fork_servers():
    """The session's fork servers (bitdrift.run.fork_server: a test's inference or training
    starts one) listen in a folder of its own, never among a user's, and end with it."""
    folder = tempfile.mkdtemp(prefix="bdts")  # short: a socket's path holds 107 bytes
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_RUNTIME_DIR", folder)
        yield folder
    for pid in fork_servers_in(folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def make_record(tmp_path):
    """Write a record for a device from {sample: output repeats array} (and layers)."""

    def make(device, outputs, model="net", layers=None, **attrs):
        samples = {}
        for sample, values in outputs.items():
            content = {"output": np.asarray(values)}
            if layers is not None:
                content["layers"] = [(name, np.asarray(v)) for name, v in layers[sample]]
            samples[sample] = content
        path = tmp_path / f"{model}_{device}.h5"
        write_record(path, {**BASE_ATTRS, "model": model, "device": device, **attrs}, samples)
        return path

    return make


# -- the workflow: one local run per session (the reference for the SLURM test) ----------
# Tests read the session's run; a test that changes results works on its own copy
# (`own_run`), so no test depends on what another did to the shared workdir.
@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """The tiny test config, run locally once per session."""
    workdir = tmp_path_factory.mktemp("workflow")
    config = workdir / "config.yaml"
    shutil.copy(ROOT / "tests/config/config.yaml", config)
    write_inputs(workdir)
    # A run of `all` ends by writing the report (the Snakefile's onsuccess: write_report)
    said = snakemake(workdir, "all", configfile=config)
    assert "bitdrift: report written: results/report.html" in said, said[-3000:]
    return workdir, config


@pytest.fixture
def own_run(run, tmp_path):
    """A private copy of the session's run (files, timestamps and Snakemake's metadata)."""
    workdir, config = run
    copy = tmp_path / "workflow"
    shutil.copytree(workdir, copy, symlinks=True)
    return copy, copy / config.name
