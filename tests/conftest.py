import contextlib
import fcntl
import json
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

# -- two workers (pytest-xdist; ./quickstart test runs `pytest -n 2 --dist loadscope`) -----
# Each test module runs whole on one worker, so its module fixtures are built once; the
# modules with tests that read the session's workflow run (`run`, `own_run`) share one
# worker, so that run is made once. The modules that take longest go first: the other
# worker meanwhile takes the short ones, and neither waits for a long module begun last.
# A hint for the schedule only (the order of modules changes nothing a test checks).
SESSION_RUN_MODULES = {
    "tests/reliability/test_workflow_drills.py",
    "tests/workflow/test_slurm.py",
    "tests/workflow/test_workflow.py",
}
LONGEST_FIRST = [  # by a serial run's --durations (Intel Xeon, 2 cores, 2026-11-28)
    "session_run",  # test_slurm, test_workflow_drills, test_workflow: about 12 min
    "tests/unit/test_aarch64.py",  # building the Arm userland: about 10 min
    "tests/workflow/test_presets.py",  # the your_model preset whole: about 9 min
    # one run of the three quantizers' models (ExecuTorch, LiteRT): about 5 min
    "tests/workflow/test_quantized_models.py",
    "tests/unit/test_emulation.py",
    "tests/unit/test_forkserver.py",
    "tests/unit/test_inference.py",
    "tests/unit/test_repro.py",
    "tests/workflow/test_pt2_model.py",
    "tests/reliability/test_readme_commands.py",
    "tests/unit/test_transformer_layers.py",
    "tests/workflow/test_tflite_model.py",
    "tests/workflow/test_ablation.py",
    "tests/unit/test_pt2e_quantization.py",  # Inductor compiles: about 2 min
]


def _group(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return "session_run" if module in SESSION_RUN_MODULES else module


def pytest_collection_modifyitems(config, items):
    readers = {item.nodeid.split("::", 1)[0] for item in items
               if {"run", "own_run"} & set(item.fixturenames)}
    if readers - SESSION_RUN_MODULES:  # else a second worker would make the run again
        raise pytest.UsageError(f"tests/conftest.py: add {sorted(readers - SESSION_RUN_MODULES)}"
                                f" to SESSION_RUN_MODULES (its tests read the session's run)")
    rank = {group: place for place, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(_group(item.nodeid), len(rank)))  # stable


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope with a module (or the session run's modules together) as the unit
    of work, in the order collected (xdist's own grouping by mark does not take with this
    pytest: it rewrites a test id pytest no longer reads)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ModuleScheduling(config, log)


def built_once(tmp_path_factory, name, build) -> list[str]:
    """``build(folder)`` (it returns a list of paths) once for the whole session, also
    across xdist's workers: the first to come builds under a lock in the session's common
    folder, the others wait and take the same files."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # each worker's folder lies in the session's
    folder, done = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed part way
            folder.mkdir()
            done.write_text(json.dumps([str(path) for path in build(folder)]))
        return json.loads(done.read_text())


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
    built = built_once(tmp_path_factory, "small_model", small_model_assets)
    return lambda folder: copy_into(folder, *built)


@pytest.fixture(scope="session")
def small_export_copy(small_model_copy, tmp_path_factory):
    """A function: folder -> (dataset, model, reference), copies of the small model's
    files and of export_small_model's (its reference, and model.onnx and model.tflite,
    tests.utils.EXPORT_FILES, beside them)."""
    def build(folder):
        dataset, model = small_model_copy(folder)
        reference = export_small_model(model, dataset, folder)
        return [dataset, model, reference,
                *(folder / name for name in sorted(set(EXPORT_FILES.values())))]

    dataset, model, reference, *exports = built_once(tmp_path_factory, "small_export", build)

    def copy(target):
        dataset_copy, model_copy, reference_copy, *_ = copy_into(
            target, dataset, model, reference, *exports)
        return dataset_copy, model_copy, reference_copy

    return copy


@pytest.fixture(scope="session")
def tflite_model_copy(tmp_path_factory):
    """A function: folder -> (model.tflite, weights.npz), copies of what KERAS_TO_TFLITE
    writes (a TensorFlow process, once per session)."""
    def build(folder):
        subprocess.run([sys.executable, "-c", KERAS_TO_TFLITE, str(folder)], check=True,
                       capture_output=True)
        return [folder / "model.tflite", folder / "weights.npz"]

    built = built_once(tmp_path_factory, "keras_to_tflite", build)
    return lambda target: copy_into(target, *built)


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
