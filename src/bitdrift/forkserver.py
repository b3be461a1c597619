"""A pre-imported parent shared by the jobs of one device: training runs without an import each.

A training run is one Snakemake job (adding runs to a plan must never retrain the runs it
has), so a pre-imported parent per job (:class:`bitdrift.prefork.ForkedChildren`) would
import as much as the fresh process it replaces. Instead the first job of a device starts
a *fork server*: ``python -m bitdrift.forkserver TARGET BACKEND SOCKET`` with the device's
environment, which imports the framework and nothing else (as a prefork parent does) and
listens on a Unix socket. Every job of that device on this machine connects, hands over
its job and its log's file descriptors, and the server forks a child that runs the job
where a fresh process would be after its import; the job gets the child's exit status.
``tests/unit/test_forkserver.py`` trains the same runs in served children and in fresh
processes and compares every array and weight bit for bit.

The server is found by a key: the digest of everything that shapes what a child computes
(the interpreter, the job's function, the device's whole environment, bitdrift's source
files and the installed packages' folder). A change of any of them starts another server;
a server without jobs for :data:`IDLE_SECONDS` removes its socket and ends.

Lifetimes: a job killed (SIGKILL included) closes its connection, and the server kills
that job's child at once; a server that ends takes its children with it
(``PR_SET_PDEATHSIG``), and their jobs fail naming it. Under SLURM each job stays in its
own fresh process: a server started by one job would live in that job's cgroup, outside
the resources the scheduler gave the others, and die with it.

    python -m bitdrift.forkserver MODULE:FUNCTION BACKEND SOCKET_PATH
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import bitdrift
from bitdrift import backends
from bitdrift.emulation import python_command
from bitdrift.errors import BitdriftError
from bitdrift.prefork import (
    FreshProcesses,
    _accelerator_missing,
    _die_with_parent,
    exit_now,
    run_job,
)

IDLE_SECONDS = 60.0  # a server without jobs this long ends (the next job starts another)
IDLE = "BITDRIFT_FORKSERVER_IDLE"  # seconds, to replace IDLE_SECONDS (tests)
START_SECONDS = 300.0  # how long a job waits for a server's import (TensorFlow under load)
FRESH = "BITDRIFT_FRESH_WORKERS"  # set (to 1): every job in its own fresh process
_HEADER = struct.Struct("!I")  # the length of a request's JSON, sent with its descriptors


def socket_folder() -> Path:
    """Where this user's servers listen: node-local and private to the user."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    folder = Path(base) / f"bitdrift-forkserver-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def _source_state() -> list:
    """What a code or package change alters: bitdrift's files and the packages' folder."""
    package = Path(bitdrift.__file__).parent
    files = sorted((str(path.relative_to(package)), path.stat().st_mtime_ns, path.stat().st_size)
                   for path in package.rglob("*.py"))
    packages = Path(sysconfig.get_paths()["purelib"])
    return [str(package), files, str(packages),
            packages.stat().st_mtime_ns if packages.is_dir() else None]


def server_key(target: str, device: dict, environment: dict) -> str:
    """The digest that names the server for ``target`` on ``device`` with ``environment``."""
    state = {"python": python_command(device), "target": target, "backend": device["backend"],
             "environment": sorted(environment.items()), "source": _source_state()}
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:24]


def served(device: dict) -> bool:
    """Whether ``device``'s jobs run in children of a shared server on this machine."""
    return (backends.get(device["backend"]).PREFORK and not device.get("emulate")
            and "SLURM_JOB_ID" not in os.environ and os.environ.get(FRESH, "") in ("", "0"))


