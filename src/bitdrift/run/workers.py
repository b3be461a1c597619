"""Worker processes: a fresh process per job, or a child forked from a pre-imported parent.

Every inference repeat and training run starts from a process in which nothing has run
yet (the reference study's protocol: autotuning, thread pools and CPU dispatch are decided
per process). Most of such a process's life here is importing its framework. A CPU
device of a runtime whose module says ``PREFORK = True`` instead gets one parent per
device and job, started with the device's environment, that imports the framework and
nothing else (no op runs, no thread pool of the framework starts) and forks a child per
repeat: the child starts where a fresh process would be after its import. Not on a GPU:
there the import starts CUDA, which a forked child cannot use (:func:`forkable`).
``tests/unit/test_prefork.py`` compares a forked child's outputs with a fresh process's,
bit for bit, for every default device of those runtimes.

    python -m bitdrift.run.workers MODULE:FUNCTION BACKEND   # the parent; jobs on stdin
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from bitdrift import backends
from bitdrift.emulation.cpus import python_command
from bitdrift.errors import AcceleratorMissing, BitdriftError
from bitdrift.jobs import waiting_on_workers

PR_SET_PDEATHSIG = 1  # linux/prctl.h


WORK_LINE = "bitdrift: work {seconds:.3f} s"  # benchmarks/first_run.py sums these from logs


def run_job(function, job: dict, timed: bool = False) -> int:
    """``function(job)``; the exit status a worker reports for it (0, a bitdrift error's
    status with one line in the log, or 1 with the traceback). ``timed``: the log gets the
    seconds the job itself took (load, compute, write: the work, not the start-up)."""
    started = time.perf_counter()
    try:
        function(job)
        if timed:
            print(WORK_LINE.format(seconds=time.perf_counter() - started), file=sys.stderr)
    except BitdriftError as error:
        # its one line: to the parent, which reports it, and to the log unless the log is
        # the terminal the parent reports on (a command run by hand: one line, not two)
        told = _tell_parent(job, " ".join(str(error).split()))
        if not (told and job.get("log_is_terminal")):
            print(f"bitdrift: error: {error}", file=sys.stderr)
        return error.exit_code
    except SystemExit as error:
        return error.code if isinstance(error.code, int) else 1
    except BaseException as error:  # noqa: BLE001 - the child must report, never unwind into the parent's loop
        traceback.print_exc()
        _tell_parent(job, f"{type(error).__name__}: {' '.join(str(error).split())}")
        return 1
    return 0


def _tell_parent(job: dict, line: str) -> bool:
    """The one line of a failed job in ``job['error_file']``, where the parent finds it
    whatever the log is (a file, or the terminal of a command run by hand); whether it
    was written there."""
    if not isinstance(job, dict) or not job.get("error_file"):
        return False
    try:
        with open(job["error_file"], "w") as handle:
            handle.write(line[:2000])
    except OSError:
        return False
    return True


def exit_now(status: int) -> None:
    """End a worker once its outputs are written (atomically, closed): flush Python's and
    C's buffered output (a traced repeat's kernel log), then exit without the frameworks'
    teardown, which takes 1-2 s a process and changes nothing written."""
    sys.stdout.flush()
    sys.stderr.flush()
    _LIBC.fflush(None)
    os._exit(status)


_LIBC = ctypes.CDLL(None)  # looked up here: a forked child before exec must not dlopen


def _die_with_parent(parent: int | None = None) -> None:
    """In a new process before it runs: SIGKILL when the process that started it ends (a
    job killed with SIGKILL leaves no parent or child computing on). ``parent`` (its pid,
    read before the fork): a parent that died before the call leaves the process orphaned
    already, so it ends at once."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def dies_with_this_process():
    """``preexec_fn`` for a subprocess that must not outlive this process."""
    return functools.partial(_die_with_parent, os.getpid())


def _accelerator_missing(status: int, device: dict, what: str, job: dict | None = None) -> None:
    if status == AcceleratorMissing.exit_code:
        said = Path((job or {}).get("error_file") or "")
        details = f": {said.read_text(errors='replace').strip()}" if said.is_file() else \
            " (details in the log)"
        raise AcceleratorMissing(f"{what} asks for a {device['accelerator'].upper()} that the "
                                 "process cannot see; refusing to fall back to the CPU"
                                 f"{details}")


class FreshProcesses:
    """``python -m MODULE JOB_JSON`` per job, with the device's environment."""

    HOW = "a fresh process"  # where a job ran, as its log says

    def __init__(self, target: str, device: dict, what: str, log):
        self.module = target.split(":")[0]
        self.device, self.what, self.log = device, what, log

    def run(self, job: dict, stdout=None, environment: dict | None = None) -> int:
        from bitdrift.run.devices import device_environment

        device = {**self.device, "env": {**self.device.get("env", {}), **(environment or {})}}
        with waiting_on_workers():
            completed = subprocess.run([*python_command(self.device), "-m",
                                        self.module, json.dumps(job)],
                                       env=device_environment(device),
                                       stdout=self.log if stdout is None else stdout,
                                       stderr=self.log, preexec_fn=dies_with_this_process())
        _accelerator_missing(completed.returncode, self.device, self.what, job)
        return completed.returncode

    def close(self, failed: bool = False) -> None:
        pass


