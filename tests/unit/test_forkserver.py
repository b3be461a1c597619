"""Training runs and inference repeats as children of a device's shared fork server
(bitdrift.run.fork_server).

A served child must train what a fresh process trains: the same runs are trained both
ways on a TensorFlow and a torch device and every array of the run file and every weight
of the saved model are compared bit for bit; a served inference repeat, after the same
server has trained, must hand its record what a fresh process hands. The server's
lifetimes are tested with real processes: a job killed with SIGKILL takes its child with
it, an idle server ends and a new one starts, the server idle longest ends when too many
listen, and jobs that must not share a server (SLURM, JAX, emulated CPUs) do not.
"""

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile

import h5py
import numpy as np
import pytest

from bitdrift import backends
from bitdrift.analysis.kernels import layer_kernels, parse_trace
from bitdrift.config import load_config
from bitdrift.errors import BitdriftError
from bitdrift.inputs.datasets import prepare_dataset
from bitdrift.run import fork_server as forkserver
from bitdrift.run.workers import FreshProcesses
from bitdrift.studies.variance.plans import ARMS
from bitdrift.studies.variance.runs import train_run
from tests.unit.test_prefork import WORKER, arrays, repeat_job
from tests.utils import ROOT, fork_servers_in

SERVED = re.compile(r"in child (\d+) of fork server (\w+) \(pid (\d+)\)")


@pytest.fixture()
def sockets(monkeypatch):
    """A private, short socket folder (a Unix socket's path is at most 107 bytes); the
    servers started in it end with the test."""
    folder = tempfile.mkdtemp(prefix="bdfs")
    monkeypatch.setenv("XDG_RUNTIME_DIR", folder)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv(forkserver.FRESH, raising=False)
    yield folder
    for pid in fork_servers_in(folder):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("forkserver") / "digits.h5"
    prepare_dataset("digits", {"source": "digits", "limit_train": 128, "limit_test": 32}, path)
    return path


def plan(epochs=1):
    return {"study": "plan", "model": "small", "seed": 3, "runs": 2,
            "spec": {"architecture": "small_cnn", "dataset": "digits", "epochs": epochs,
                     "batch_size": 32, "optimizer": "adam", "learning_rate": 0.001,
                     "momentum": 0.0, "augmentation": {}},
            "arms": {"impl": ARMS["impl"], "algo": ARMS["algo"]}}


def train(backend, arm, run, dataset, out, log, threads=1, device=None):
    device = device or {"accelerator": "cpu", "backend": backend, "threads": threads}
    with open(log, "a") as handle:
        train_run(plan_name="p", plan=plan(), arm=arm, device_name=f"{backend}_{threads}",
                  device=device, run=run, dataset_path=dataset, out_dir=out, log=handle)


def run_arrays(out):
    with h5py.File(out / "run.h5") as handle:
        arrays = {name: handle[name][()] for name in ("logits", "weights", "labels")}
        arrays["init_sha256"] = handle.attrs["init_sha256"]
    return arrays


def model_weights(out):
    """Every weight array in the saved model's archive (model.keras is a zip)."""
    with zipfile.ZipFile(out / "model.keras") as archive:
        data = archive.read("model.weights.h5")
    found = {}
    with h5py.File(io.BytesIO(data), "r") as handle:
        handle.visititems(lambda name, item: found.__setitem__(name, item[()])
                          if isinstance(item, h5py.Dataset) else None)
    return found


# Two threads: the server then holds OpenBLAS's thread pool from its import, which must
# survive the fork as it does for the inference parents (test_prefork.py)
@pytest.mark.parametrize(("backend", "threads"), [("tensorflow", 1), ("torch", 1),
                                                  ("tensorflow", 2)])
