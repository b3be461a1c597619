"""A pre-imported parent shared by the jobs of one device: runs and repeats without an import each.

A training run is one Snakemake job (adding runs to a plan must never retrain the runs it
has), and an inference job has a few repeats, so a pre-imported parent per job
(:class:`bitdrift.run.workers.ForkedChildren`) imports about as often as fresh processes do.
Instead the first job of a device starts a *fork server*: ``python -m bitdrift.run.fork_server
BACKEND SOCKET`` with the device's environment, which imports the framework and nothing
else (as a prefork parent does) and listens on a Unix socket. Every job of that device on
this machine, training or inference, connects and hands over its work (a job function,
``module:function``, imported by the server once) and its log's file descriptors; the
server forks a child that runs it where a fresh process would be after its import, and
the job gets the child's exit status. ``tests/unit/test_forkserver.py`` trains runs and
runs inference in served children and in fresh processes and compares every array and
weight bit for bit.

The server is found by a key: the digest of everything that shapes what a child computes
(the interpreter, the device's whole environment, bitdrift's source files and the
installed packages' folders). A change of any of them starts another server; a server
without jobs for :data:`IDLE_SECONDS` removes its socket and ends, and so does the server
idle longest while more than :data:`MAX_SERVERS` listen (each holds its framework's
import in memory, about half a gigabyte).

Lifetimes: a job killed (SIGKILL included) closes its connection, and the server kills
that job's child at once; a server that ends takes its children with it
(``PR_SET_PDEATHSIG``), and their jobs fail naming it. Under SLURM each job stays in its
own fresh process: a server started by one job would live in that job's cgroup, outside
the resources the scheduler gave the others, and die with it.

    python -m bitdrift.run.fork_server BACKEND SOCKET_PATH
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import selectors
import signal
import site
import socket
import stat
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import bitdrift
from bitdrift import backends
from bitdrift.emulation.cpus import python_command
from bitdrift.errors import BitdriftError
from bitdrift.jobs import waiting_on_workers
from bitdrift.run.workers import (
    _LIBC,
    FreshProcesses,
    _accelerator_missing,
    child_main,
    exit_now,
    forkable,
    job_function,
    worker_processes,
)

IDLE_SECONDS = 60.0  # a server without jobs this long ends (the next job starts another)
IDLE = "BITDRIFT_FORKSERVER_IDLE"  # seconds, to replace IDLE_SECONDS (tests)
MAX_SERVERS = 4  # listening at once: more, and the one idle longest ends
MAX = "BITDRIFT_FORKSERVER_MAX"  # to replace MAX_SERVERS
CROWDED_GRACE_SECONDS = 5.0  # idle at least this long before the cap ends a server (a
# job's next repeat or run comes within it)
START_SECONDS = 300.0  # how long a job waits for a server's import (TensorFlow under load)
FRESH = "BITDRIFT_FRESH_WORKERS"  # set (to 1): every job in its own fresh process
_HEADER = struct.Struct("!I")  # the length of a request's JSON, sent with its descriptors


def socket_folder() -> Path:
    """Where this user's servers listen: node-local and private to the user (a folder of
    that name that another user made, or a link, is refused: it could pose as a server)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    folder = Path(base) / f"bitdrift-forkserver-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        pass  # checked below, whatever it is
    except OSError as error:
        raise BitdriftError(f"{folder}: cannot make the fork servers' folder "
                            f"({error.strerror}); set XDG_RUNTIME_DIR to a folder of this "
                            f"user's, or {FRESH}=1") from error
    found = folder.lstat()
    if not stat.S_ISDIR(found.st_mode):
        what = "a link" if stat.S_ISLNK(found.st_mode) else "a file"
        raise BitdriftError(f"{folder} is {what}, not a folder private to this user; refusing "
                            f"to look for fork servers there (remove it, or set {FRESH}=1)")
    if found.st_uid != os.getuid() or stat.S_IMODE(found.st_mode) & 0o077:
        raise BitdriftError(f"{folder} is not a folder private to this user (owner, mode "
                            f"{stat.S_IMODE(found.st_mode):o}); refusing to look for fork "
                            f"servers there (remove it, or set {FRESH}=1)")
    return folder


def _stat(path) -> list | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return [str(path), found.st_mtime_ns, found.st_size]


