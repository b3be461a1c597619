"""Quiet progress (the local profile's `logger: bitdrift`) on a real Snakemake run: one line
per finished job with jobs done/total, a failed job's error and log in full, Snakemake's
full output one flag away and in its log file, and a job running a while saying where it
is (its log's latest progress line: bitdrift.progress)."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
NUMBERS = [1, 2, 3]
SNAKEFILE = f"""
rule all:
    input: expand("out/{{n}}.txt", n={NUMBERS}), "out/bad.txt"

rule make:
    output: "out/{{n}}.txt"
    log: "logs/{{n}}.log"
    shell: "echo {{wildcards.n}} > {{output}}"

rule bad:
    output: "out/bad.txt"
    log: "logs/bad.log"
    shell: "echo 'the reason it failed' > {{log}}; exit 1"
"""
LINE = re.compile(r"^\[\s*(\d+)/(\d+)\s+\d+:\d\d\] done (.+)$")


def run(folder: Path, *flags: str) -> tuple[int, str]:
    folder.mkdir()
    (folder / "Snakefile").write_text(SNAKEFILE)
    done = subprocess.run([SNAKEMAKE, "-c1", "--keep-going", "--show-failed-logs",
                           "--logger", "bitdrift", *flags], cwd=folder, capture_output=True,
                          text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_one_line_per_finished_job_and_errors_in_full(tmp_path):
    status, output = run(tmp_path / "quiet")
    assert status != 0  # rule bad failed
    finished = [LINE.match(line) for line in output.splitlines() if LINE.match(line)]
    # every `make` job, and neither `bad` (failed) nor `all` (never ran)
    assert sorted(m.group(3) for m in finished) == [f"make (n={n})" for n in NUMBERS]
    counts = [int(m.group(1)) for m in finished]
    assert counts == list(range(1, len(NUMBERS) + 1))
    assert {int(m.group(2)) for m in finished} == {len(NUMBERS) + 2}  # make x3, bad, all
    assert "rule make:" not in output  # no job blocks
    assert "Error in rule bad:" in output and "the reason it failed" in output
    # The full output is in Snakemake's log file, named at the end
    log = re.search(r"Complete log\(s\): (\S+)", output)
    assert log and Path(log.group(1)).read_text().count("rule make:") == len(NUMBERS)


def test_the_full_output_is_one_flag_away(tmp_path):
    status, output = run(tmp_path / "full", "--logger-bitdrift-full")
    assert status != 0
    assert output.count("rule make:") == len(NUMBERS)
    assert not any(LINE.match(line) for line in output.splitlines())


def test_the_local_profile_is_quiet_and_the_cluster_profile_is_not():
    local = yaml.safe_load((ROOT / "profiles/local/config.yaml").read_text())
    cluster = yaml.safe_load((ROOT / "profiles/slurm-gpu/config.yaml").read_text())
    assert local["logger"] == "bitdrift"
    assert "logger" not in cluster  # a cluster run's log keeps every job's block


# -- every error Snakemake reports reaches the terminal in the quiet view -----------------
SLOW_SNAKEFILE = """
rule all:
    input: "out/slow.txt"

rule slow:
    output: report("out/slow.txt")
    log: "logs/slow.log"
    shell: "echo started > {log}; sleep 60; echo done > {output}"