def test_a_served_child_trains_what_a_fresh_process_trains(backend, threads, dataset, sockets,
                                                           tmp_path, monkeypatch):
    log = tmp_path / "served.log"
    for arm in ("impl", "algo"):
        for run in (0, 1):
            train(backend, arm, run, dataset, tmp_path / "served" / arm / str(run), log,
                  threads)
    served = SERVED.findall(log.read_text())
    assert len(served) == 4, log.read_text()
    assert len({server for _, _, server in served}) == 1  # one server, its import once
    assert len({child for child, _, _ in served}) == 4
    monkeypatch.setenv(forkserver.FRESH, "1")
    for arm in ("impl", "algo"):
        for run in (0, 1):
            train(backend, arm, run, dataset, tmp_path / "fresh" / arm / str(run),
                  tmp_path / "fresh.log", threads)
    assert not SERVED.findall((tmp_path / "fresh.log").read_text())
    for arm in ("impl", "algo"):
        for run in (0, 1):
            served_run = run_arrays(tmp_path / "served" / arm / str(run))
            fresh_run = run_arrays(tmp_path / "fresh" / arm / str(run))
            for name, value in fresh_run.items():
                assert np.array_equal(np.asarray(served_run[name]), np.asarray(value)), name
            served_model = model_weights(tmp_path / "served" / arm / str(run))
            fresh_model = model_weights(tmp_path / "fresh" / arm / str(run))
            assert served_model.keys() == fresh_model.keys() and fresh_model
            for name, value in fresh_model.items():
                assert served_model[name].tobytes() == value.tobytes(), name
    # the runs differ where their seeds do: the comparison can fail
    assert not np.array_equal(run_arrays(tmp_path / "fresh" / "algo" / "0")["weights"],
                              run_arrays(tmp_path / "fresh" / "algo" / "1")["weights"])


DEFAULT_DEVICES = load_config(ROOT / "config.yaml")["devices"]


@pytest.mark.parametrize("name", ["tf_1thread", "tf_2threads", "torch_1thread"])
def test_a_served_repeat_after_training_computes_what_a_fresh_process_computes(
        name, dataset, sockets, small_model_copy, tmp_path):
    """One server per device: the training run and the inference repeats (a plain and a
    traced one) of a device share it, and its repeats hand over what fresh processes do."""
    device = DEFAULT_DEVICES[name]
    log = tmp_path / "served.log"
    train(device["backend"], "impl", 0, dataset, tmp_path / "run", log, device=device)
    assets = small_model_copy(tmp_path / "assets")
    environment = backends.get(device["backend"]).trace_environment(device)
    outputs, signatures = {}, {}
    with open(log, "a") as handle:
        for kind in (forkserver.ServedChildren, FreshProcesses):
            for trace in (False, True):
                out, trace_path = tmp_path / f"{kind.__name__}{trace}.npz", tmp_path / "t.txt"
                with open(trace_path, "w") as stdout:
                    status = kind(WORKER, device, name, handle).run(
                        repeat_job(name, device, assets, out, trace=trace),
                        stdout=stdout if trace else None,
                        environment=environment if trace else None)
                assert status == 0, log.read_text()
                outputs[kind, trace] = arrays(out)
                if trace:
                    found = layer_kernels(parse_trace(trace_path.read_text()),
                                          outputs[kind, trace][0]["layers"],
                                          device["backend"], "cpu")
                    signatures[kind] = {layer: entry["signature"]
                                        for layer, entry in found.items()}
    served = SERVED.findall(log.read_text())
    assert len(served) == 3 and len({server for _, _, server in served}) == 1, served
    for trace in (False, True):
        (fresh_meta, fresh), (served_meta, served_arrays) = (
            outputs[FreshProcesses, trace], outputs[forkserver.ServedChildren, trace])
        assert sorted(fresh) == sorted(served_arrays)
        assert any(re.fullmatch(r"\d+_batch\d+", key) for key in fresh)  # layers' batches
        for key, value in fresh.items():
            assert value.tobytes() == served_arrays[key].tobytes(), f"{name}: {key} differs"
        assert fresh_meta["layers"] == served_meta["layers"]
    assert signatures[FreshProcesses] == signatures[forkserver.ServedChildren]
    # the kernel log's variables reached the served child's libraries
    assert any(signature not in ("none", "eigen", "aten", "unknown")
               for signature in signatures[forkserver.ServedChildren].values())