class ServedChildren:
    """Jobs as children of the device's shared server (started by the first job that finds
    none); the interface of :class:`bitdrift.prefork.FreshProcesses`."""

    def __init__(self, target: str, device: dict, what: str, log):
        from bitdrift.devices import device_environment

        self.target, self.device, self.what, self.log = target, device, what, log
        self.environment = device_environment(device)
        self.key = server_key(target, device, self.environment)
        self.path = socket_folder() / f"{self.key}.sock"
        if len(str(self.path)) > 96:  # a socket's path holds 107 bytes; the server's
            # staging name adds its pid
            raise BitdriftError(f"{self.what}: the fork server's socket path {self.path} is "
                                "too long for a Unix socket; set XDG_RUNTIME_DIR to a short "
                                f"folder, or {FRESH}=1")

    def run(self, job: dict, stdout=None, environment: dict | None = None) -> int:
        request = json.dumps({"job": job, "cwd": os.getcwd(), "environment": environment or {},
                              "stdout": stdout.name if stdout is not None else None}).encode()
        for _attempt in range(3):  # a server that ended idle just as this job came: another
            connection = self._connect()
            with connection:
                for stream in (self.log, stdout):
                    if stream is not None:
                        stream.flush()
                descriptors = [(stdout or self.log).fileno(), self.log.fileno()]
                try:
                    socket.send_fds(connection, [_HEADER.pack(len(request))], descriptors)
                    connection.sendall(request)
                except OSError:
                    continue
                answers = connection.makefile("r")
                started = answers.readline()
                if not started.startswith("started "):
                    continue
                print(f"bitdrift: in child {started.split()[1]} of fork server "
                      f"{self.key[:12]} (pid {started.split()[2]})", file=self.log, flush=True)
                finished = answers.readline()
                if not finished.strip():
                    raise BitdriftError(f"{self.what}: the fork server {self.path} ended while "
                                        "its job ran; see its log "
                                        f"{self.path.with_suffix('.log')}")
                status = int(finished)
                _accelerator_missing(status, self.device, self.what, job)
                return status
        raise BitdriftError(f"{self.what}: the fork server {self.path} took no job "
                            f"(3 tries); see {self.path.with_suffix('.log')}")

    def _connect(self) -> socket.socket:
        """A connection to the server, started first (one job at a time) if there is none."""
        connection = _try_connect(self.path)
        if connection is not None:
            return connection
        with open(self.path.parent / "start.lock", "w") as lock:  # one start at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            connection = _try_connect(self.path)
            if connection is not None:
                return connection
            server_log = self.path.with_suffix(".log")
            with open(server_log, "a") as handle:
                server = subprocess.Popen(
                    [*python_command(self.device), "-m", "bitdrift.forkserver", self.target,
                     self.device["backend"], str(self.path)],
                    env=self.environment, stdin=subprocess.DEVNULL, stdout=handle,
                    stderr=handle, start_new_session=True)  # a job's Ctrl-C is not its
            print(f"bitdrift: started fork server {self.key[:12]} (pid {server.pid}) for "
                  f"{self.what}; its log: {server_log}", file=self.log, flush=True)
            deadline = time.monotonic() + START_SECONDS
            while time.monotonic() < deadline:
                connection = _try_connect(self.path)
                if connection is not None:
                    return connection
                status = server.poll()
                if status is not None:
                    _accelerator_missing(status, self.device, self.what)
                    tail = server_log.read_text(errors="replace").strip().splitlines()[-3:]
                    raise BitdriftError(f"{self.what}: the fork server ended (exit {status}) "
                                        f"before it listened: {' / '.join(tail)}")
                time.sleep(0.05)
            server.kill()
            raise BitdriftError(f"{self.what}: the fork server did not listen within "
                                f"{START_SECONDS:.0f} s; see {server_log}")

    def close(self, failed: bool = False) -> None:
        pass  # the server serves the device's next job; it ends when idle


def _try_connect(path: Path) -> socket.socket | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(path))
    except OSError:  # no socket, or one whose server ended
        connection.close()
        return None
    return connection