class ForkedChildren:
    """One parent (``python -m bitdrift.run.workers``) with the device's environment that has
    imported the framework; each job is a child it forks. Its stderr is the log; jobs go
    in on its stdin, and each child's exit status comes back on its stdout."""

    HOW = "a forked child"

    def __init__(self, target: str, device: dict, what: str, log):
        from bitdrift.run.devices import device_environment

        self.device, self.what = device, what
        self.parent = subprocess.Popen(
            [*python_command(device), "-m", "bitdrift.run.workers", target,
             device["backend"]],
            env=device_environment(device), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, text=True, preexec_fn=dies_with_this_process())

    def run(self, job: dict, stdout=None, environment: dict | None = None) -> int:
        request = {"job": job, "stdout": stdout.name if stdout is not None else None,
                   "environment": environment or {}}
        try:
            with waiting_on_workers():
                self.parent.stdin.write(json.dumps(request) + "\n")
                self.parent.stdin.flush()
                answer = self.parent.stdout.readline()
        except BrokenPipeError:
            answer = ""
        if not answer:
            status = self.parent.wait()
            _accelerator_missing(status, self.device, self.what, job)
            raise BitdriftError(f"{self.what}: the pre-imported parent process ended (exit "
                                f"{status}) before its job ran; see log")
        status = int(answer)
        _accelerator_missing(status, self.device, self.what, job)
        return status

    def close(self, failed: bool = False) -> None:
        """End the parent: after the last job, by closing its input; after an error or a
        signal, by killing it (its running child dies with it: PR_SET_PDEATHSIG)."""
        if self.parent.poll() is None and not failed:
            self.parent.stdin.close()
            try:
                self.parent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                failed = True
        if self.parent.poll() is None:
            self.parent.kill()
            self.parent.wait()


def forkable(device: dict) -> bool:
    """Whether ``device``'s jobs may run in children forked after its framework's import:
    a runtime that says PREFORK, on the CPU. On a GPU the import itself starts CUDA (Keras
    on torch asks torch for its GPU), which a forked child cannot use ("Cannot
    re-initialize CUDA in forked subprocess", measured on an NVIDIA H200): GPU and TPU
    devices keep fresh processes."""
    return backends.get(device["backend"]).PREFORK and device.get("accelerator") == "cpu"


@contextlib.contextmanager
def worker_processes(target: str, device: dict, what: str, log):
    """Where ``device``'s jobs run: ``target`` (``module:function``) in children of a
    pre-imported parent when :func:`forkable`, else in fresh processes. Either
    way ``run(job, stdout=None, environment=None)`` returns the job's exit status and
    raises AcceleratorMissing (naming ``what``) for a worker that could not see its
    accelerator."""
    kind = ForkedChildren if forkable(device) else FreshProcesses
    workers = kind(target, device, what, log)
    try:
        yield workers
    except BaseException:
        workers.close(failed=True)
        raise
    workers.close()


def import_target(target: str, backend: str):
    """A pre-imported parent's one import: the framework (nothing runs), then the job
    function of ``target`` (``module:function``); a bitdrift error ends the process with
    its line and status."""
    try:
        backends.get(backend).preimport()
        return job_function(target)
    except BitdriftError as error:
        print(f"bitdrift: error: {error}", file=sys.stderr, flush=True)
        exit_now(error.exit_code)


def job_function(target: str):
    """The function ``target`` (``module:function``) names."""
    module_name, function_name = target.split(":")
    return getattr(importlib.import_module(module_name), function_name)


def child_main(function, request: dict, parent: int, descriptors=()) -> None:
    """A forked child of a pre-imported parent: tied to the parent's life; its log on the
    ``descriptors`` (stdout, stderr) handed in, if any; the request's folder (``cwd``),
    environment and stdout file; then its job. Whatever fails goes to the child's log and
    ends it: nothing unwinds into the parent's loop it was forked from."""
    try:
        _die_with_parent(parent)
        if descriptors:
            os.dup2(descriptors[0], 1)
            os.dup2(descriptors[1], 2)
            for descriptor in descriptors:
                os.close(descriptor)
        if request.get("cwd"):
            os.chdir(request["cwd"])
        os.environ.update(request["environment"])
        if request["stdout"]:
            output = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(output, 1)
            os.close(output)
        status = run_job(function, request["job"], timed=True)
    except BaseException:  # noqa: BLE001 - a child reports, never unwinds into the parent
        traceback.print_exc()
        status = 1
    exit_now(status)


def parent_main(target: str, backend: str) -> None:
    """The pre-imported parent: import the framework, then fork a child per job line."""
    control = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the parent or a child prints goes to the log, not the control pipe
    function = import_target(target, backend)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            control.close()
            child_main(function, request, parent)
        _, wait_status = os.waitpid(pid, 0)
        control.write(f"{os.waitstatus_to_exitcode(wait_status)}\n")
        control.flush()
    exit_now(0)


def worker_main(function) -> None:
    """A fresh worker process: ``function(job)`` with the job from argv, after the same
    import a pre-imported parent does; a bitdrift error becomes one line in the log and the
    error's exit status for the parent."""
    job = json.loads(sys.argv[1])
    status = run_job(lambda job: backends.get(job["device"]["backend"]).preimport(), job)
    exit_now(status if status else run_job(function, job, timed=True))


if __name__ == "__main__":
    parent_main(sys.argv[1], sys.argv[2])