def test_a_killed_job_takes_its_served_child_with_it(dataset, sockets, tmp_path):
    log = tmp_path / "job.log"
    code = ("import sys; from pathlib import Path; "
            "from tests.unit.test_forkserver import train_long; "
            "train_long(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))")
    job = subprocess.Popen([sys.executable, "-c", code, str(dataset), str(tmp_path / "run"),
                            str(log)], cwd=ROOT)
    deadline = time.monotonic() + 300
    while not SERVED.search(log.read_text() if log.exists() else "") \
            and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
    found = SERVED.search(log.read_text())
    assert found, log.read_text()
    child, server = int(found[1]), int(found[3])
    time.sleep(1)
    assert _alive(child)
    job.send_signal(signal.SIGKILL)
    job.wait()
    deadline = time.monotonic() + 15
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the killed job's child trains on"
    assert _alive(server)  # the server serves the device's next job
    assert not (tmp_path / "run" / "run.h5").exists()


def train_long(dataset, out, log):
    """A run long enough to be killed while it trains (called in the test's job process)."""
    long = plan(epochs=200)
    with open(log, "a") as handle:
        train_run(plan_name="p", plan=long, arm="impl", device_name="tensorflow_1thread",
                  device={"accelerator": "cpu", "backend": "tensorflow", "threads": 1}, run=0,
                  dataset_path=dataset, out_dir=out, log=handle)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_an_idle_server_ends_and_the_next_job_starts_another(dataset, sockets, tmp_path,
                                                              monkeypatch):
    monkeypatch.setenv(forkserver.IDLE, "1")
    log = tmp_path / "runs.log"
    train("torch", "impl", 0, dataset, tmp_path / "first", log)
    first = int(SERVED.findall(log.read_text())[-1][2])
    deadline = time.monotonic() + 30
    while _alive(first) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(first)
    assert not os.listdir(forkserver.socket_folder())  # a clean end leaves nothing
    train("torch", "impl", 0, dataset, tmp_path / "second", log)
    second = int(SERVED.findall(log.read_text())[-1][2])
    assert second != first
    assert np.array_equal(run_arrays(tmp_path / "first")["weights"],
                          run_arrays(tmp_path / "second")["weights"])


