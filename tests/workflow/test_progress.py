"""Quiet progress (the local profile's `logger: bitdrift`) on a real Snakemake run: one line
per finished job with jobs done/total, a failed job's error and log in full, Snakemake's
full output one flag away and in its log file."""

import re
import subprocess
import sys
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
