"""Benchmark: where a finished run's job-seconds went, start-up against work (on demand).

    python benchmarks/first_run.py [RUN_FOLDER]     # default: this checkout

Reads what a run leaves: every job's wall seconds (Snakemake's ``benchmark:`` files under
``results/benchmarks/RULE/``) and, in the jobs' logs (``logs/RULE/``), the seconds each
worker process spent on its job (``bitdrift: work ... s``: load, compute, write; written by
bitdrift.prefork for every inference repeat and training run). For the rules whose jobs
run workers, start-up is the job-seconds less that work: interpreters, framework imports,
the parent's own reading and writing, and exits. Jobs of the other rules (the main model's
training, export, the MaxPool study, analysis) are not split; the overall share is given
as the range from "all their time is work" to "all of it is start-up".
"""

from __future__ import annotations

import argparse
import collections
import csv
import re
from pathlib import Path

WORK = re.compile(r"^bitdrift: work ([0-9.]+) s$", re.MULTILINE)


def job_seconds(root: Path) -> dict[str, list[float]]:
    seconds = collections.defaultdict(list)
    for path in sorted((root / "results" / "benchmarks").rglob("*.tsv")):
        rows = list(csv.DictReader(path.open(), delimiter="\t"))
        if rows:
            rule = path.relative_to(root / "results" / "benchmarks").parts[0]
            seconds[rule].append(float(rows[-1]["s"]))
    return seconds


def work_seconds(root: Path) -> dict[str, float]:
    work = collections.Counter()
    for path in (root / "logs").rglob("*.log"):
        found = WORK.findall(path.read_text(errors="replace"))
        if found:
            work[path.relative_to(root / "logs").parts[0]] += sum(map(float, found))
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", default=".", type=Path)
    root = parser.parse_args().run
    seconds, work = job_seconds(root), work_seconds(root)
    if not seconds:
        raise SystemExit(f"{root}: no results/benchmarks/*.tsv (has the run finished?)")
    print("| rule | jobs | job-seconds | worker work | start-up |")
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
    print(f"\nall jobs: {sum(map(len, seconds.values()))}, {everything:.0f} job-seconds; "
          f"in the jobs that run workers ({split_total:.0f} s) start-up is "
          f"{startup:.0f} s ({startup / split_total:.0%})" if split_total else "")
    print(f"start-up share of all job-seconds: between {startup / everything:.0%} (the jobs "
          f"not split all work) and {(startup + other) / everything:.0%} (all start-up)")


if __name__ == "__main__":
    main()
