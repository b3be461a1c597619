import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from bitdrift.record.writer import write_record
from tests.utils import (
    BASE_ATTRS,
    EXPORT_FILES,
    KERAS_TO_TFLITE,
    ROOT,
    copy_into,
    export_small_model,
    fork_servers_in,
    small_model_assets,
    snakemake,
    write_inputs,
)


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


# -- the small model: built once per session, each user given its own copy -------------
# tests.utils.small_model_assets starts TensorFlow to build and save an untrained
# Cifar10-small (seed 0), and export_small_model starts it again for tf2onnx and LiteRT's
# converter. Both are the same for every test that runs the model, and a test that writes
# beside the files would change them for the others: so each test or module takes copies
# in a folder of its own (`dataset, model = small_model_copy(folder)`).
@pytest.fixture(scope="session")
def small_model_copy(tmp_path_factory):
    """A function: folder -> (dataset, model), copies of small_model_assets' files."""
    built = small_model_assets(tmp_path_factory.mktemp("small_model"))
    return lambda folder: copy_into(folder, *built)


@pytest.fixture(scope="session")
def small_export_copy(small_model_copy, tmp_path_factory):
    """A function: folder -> (dataset, model, reference), copies of the small model's
    files and of export_small_model's (its reference, and model.onnx and model.tflite,
    tests.utils.EXPORT_FILES, beside them)."""
    folder = tmp_path_factory.mktemp("small_export")
    dataset, model = small_model_copy(folder)
    reference = export_small_model(model, dataset, folder)
    exports = [folder / name for name in sorted(set(EXPORT_FILES.values()))]

    def copy(target):
        dataset_copy, model_copy, reference_copy, *_ = copy_into(
            target, dataset, model, reference, *exports)
        return dataset_copy, model_copy, reference_copy

    return copy


@pytest.fixture(scope="session")
def tflite_model_copy(tmp_path_factory):
    """A function: folder -> (model.tflite, weights.npz), copies of what KERAS_TO_TFLITE
    writes (a TensorFlow process, once per session)."""
    folder = tmp_path_factory.mktemp("keras_to_tflite")
    subprocess.run([sys.executable, "-c", KERAS_TO_TFLITE, str(folder)], check=True,
                   capture_output=True)
    return lambda target: copy_into(target, folder / "model.tflite", folder / "weights.npz")


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
