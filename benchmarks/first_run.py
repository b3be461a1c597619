"""Benchmark: where a finished run's job-seconds went, start-up against work (on demand).

    python benchmarks/first_run.py [RUN_FOLDER]     # default: this checkout

Reads what a run leaves: every job's wall seconds (Snakemake's ``benchmark:`` files under
``results/benchmarks/RULE/``) and, in the jobs' logs (``logs/RULE/``), the seconds of work:
- every job's own, ``bitdrift: job work ... s`` (bitdrift.jobs): from the end of its
  framework's import (Keras, torch), or from the script's call if it loads none, to its
  end, less the time it waited on worker processes;
- every worker's (inference repeats, training runs), ``bitdrift: work ... s`` (load,
  compute, write; bitdrift.run.workers).
Start-up is the job-seconds less that work: interpreters, Snakemake's script preamble,
framework imports, starting workers and fork servers, exits. A rule whose logs have
neither line (a run of an older bitdrift) is not split, and the share is then a range.
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
from pathlib import Path

WORKER_WORK = re.compile(r"^bitdrift: work ([0-9.]+) s$", re.MULTILINE)
JOB_WORK = re.compile(r"^bitdrift: job work ([0-9.]+) s$", re.MULTILINE)


def job_seconds(root: Path) -> dict[str, list[float]]:
    seconds = collections.defaultdict(list)
    for path in sorted((root / "results" / "benchmarks").rglob("*.tsv")):
        rows = list(csv.DictReader(path.open(), delimiter="\t"))
        if rows:
            rule = path.relative_to(root / "results" / "benchmarks").parts[0]
            seconds[rule].append(float(rows[-1]["s"]))
    return seconds


def work_seconds(root: Path) -> dict[str, float]:
    """Each rule's work: its jobs' own and their workers'."""
    work = collections.Counter()
    for path in (root / "logs").rglob("*.log"):
        text = path.read_text(errors="replace")
        seconds = WORKER_WORK.findall(text) + JOB_WORK.findall(text)
        if seconds:
            work[path.relative_to(root / "logs").parts[0]] += sum(map(float, seconds))
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", default=".", type=Path)
    root = parser.parse_args().run
    seconds, work = job_seconds(root), work_seconds(root)
    if not seconds:
        raise SystemExit(f"{root}: no results/benchmarks/*.tsv (has the run finished?)")
    print("| rule | jobs | job-seconds | work | start-up |")
    print("|---|---|---|---|---|")
    split_total = split_work = other = 0.0
    for rule, values in sorted(seconds.items(), key=lambda item: -sum(item[1])):
        total = sum(values)
        if rule in work:
            split_total += total
            split_work += work[rule]
            print(f"| {rule} | {len(values)} | {total:.0f} s | {work[rule]:.0f} s | "
                  f"{total - work[rule]:.0f} s ({(total - work[rule]) / total:.0%}) |")
        else:
            other += total
            print(f"| {rule} | {len(values)} | {total:.0f} s | not split | |")
    everything = split_total + other
    startup = split_total - split_work
    print(f"\nall jobs: {sum(map(len, seconds.values()))}, {everything:.0f} job-seconds, "
          f"of which start-up {startup:.0f} s")
    if other:
        print(f"start-up share of all job-seconds: between {startup / everything:.0%} (the "
              f"jobs not split all work) and {(startup + other) / everything:.0%} (all "
              "start-up)")
    else:
        print(f"start-up share of all job-seconds: {startup / everything:.0%}")


if __name__ == "__main__":
    main()
