"""A real single-node SLURM cluster for the tests: munge, slurmctld and slurmd from Debian.

State, spool and logs live in one directory. The config goes to /etc/slurm, the default
location, because the SLURM executor's job step strips SLURM_* variables (SLURM_CONF too)
before its nested `srun`, which then finds no config anywhere else. A config there that
this module did not write is never overwritten, and ours is removed on stop. The node has three
partitions, cpu (default), gpu and tpu, and fake GPU/TPU GRES backed by /dev/null: SLURM
then schedules and records GRES requests exactly as on a real site, while the jobs
themselves run on the host CPU.
"""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo")
SBIN = ("/usr/sbin", "/usr/bin", "/sbin")
CONF_DIR = Path("/etc/slurm")
MARKER = "# written by bitdrift's test cluster (tests/cluster/slurm.py)"


class ClusterUnavailable(RuntimeError):
    """SLURM cannot be started on this machine (not root, packages missing)."""


def _which(name):
    path = shutil.which(name, path=os.pathsep.join([*SBIN, os.environ.get("PATH", "")]))
    if path is None:
        raise ClusterUnavailable(
            f"'{name}' not found: install Debian's slurmctld slurmd slurm-client munge "
            "(`./quickstart test` does this when run as root)"
        )
    return path


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _node_line():
    """The node as slurmd sees it (CPUs, sockets, memory), with the fake GRES added."""
    line = subprocess.run([_which("slurmd"), "-C"], capture_output=True, text=True,
                          check=True).stdout.splitlines()[0]
    fields = dict(item.split("=", 1) for item in line.split())
    memory = int(fields["RealMemory"]) - 1024  # leave the OS some room
    keep = ("NodeName", "CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket",
            "ThreadsPerCore")
    node = " ".join(f"{key}={fields[key]}" for key in keep if key in fields)
    gres = "Gres=gpu:1,tpu:1 Features=bitdrift_node State=UNKNOWN"
    return fields["NodeName"], f"{node} RealMemory={memory} {gres}"


class SlurmCluster:
    """Start with `start()`, stop with `stop()`; `env` is what clients need."""

    def __init__(self, root):
        self.root = Path(root)
        self.processes = []
        self.env = {}

    def start(self, timeout=60):
        if os.geteuid() != 0:
            raise ClusterUnavailable("the test cluster's daemons must be started as root")
        for name in DAEMONS:
            _which(name)
        self._start_munge()
        node, node_line = _node_line()
        self.node = node
        for folder in ("state", "spool", "log"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        conf = CONF_DIR / "slurm.conf"
        if conf.exists() and not conf.read_text().startswith(MARKER):
            raise ClusterUnavailable(f"{conf} belongs to a real SLURM set-up; not touching it")
        CONF_DIR.mkdir(parents=True, exist_ok=True)
        conf.write_text(
            "\n".join([
                MARKER,
                "ClusterName=bitdrift-test",
                f"SlurmctldHost={node}(127.0.0.1)",
                f"SlurmctldPort={_free_port()}",
                f"SlurmdPort={_free_port()}",
                "SlurmUser=root",
                "AuthType=auth/munge",
                "MpiDefault=none",
                f"StateSaveLocation={self.root / 'state'}",
                f"SlurmdSpoolDir={self.root / 'spool'}",
                f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
                f"SlurmdPidFile={self.root / 'slurmd.pid'}",
                f"SlurmctldLogFile={self.root / 'log/slurmctld.log'}",
                f"SlurmdLogFile={self.root / 'log/slurmd.log'}",
                # No systemd and no cgroups on these machines.
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core_Memory",
                # Without a default, one job would take the whole node's memory.
                "DefMemPerCPU=1000",
                "AccountingStorageType=accounting_storage/none",
                "JobAcctGatherType=jobacct_gather/none",
                # Finished jobs stay in slurmctld for squeue/scontrol (no slurmdbd here).
                "MinJobAge=600",
                "ReturnToService=2",
                "SchedulerType=sched/backfill",
                "GresTypes=gpu,tpu",
                node_line,
                f"PartitionName=cpu Nodes={node} Default=YES MaxTime=INFINITE State=UP",
                f"PartitionName=gpu Nodes={node} MaxTime=INFINITE State=UP",
                f"PartitionName=tpu Nodes={node} MaxTime=INFINITE State=UP",
                "",
            ])
        )
        # Without a File, a GPU GRES drains the node; /dev/null stands in for the device.
        (CONF_DIR / "gres.conf").write_text(
            f"{MARKER}\n"
            f"NodeName={node} Name=gpu File=/dev/null\n"
            f"NodeName={node} Name=tpu Count=1\n"
        )
        self.env = {"SLURM_CONF": str(conf)}
        env = {**os.environ, **self.env}
        for daemon in ("slurmctld", "slurmd"):
            log = open(self.root / f"log/{daemon}.out", "w")
            self.processes.append(subprocess.Popen(
                [_which(daemon), "-D", *(["-i"] if daemon == "slurmctld" else [])],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            ))
        self._wait_for_idle_node(timeout)
        return self

    def _start_munge(self):
        if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
            return
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["runuser", "-u", "munge", "--", _which("munged")], check=True)

    def _wait_for_idle_node(self, timeout):
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise ClusterUnavailable(
                        f"{process.args[0]} exited with {process.returncode}: "
                        + self.logs()
                    )
            result = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
            state = result.stdout.strip()
            if result.returncode == 0 and state and all(
                    line.startswith("idle") for line in state.splitlines()):
                return
            time.sleep(0.5)
        raise ClusterUnavailable(f"node not idle after {timeout} s ({state!r}): {self.logs()}")

    def run(self, command, *args, check=True):
        return subprocess.run([_which(command), *args], capture_output=True, text=True,
                              env={**os.environ, **self.env}, check=check)

    def jobs(self):
        """Every job slurmctld still knows (MinJobAge keeps finished ones), as dicts."""
        output = self.run("scontrol", "show", "job", "--oneliner", "--details").stdout
        jobs = []
        for line in output.splitlines():
            if not line.strip() or line.startswith("No jobs"):
                continue
            job, key = {}, None
            for token in line.split():
                if "=" in token:
                    key, value = token.split("=", 1)
                    job[key] = value
                elif key is not None:  # a value with spaces (e.g. a command line)
                    job[key] += " " + token
            jobs.append(job)
        return jobs

    def logs(self):
        texts = []
        for log in sorted((self.root / "log").glob("*")):
            texts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}")
        return "\n".join(texts)

    def stop(self):
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.processes = []
        for name in ("slurm.conf", "gres.conf"):
            path = CONF_DIR / name
            if path.exists() and path.read_text().startswith(MARKER):
                path.unlink()
