"""An analysis-only install: `pip install .` into a fresh venv, without Snakemake or the
frameworks, must run `bitdrift explain` (PuLP was imported and declared nowhere)."""

import subprocess
import sys

import numpy as np
import pytest

from bitdrift.record.writer import write_record
from tests.utils import BASE_ATTRS, ROOT

pytestmark = pytest.mark.workflow


def test_pip_install_runs_explain_without_snakemake(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin/python"
    install = subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(ROOT)],
                             capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stderr[-3000:]
    for absent in ("snakemake", "tensorflow", "torch"):
        probe = subprocess.run([str(python), "-c", f"import {absent}"], capture_output=True)
        assert probe.returncode != 0, f"{absent} came with the analysis install"
    files = []
    for device, threads, value in (("a", 1, 1.0), ("b", 2, 2.0)):
        path = tmp_path / f"{device}.h5"
        write_record(path, {**BASE_ATTRS, "model": "net", "device": device,
                            "fingerprint": {"threads": threads}},
                     {0: {"output": np.full((1, 3), value, np.float32)}})
        files.append(str(path))
    out = tmp_path / "explain.csv"
    result = subprocess.run([str(venv / "bin/bitdrift"), "explain", *files, "--out", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "threads" in out.read_text()