"""


def snakemake_in(folder: Path, *flags: str) -> tuple[int, str]:
    done = subprocess.run([SNAKEMAKE, "-c1", *flags], cwd=folder, capture_output=True,
                          text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def killed_run(folder: Path) -> Path:
    """A run killed with SIGKILL while its job runs (a closed terminal, a lost node): it
    leaves Snakemake's lock behind."""
    folder.mkdir()
    (folder / "Snakefile").write_text(SLOW_SNAKEFILE)
    running = subprocess.Popen([SNAKEMAKE, "-c1", "--logger", "bitdrift"], cwd=folder,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        for _ in range(600):  # at most a minute for the job to start
            if (folder / "logs/slow.log").exists():
                break
            time.sleep(0.1)
        assert (folder / "logs/slow.log").exists(), "the job never started"
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        running.wait()
    assert any((folder / ".snakemake/locks").iterdir())
    return folder


def error_lines(output: str) -> list[str]:
    """The lines of Snakemake's error message in its full output: from the line naming the
    exception (`LockException:`, `WorkflowError:`, ...) to the end, without the logger's
    and Snakemake's own chatter (`Complete log`, `Using profile`)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if re.match(r"^\w+(Exception|Error)\b", line))
    return [line for line in lines[start:] if line.strip()
            and not line.startswith(("Complete log", "Using ", "Assuming "))]


def cases(tmp_path: Path):
    """(name, folder, flags, words the message must hold) of runs that stop on an error
    Snakemake reports itself, not a job's."""
    yield "lock", killed_run(tmp_path / "lock"), (), ["Directory cannot be locked", "--unlock"]
    missing = tmp_path / "missing"
    missing.mkdir()
    (missing / "Snakefile").write_text('rule all:\n    input: "never_made.txt"\n')
    yield "missing input", missing, (), ["Missing input files", "never_made.txt"]
    config = tmp_path / "config"
    config.mkdir()
    (config / "Snakefile").write_text("rule all:\n    input: []\n")
    (config / "broken.yaml").write_text("devices: [tf_1thread\n")
    yield "config syntax", config, ("--configfile", "broken.yaml"), ["not valid JSON or YAML"]
    report = tmp_path / "report"
    report.mkdir()
    (report / "Snakefile").write_text(SLOW_SNAKEFILE)  # out/slow.txt was never made
    yield "report", report, ("--report", "report.html"), ["marked for report but does not exist",
                                                            "out/slow.txt"]


def test_every_error_snakemake_reports_is_on_the_terminal(tmp_path):
    """A run that stops before or outside any job (a lock left by a killed run, a missing
    input, a config that does not parse, a report that cannot be built) exits non-zero and
    the quiet view prints Snakemake's whole message, the same lines the full view prints."""
    for name, folder, flags, words in cases(tmp_path):
        status, quiet = snakemake_in(folder, "--logger", "bitdrift", *flags)
        full_status, full = snakemake_in(folder, "--logger", "bitdrift",
                                         "--logger-bitdrift-full", *flags)
        assert status != 0 and full_status != 0, name
        for word in words:
            assert word in full, (name, word, full)
        missing = [line for line in error_lines(full) if line not in quiet.splitlines()]
        assert not missing, (name, missing, quiet)


# -- a job running a while says where it is ----------------------------------------------
COUNTING_SNAKEFILE = """
rule count:
    output: "out/counted.txt"
    log: "logs/count.log"
    script: "count.py"
"""
# A hand-made loop of three steps, in a workflow job as bitdrift's scripts run (stderr to
# the log): it starts, and takes each step, only when the test has seen the terminal say
# where the job is (a file "go_<state>"), so every state is seen whatever the machine's speed
COUNTING_SCRIPT = """
import time
from pathlib import Path

from bitdrift.jobs import workflow_job
from bitdrift.progress import progress


def wait_for(name):
    while not Path(name).exists():
        time.sleep(0.05)


with workflow_job(snakemake.log[0]):
    wait_for("go_start")
    for step in progress(range(3), "steps done"):
        wait_for(f"go_{step}")
    Path(snakemake.output[0]).write_text("counted")
"""
RUNNING = re.compile(r"^\[\s*0/1\s+\d+:\d\d\] running count for \d+:\d\d: (.+)$")


def test_a_job_running_a_while_says_where_it_is_on_the_terminal(tmp_path):
    """The quiet view's lines for a job running longer than --logger-bitdrift-progress-every
    (1 s here): first that it has counted nothing yet, naming its log, then its latest
    progress, step k of 3, as its loop (bitdrift.progress) goes on; then its one line."""
    (tmp_path / "Snakefile").write_text(COUNTING_SNAKEFILE)
    (tmp_path / "count.py").write_text(COUNTING_SCRIPT)
    environment = {**os.environ, "BITDRIFT_PROGRESS_INTERVAL": "0"}  # every state logged
    running = subprocess.Popen([SNAKEMAKE, "-c1", "--logger", "bitdrift",
                                "--logger-bitdrift-progress-every", "1"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=environment, start_new_session=True)
    # a run that never goes on (a state never shown) is ended, and the asserts say why
    watchdog = threading.Timer(300, os.killpg, (running.pid, signal.SIGKILL))
    watchdog.start()
    seen = []
    try:
        said = []
        for line in running.stdout:
            seen.append(line.rstrip("\n"))
            found = RUNNING.match(seen[-1])
            if found:
                said.append(found.group(1))
                state = found.group(1)
                if state == "nothing counted yet (log: logs/count.log)":
                    (tmp_path / "go_start").touch()
                elif step := re.fullmatch(r"steps done (\d)/3 \[\d\d:\d\d<.+\]", state):
                    (tmp_path / f"go_{step.group(1)}").touch()
        assert running.wait() == 0, seen
    finally:
        watchdog.cancel()
        if running.poll() is None:
            os.killpg(running.pid, signal.SIGKILL)
    assert [re.sub(r" \[.*\]$", "", state) for state in said] == [
        "nothing counted yet (log: logs/count.log)", "steps done 0/3", "steps done 1/3",
        "steps done 2/3"], seen
    assert any(LINE.match(line) and line.endswith("done count") for line in seen), seen
    log = (tmp_path / "logs/count.log").read_text()
    assert "bitdrift: progress: steps done 3/3" in log
