"""Forked children of a pre-imported parent (bitdrift.run.workers) against fresh processes.

A runtime that says PREFORK runs a device's repeats as children of one parent that has
imported the framework; that is only allowed if a child computes what a fresh process
computes. This runs every default device of those runtimes both ways, on the same model
and images, and compares every array a repeat hands to its record bit for bit.
"""

import contextlib
import json
import re
import sys

import numpy as np
import pytest

from bitdrift import backends
from bitdrift.analysis.kernels import layer_kernels, parse_trace
from bitdrift.config import load_config
from bitdrift.errors import BitdriftError
from bitdrift.run.workers import ForkedChildren, FreshProcesses, worker_processes
from tests.utils import ROOT

DEFAULT_DEVICES = load_config(ROOT / "config.yaml")["devices"]
FORKED = {name: device for name, device in DEFAULT_DEVICES.items()
          if backends.get(device["backend"]).PREFORK}
WORKER = "bitdrift.run.repeat:run_repeat"


@pytest.fixture(scope="module")
def assets(small_model_copy, tmp_path_factory):
    return small_model_copy(tmp_path_factory.mktemp("prefork"))


def repeat_job(name, device, assets, out, *, trace=False):
    dataset, model = assets
    return {"device": device, "device_name": name, "model_path": str(model),
            "dataset_path": str(dataset), "samples": [0, 3], "layers": True,
            "out": str(out), "fingerprint": True, "reference": None, "export": None,
            "trace": trace}


def arrays(path):
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        return meta, {key: data[key] for key in data.files if key != "meta"}


def test_the_default_config_forks_tensorflow_and_torch_devices():
    assert {device["backend"] for device in FORKED.values()} == {"tensorflow", "torch"}
    assert len(FORKED) >= 18


@pytest.mark.parametrize("name", sorted(FORKED))
def test_a_forked_child_computes_what_a_fresh_process_computes(name, assets, tmp_path):
    device = FORKED[name]
    # The parent imports while the fresh process runs: both are started before either ends.
    forked = ForkedChildren(WORKER, device, name, sys.stderr)
    try:
        fresh_status = FreshProcesses(WORKER, device, name, sys.stderr).run(
            repeat_job(name, device, assets, tmp_path / "fresh.npz"))
        forked_status = forked.run(repeat_job(name, device, assets, tmp_path / "forked.npz"))
    finally:
        forked.close()
    assert (fresh_status, forked_status) == (0, 0)
    fresh_meta, fresh = arrays(tmp_path / "fresh.npz")
    forked_meta, forked_arrays = arrays(tmp_path / "forked.npz")
    assert sorted(fresh) == sorted(forked_arrays)
    assert any(re.fullmatch(r"\d+_batch\d+", key) for key in fresh)  # each layer's batches
    assert any(key.startswith("weights/") for key in fresh)
    for key, value in fresh.items():
        assert value.dtype == forked_arrays[key].dtype, key
        assert value.tobytes() == forked_arrays[key].tobytes(), f"{name}: {key} differs"
    assert fresh_meta["layers"] == forked_meta["layers"]
    # Same machine, same environment: the same description (threads, variables, versions).
    assert fresh_meta["fingerprint"] == forked_meta["fingerprint"]


@pytest.mark.parametrize("name", ["tf_1thread", "torch_1thread"])
def test_a_forked_traced_repeat_logs_the_kernels_a_fresh_one_logs(name, assets, tmp_path):
    """The kernel log's variables are set in the child after the parent's import: the
    libraries read them when their first kernel runs, so the trace is the same."""
    device = FORKED[name]
    environment = backends.get(device["backend"]).trace_environment(device)
    signatures = {}
    for kind in (FreshProcesses, ForkedChildren):
        trace_path = tmp_path / f"{kind.__name__}.txt"
        with worker_processes(WORKER, device, name, sys.stderr) if kind is ForkedChildren \
                else contextlib.nullcontext(FreshProcesses(WORKER, device, name, sys.stderr)) \
                as workers, open(trace_path, "w") as stdout:
            assert isinstance(workers, kind)
            status = workers.run(repeat_job(name, device, assets, tmp_path / "out.npz",
                                            trace=True), stdout=stdout,
                                 environment=environment)
        assert status == 0
        meta, _ = arrays(tmp_path / "out.npz")
        trace = parse_trace(trace_path.read_text())
        found = layer_kernels(trace, meta["layers"], device["backend"], "cpu")
        signatures[kind] = {layer: entry["signature"] for layer, entry in found.items()}
    assert signatures[FreshProcesses] == signatures[ForkedChildren]
    # oneDNN or MKL logged something: the variables did reach the child's libraries.
    assert any(signature not in ("none", "eigen", "aten", "unknown")
               for signature in signatures[ForkedChildren].values())


def test_a_parent_that_cannot_import_fails_with_the_device_named(assets, tmp_path):
    """A parent whose framework import fails ends before the job: one error naming the
    device, never a job that silently ran elsewhere."""
    broken = tmp_path / "broken" / "keras"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('a broken Keras')\n")
    device = {**FORKED["tf_1thread"], "env": {"PYTHONPATH": str(broken.parent)}}
    with pytest.raises(BitdriftError, match="tf_1thread.*pre-imported parent"), \
            worker_processes(WORKER, device, "device 'tf_1thread'", sys.stderr) as workers:
        workers.run(repeat_job("tf_1thread", device, assets, tmp_path / "out.npz"))
    assert not (tmp_path / "out.npz").exists()


def test_a_failing_job_reports_its_status_and_the_parent_goes_on(assets, tmp_path):
    """A child's error is its exit status; the next child of the same parent still runs."""
    device = FORKED["tf_1thread"]
    with worker_processes(WORKER, device, "device 'tf_1thread'", sys.stderr) as workers:
        bad = repeat_job("tf_1thread", device, assets, tmp_path / "bad.npz")
        bad["model_path"] = str(tmp_path / "missing.keras")
        assert workers.run(bad) != 0
        assert workers.run(repeat_job("tf_1thread", device, assets,
                                      tmp_path / "good.npz")) == 0
    assert (tmp_path / "good.npz").is_file() and not (tmp_path / "bad.npz").exists()