@contextlib.contextmanager
def training_workers(target: str, device: dict, what: str, log):
    """Where ``device``'s training runs: a served child when :func:`served`, else a fresh
    process; ``run(job)`` returns the job's exit status."""
    kind = ServedChildren if served(device) else FreshProcesses
    yield kind(target, device, what, log)


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    header, descriptors, _, _ = socket.recv_fds(connection, _HEADER.size, 2)
    if len(header) != _HEADER.size:
        for descriptor in descriptors:
            os.close(descriptor)
        raise OSError("a request without its header")
    (length,) = _HEADER.unpack(header)
    body = b""
    while len(body) < length:
        chunk = connection.recv(length - len(body))
        if not chunk:
            raise OSError("a request cut short")
        body += chunk
    return json.loads(body), descriptors


def _child(function, request: dict, descriptors: list[int], server: int) -> None:
    """In the forked child: the job's folder, environment and log, then the job."""
    _die_with_parent(server)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(request["cwd"])
    os.environ.update(request["environment"])
    os.dup2(descriptors[0], 1)
    os.dup2(descriptors[1], 2)
    for descriptor in descriptors:
        os.close(descriptor)
    if request["stdout"]:
        output = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(output, 1)
        os.close(output)
    exit_now(run_job(function, request["job"], timed=True))


def server_main(target: str, backend: str, path: str) -> None:
    """The server: import, listen, fork a child per job, report its status, end when idle."""
    module_name, function_name = target.split(":")
    try:
        backends.get(backend).preimport()
        function = getattr(importlib.import_module(module_name), function_name)
    except BitdriftError as error:
        print(f"bitdrift: error: {error}", file=sys.stderr, flush=True)
        exit_now(error.exit_code)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}"
    listener.bind(staging)
    listener.listen(16)
    os.rename(staging, path)  # the socket appears ready to take jobs, never before
    inode = os.stat(path).st_ino
    print(f"bitdrift: fork server {os.getpid()} listens on {path}", file=sys.stderr, flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    children = {}  # pid -> (connection, pidfd)
    idle_seconds = float(os.environ.get(IDLE, IDLE_SECONDS))
    idle_since = time.monotonic()
    while True:
        events = selector.select(timeout=1.0)
        for key, _ in events:
            if key.data is None:  # a new job
                connection, _ = listener.accept()
                try:
                    request, descriptors = _receive(connection)
                except (OSError, ValueError) as error:
                    print(f"bitdrift: fork server: a bad request ({error})", file=sys.stderr,
                          flush=True)
                    connection.close()
                    continue
                sys.stderr.flush()
                server = os.getpid()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for other, pidfd in children.values():
                        other.close()
                        os.close(pidfd)
                    connection.close()
                    _child(function, request, descriptors, server)
                for descriptor in descriptors:
                    os.close(descriptor)
                pidfd = os.pidfd_open(pid)
                children[pid] = (connection, pidfd)
                selector.register(connection, selectors.EVENT_READ, ("job", pid))
                selector.register(pidfd, selectors.EVENT_READ, ("child", pid))
                connection.sendall(f"started {pid} {server}\n".encode())
            else:
                kind, pid = key.data
                if pid not in children:
                    continue
                connection, pidfd = children[pid]
                if kind == "job":  # the job ended (killed): its child goes too
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    selector.unregister(connection)
                    continue
                _, wait_status = os.waitpid(pid, 0)
                selector.unregister(pidfd)
                os.close(pidfd)
                with contextlib.suppress(KeyError):
                    selector.unregister(connection)
                with contextlib.suppress(OSError):
                    connection.sendall(f"{os.waitstatus_to_exitcode(wait_status)}\n".encode())
                connection.close()
                del children[pid]
                idle_since = time.monotonic()
        if not children and time.monotonic() - idle_since > idle_seconds:
            # Unlisted first, so that no job connects to a server that is ending.
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == inode:
                    os.unlink(path)
                    # a clean end leaves nothing behind (a server that failed keeps its log)
                    os.unlink(Path(path).with_suffix(".log"))
            listener.close()
            exit_now(0)


if __name__ == "__main__":
    server_main(*sys.argv[1:4])