def test_jobs_that_must_not_share_a_server_run_fresh(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv(forkserver.FRESH, raising=False)
    cpu = {"accelerator": "cpu", "threads": 1}
    assert forkserver.served(cpu | {"backend": "tensorflow"})
    assert forkserver.served(cpu | {"backend": "torch"})
    assert not forkserver.served(cpu | {"backend": "jax"})  # forking JAX may deadlock
    assert not forkserver.served(cpu | {"backend": "tensorflow", "emulate": "Haswell-v4"})
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # a job's cgroup holds what it starts
    assert not forkserver.served(cpu | {"backend": "tensorflow"})
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv(forkserver.FRESH, "1")
    assert not forkserver.served(cpu | {"backend": "tensorflow"})


def test_a_change_of_environment_or_backend_names_another_server():
    device = {"accelerator": "cpu", "backend": "tensorflow", "threads": 1}
    key = forkserver.server_key(device, {"A": "1"})
    assert key == forkserver.server_key(device, {"A": "1"})
    assert key != forkserver.server_key(device, {"A": "2"})
    assert key != forkserver.server_key(device | {"backend": "torch"}, {"A": "1"})


def test_the_server_idle_longest_ends_when_too_many_listen(dataset, sockets, tmp_path,
                                                           monkeypatch):
    monkeypatch.setenv(forkserver.MAX, "2")
    log = tmp_path / "runs.log"
    servers = []
    for threads in (1, 2, 3):  # three devices, three servers; the third is one too many
        train("torch", "impl", 0, dataset, tmp_path / str(threads), log, threads=threads)
        servers.append(int(SERVED.findall(log.read_text())[-1][2]))
    assert len(set(servers)) == 3
    deadline = time.monotonic() + 30
    while _alive(servers[0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(servers[0])  # idle longest, while three listened
    time.sleep(forkserver.CROWDED_GRACE_SECONDS + 2)
    assert _alive(servers[1]) and _alive(servers[2])  # two listen: both serve on


def test_a_job_function_the_server_cannot_import_fails_the_job_not_the_server(
        dataset, sockets, tmp_path):
    log = tmp_path / "runs.log"
    train("torch", "impl", 0, dataset, tmp_path / "first", log)
    server = int(SERVED.findall(log.read_text())[-1][2])
    device = {"accelerator": "cpu", "backend": "torch", "threads": 1}
    with open(log, "a") as handle, pytest.raises(BitdriftError, match="cannot import"):
        forkserver.ServedChildren("bitdrift.no_such_module:f", device, "d", handle).run({})
    assert _alive(server)


def test_a_bad_or_vanished_client_never_ends_the_server(dataset, sockets, tmp_path):
    log = tmp_path / "runs.log"
    train("torch", "impl", 0, dataset, tmp_path / "first", log)
    server = int(SERVED.findall(log.read_text())[-1][2])
    (path,) = [forkserver.socket_folder() / name
               for name in os.listdir(forkserver.socket_folder()) if name.endswith(".sock")]
    # a request cut short, one without descriptors, and a job gone before its child started
    with socket.socket(socket.AF_UNIX) as client, open(log) as handle:
        client.connect(str(path))
        socket.send_fds(client, [forkserver._HEADER.pack(1000)], [handle.fileno()] * 2)
        client.sendall(b"{")
    with socket.socket(socket.AF_UNIX) as client:
        client.connect(str(path))
        client.sendall(forkserver._HEADER.pack(2) + b"{}")
    request = json.dumps({"target": "bitdrift.studies.variance.runs:run_worker", "job": {},
                          "cwd": str(tmp_path), "environment": {}, "stdout": None}).encode()
    with socket.socket(socket.AF_UNIX) as client, open(log) as handle:
        client.connect(str(path))
        socket.send_fds(client, [forkserver._HEADER.pack(len(request))], [handle.fileno()] * 2)
        client.sendall(request)
    time.sleep(2)
    assert _alive(server)
    train("torch", "impl", 0, dataset, tmp_path / "second", log)
    assert int(SERVED.findall(log.read_text())[-1][2]) == server
    assert np.array_equal(run_arrays(tmp_path / "first")["weights"],
                          run_arrays(tmp_path / "second")["weights"])
    server_log = path.with_suffix(".log").read_text()
    assert server_log.count("a bad request") == 2, server_log


def test_a_socket_folder_that_is_not_private_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    folder = tmp_path / f"bitdrift-forkserver-{os.getuid()}"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)  # as another user could have made it for us
    with pytest.raises(BitdriftError, match="not a folder private to this user"):
        forkserver.socket_folder()
    folder.chmod(0o700)
    assert forkserver.socket_folder() == folder


def test_an_accelerator_device_is_never_forked(monkeypatch):
    """On a GPU the framework's import starts CUDA, which a forked child cannot use
    (measured on an H200): its repeats and runs are fresh processes, whatever its runtime."""
    from bitdrift.run.workers import forkable, worker_processes

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv(forkserver.FRESH, raising=False)
    for backend in ("tensorflow", "torch"):
        for accelerator in ("gpu", "tpu"):
            device = {"accelerator": accelerator, "backend": backend, "threads": 1}
            assert not forkable(device) and not forkserver.served(device)
            with worker_processes("m:f", device, "d", sys.stderr) as workers:
                assert isinstance(workers, FreshProcesses)
            with forkserver.repeat_workers("m:f", device, "d", sys.stderr) as workers:
                assert isinstance(workers, FreshProcesses)
        assert forkable({"accelerator": "cpu", "backend": backend, "threads": 1})