def _source_state() -> list:
    """What a code, package or library change alters: bitdrift's files, the folders of the
    installed packages and of the environment's shared libraries (conda's MKL, oneDNN,
    CUDA), and Keras' own configuration, read at import. A change makes another key."""
    package = Path(bitdrift.__file__).parent
    files = sorted((str(path.relative_to(package)), path.stat().st_mtime_ns, path.stat().st_size)
                   for path in package.rglob("*.py"))
    folders = {sysconfig.get_paths()[name] for name in ("purelib", "platlib")}
    folders |= {site.getusersitepackages(), str(Path(sys.prefix) / "lib")}
    keras_home = os.environ.get("KERAS_HOME") or str(Path.home() / ".keras")
    return [str(package), files, [_stat(folder) for folder in sorted(folders)],
            _stat(Path(keras_home) / "keras.json")]


def server_key(device: dict, environment: dict) -> str:
    """The digest that names the server of ``device`` with ``environment``."""
    state = {"python": python_command(device), "backend": device["backend"],
             "environment": sorted(environment.items()), "source": _source_state(),
             "cpus": sorted(os.sched_getaffinity(0))}  # a child inherits the server's
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()[:24]


def served(device: dict) -> bool:
    """Whether ``device``'s jobs run in children of a shared server on this machine."""
    return (forkable(device) and not device.get("emulate")
            and "SLURM_JOB_ID" not in os.environ and os.environ.get(FRESH, "") in ("", "0"))


class ServedChildren:
    """Jobs as children of the device's shared server (started by the first job that finds
    none); the interface of :class:`bitdrift.run.workers.FreshProcesses`."""

    HOW = "a child of the device's fork server"

    def __init__(self, target: str, device: dict, what: str, log):
        from bitdrift.run.devices import device_environment

        self.target, self.device, self.what, self.log = target, device, what, log
        self.environment = device_environment(device)
        self.key = server_key(device, self.environment)
        self.path = socket_folder() / f"{self.key}.sock"
        if len(str(self.path)) > 96:  # a socket's path holds 107 bytes; the server's
            # staging name adds its pid
            raise BitdriftError(f"{self.what}: the fork server's socket path {self.path} is "
                                "too long for a Unix socket; set XDG_RUNTIME_DIR to a short "
                                f"folder, or {FRESH}=1")

    def run(self, job: dict, stdout=None, environment: dict | None = None) -> int:
        with waiting_on_workers():
            return self._run(job, stdout, environment)

    def _run(self, job: dict, stdout, environment: dict | None) -> int:
        request = json.dumps({"target": self.target, "job": job, "cwd": os.getcwd(),
                              "environment": environment or {},
                              "stdout": stdout.name if stdout is not None else None}).encode()
        for stream in (self.log, stdout):  # before connecting: a full pipe stalls us, not it
            if stream is not None:
                stream.flush()
        descriptors = [(stdout or self.log).fileno(), self.log.fileno()]
        for _attempt in range(3):  # a server that ended idle just as this job came: another
            connection = self._connect()
            with connection, connection.makefile("r") as answers:
                try:
                    socket.send_fds(connection, [_HEADER.pack(len(request))], descriptors)
                    connection.sendall(request)
                    started = answers.readline()
                except OSError:
                    continue
                if started.startswith("bitdrift: error:"):  # it cannot import the function
                    raise BitdriftError(f"{self.what}: the fork server {self.key[:12]} "
                                        f"{started.strip().removeprefix('bitdrift: error: ')}")
                if not started.startswith("started "):
                    continue
                print(f"bitdrift: in child {started.split()[1]} of fork server "
                      f"{self.key[:12]} (pid {started.split()[2]})", file=self.log, flush=True)
                try:
                    finished = answers.readline()
                except BaseException:
                    # interrupted (KeyboardInterrupt in a notebook that keeps this frame):
                    # the server sees the job end and kills its child
                    connection.shutdown(socket.SHUT_RDWR)
                    raise
                if not finished.strip():
                    raise BitdriftError(f"{self.what}: the fork server {self.path} ended while "
                                        "its job ran; see its log "
                                        f"{self.path.with_suffix('.log')}")
                status = int(finished)
                _accelerator_missing(status, self.device, self.what, job)
                return status
        said = [line for line in _read(self.path.with_suffix(".log")).splitlines()
                if line.startswith("bitdrift: error:")]
        raise BitdriftError(f"{self.what}: the fork server {self.path} took no job (3 tries)"
                            + (f": {said[-1]}" if said else "")
                            + f"; see {self.path.with_suffix('.log')}")

    def _connect(self) -> socket.socket:
        """A connection to the server, started first (one job at a time) if there is none
        (a server ends only while no job holds its lock: the one started here listens)."""
        connection = _try_connect(self.path)
        if connection is not None:
            return connection
        with _locked(self.path.with_suffix(".lock")):  # one start per server
            connection = _try_connect(self.path)
            if connection is not None:
                return connection
            server_log = self.path.with_suffix(".log")
            with open(server_log, "a") as handle:
                server = subprocess.Popen(
                    [*python_command(self.device), "-m", "bitdrift.run.fork_server",
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
                    tail = _read(server_log).strip().splitlines()[-3:]
                    raise BitdriftError(f"{self.what}: the fork server ended (exit {status}) "
                                        f"before it listened: {' / '.join(tail)}")
                time.sleep(0.05)
            server.kill()
            raise BitdriftError(f"{self.what}: the fork server did not listen within "
                                f"{START_SECONDS:.0f} s; see {server_log}")

    def close(self, failed: bool = False) -> None:
        pass  # the server serves the device's next job; it ends when idle


@contextlib.contextmanager
def _locked(path: Path):
    """The key's lock, held: one job starts its server, and a server ends only while no
    job starts one. A lock file removed by an ending server while this job waited for it
    is not the key's lock any more: open the new one."""
    while True:
        with open(path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                current = os.fstat(lock.fileno()).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                current = False
            if current:
                yield
                return


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _try_connect(path: Path) -> socket.socket | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.settimeout(30)  # a server that listens but never accepts is not waited on
    try:
        connection.connect(str(path))
    except OSError:  # no socket, or one whose server ended
        connection.close()
        return None
    connection.settimeout(None)  # a run takes as long as it takes
    return connection


@contextlib.contextmanager
def training_workers(target: str, device: dict, what: str, log):
    """Where ``device``'s training runs: a served child when :func:`served`, else a fresh
    process; ``run(job)`` returns the job's exit status."""
    kind = ServedChildren if served(device) else FreshProcesses
    yield kind(target, device, what, log)


@contextlib.contextmanager
def repeat_workers(target: str, device: dict, what: str, log):
    """Where ``device``'s repeats (inference) run: served children when :func:`served`,
    else :func:`bitdrift.run.workers.worker_processes` (a parent per job, its import once for
    the job's repeats, or fresh processes)."""
    if served(device):
        yield ServedChildren(target, device, what, log)
    else:
        with worker_processes(target, device, what, log) as workers:
            yield workers


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    """A job's request and its two log descriptors; on any error none is left open (a
    descriptor kept would go to every later child)."""
    connection.settimeout(10)  # a client that stalls must not stall the server
    descriptors = []
    try:
        header, descriptors, _, _ = socket.recv_fds(connection, _HEADER.size, 2)
        if len(header) != _HEADER.size or len(descriptors) != 2:
            raise OSError("a request without its header and two descriptors")
        (length,) = _HEADER.unpack(header)
        body = b""
        while len(body) < length:
            chunk = connection.recv(length - len(body))
            if not chunk:
                raise OSError("a request cut short")
            body += chunk
        request = json.loads(body)
        if not isinstance(request, dict) or not isinstance(request.get("target"), str):
            raise ValueError("a request that is not an object with a target")
        return request, descriptors
    except BaseException:
        for descriptor in descriptors:
            os.close(descriptor)
        raise


def server_main(backend: str, path: str) -> None:
    """The server: import, listen, fork a child per job, report its status, end when idle
    or when too many servers listen."""
    try:
        backends.get(backend).preimport()
        idle_seconds = float(os.environ.get(IDLE, IDLE_SECONDS))
        max_servers = int(os.environ.get(MAX, MAX_SERVERS))
    except (BitdriftError, ValueError) as error:
        print(f"bitdrift: error: {error}", file=sys.stderr, flush=True)
        exit_now(getattr(error, "exit_code", 2))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staging)  # left by a server of the same pid that was killed
    listener.bind(staging)
    listener.listen(16)
    os.rename(staging, path)  # the socket appears ready to take jobs, never before
    inode = os.stat(path).st_ino
    # Threads after the import: none of the frameworks' own (nothing ran); with several
    # OMP threads, OpenBLAS's pool, which stops itself around a fork (pthread_atfork).
    # tests/unit/test_prefork.py and test_forkserver.py hold children to fresh processes.
    print(f"bitdrift: fork server {os.getpid()} listens on {path} "
          f"({_threads()} thread(s) after the import)",
          file=sys.stderr, flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    children = {}  # pid -> (connection, pidfd)
    functions = {}  # target -> the job function, imported once
    # KEY.PID.state, "idle" or "busy" while the server lives; an idle one's time is when it
    # fell idle (servers count one another by these, not by sockets a killed one left)
    state = Path(path).with_suffix(f".{os.getpid()}.state")
    _write_state(state, "idle")
    idle_since = time.monotonic()
    troubled = False  # a bad request or a lost job: the log is kept at the end
    while True:
        for key, _ in selector.select(timeout=1.0):
            if key.data is None:
                troubled |= not _start_child(listener, selector, children, functions)
                if len(children) == 1:
                    _write_state(state, "busy")
                continue
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
            if not children:
                _write_state(state, "idle")
        idle = time.monotonic() - idle_since
        if children or not (idle > idle_seconds or (
                idle > CROWDED_GRACE_SECONDS and _crowded(state, max_servers))):
            continue
        with open(Path(path).with_suffix(".lock"), "a") as lock:
            try:  # a job that holds the lock is starting a server of this key, or
                # about to connect: this one serves on
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            # Unlisted first, so that no job connects to a server that is ending; the
            # lock goes too (a job that waited for it opens the new one: _locked)
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == inode:
                    os.unlink(path)
                    os.unlink(Path(path).with_suffix(".lock"))
                    if not troubled:  # a clean end leaves nothing behind
                        os.unlink(Path(path).with_suffix(".log"))
            with contextlib.suppress(OSError):
                state.unlink()
            listener.close()
            exit_now(0)


def _threads() -> int:
    """This process's threads (logged: forking more than one is safe only for pools that
    stop themselves around a fork, as OpenBLAS's does)."""
    return len(os.listdir("/proc/self/task"))


def _write_state(state: Path, what: str) -> None:
    """Whole or not at all (a reader never sees half), and never the end of the server:
    a folder gone (its user logged out) only stops the count."""
    staging = state.with_suffix(".staging")
    with contextlib.suppress(OSError):
        staging.write_text(what)
        os.rename(staging, state)


def _crowded(state: Path, max_servers: int) -> bool:
    """Whether more than ``max_servers`` fork servers live and this idle one fell idle
    first."""
    live, idle = 0, []
    for other in state.parent.glob("*.state"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(other.name.split(".")[-2])
            if other == state or _server_alive(pid):  # a killed server's state is passed over
                live += 1
                if other.read_text() == "idle":
                    idle.append((other.stat().st_mtime_ns, other.name))
    return live > max_servers and bool(idle) and min(idle)[1] == state.name


def _server_alive(pid: int) -> bool:
    """Whether ``pid`` is a fork server that runs (not a zombie, not a reused pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            running = stat_file.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
        with open(f"/proc/{pid}/cmdline", "rb") as command:
            return running and b"bitdrift.run.fork_server" in command.read().split(b"\0")
    except OSError:
        return False


def _start_child(listener, selector, children: dict, functions: dict) -> bool:
    """Accept a job, import its function (once a target), and fork its child; whether all
    went well. A client that stalls, sends garbage or is gone before its child started,
    or names a function that cannot be imported, never ends the server."""
    connection, _ = listener.accept()
    try:
        request, descriptors = _receive(connection)
    except (OSError, ValueError) as error:
        print(f"bitdrift: fork server: a bad request ({error})", file=sys.stderr, flush=True)
        connection.close()
        return False
    try:
        target = request["target"]
        if target not in functions:
            # the server's children inherit what this import loads (bitdrift's modules,
            # h5py): test_forkserver.py holds a repeat served after a training run to a
            # fresh process's, bit for bit
            functions[target] = job_function(target)
            print(f"bitdrift: fork server: imported {target} "
                  f"({_threads()} thread(s) now)",
                  file=sys.stderr, flush=True)
        function = functions[target]
    except Exception as error:  # noqa: BLE001 - the job is told; the server goes on
        said = f"cannot import {request.get('target')!r}: {type(error).__name__}: {error}"
        print(f"bitdrift: fork server: {said}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):
            connection.sendall(f"bitdrift: error: {' '.join(said.split())}\n".encode())
        connection.close()
        for descriptor in descriptors:
            os.close(descriptor)
        return False
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    _LIBC.fflush(None)  # nothing buffered is copied into the child's log
    server = os.getpid()
    pid = os.fork()
    if pid == 0:
        selector.close()
        listener.close()
        for other, pidfd in children.values():
            other.close()
            os.close(pidfd)
        connection.close()
        child_main(function, request, server, descriptors)
    for descriptor in descriptors:
        os.close(descriptor)
    pidfd = os.pidfd_open(pid)
    children[pid] = (connection, pidfd)
    selector.register(pidfd, selectors.EVENT_READ, ("child", pid))
    try:
        connection.sendall(f"started {pid} {server}\n".encode())
        connection.settimeout(None)
        selector.register(connection, selectors.EVENT_READ, ("job", pid))
    except OSError:  # the job is gone already: so is its child (reaped by its pidfd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        print(f"bitdrift: fork server: job of child {pid} gone before it started",
              file=sys.stderr, flush=True)
        return False
    return True


if __name__ == "__main__":
    server_main(*sys.argv[1:3])
