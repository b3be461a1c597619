"""Benchmark reading: what each further sample costs per device, from a run's own logs, and
the inference wall that gives at more samples (on demand; docs/benchmarks.md).

    python benchmarks/per_sample.py RUN_FOLDER --samples 100 --cores 2 [--out per_device.csv]

RUN_FOLDER is a run's workdir (benchmarks/scale.py: OUT/runs/dDEVICES_sSAMPLES_kernels),
holding config.yaml, logs/run_inference/MODEL/DEVICE.log and Snakemake's benchmark files
results/benchmarks/run_inference/MODEL/DEVICE.tsv. Per job:

- its wall (the benchmark file's ``s``) at the run's n samples;
- from the job's log, each pass over the batches (bitdrift.run.repeat.batch_seconds_line:
  the instrumented run and the model as deployed, in each measured repeat and in the
  traced repeat): the seconds per batch after the first (the first compiles and warms);
- a pass that ran every batch grows with the samples; the traced repeat's passes do not
  when it ran the full samples' batches alone (analysis.traced_samples: full);
- the job's wall at S samples: wall + (batches at S - batches at n) x the growing passes'
  seconds per batch. The parent's merge of a digest-only sample (a few digests per
  layer) is not in these lines; check the reading against a run at S (docs/benchmarks.md
  does, on two devices).

Then the inference of all jobs on --cores CPUs: the sum of job wall x threads / cores (no
idle core at all), and a greedy schedule as Snakemake's (longest job first, a job takes its
device's threads, at most the cores). Prints a table and writes --out.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import math
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PASS_LINE = re.compile(r"bitdrift: (instrumented|deployed) run of (\d+) batches of (\d+): "
                       r"([\d.]+) s, the first ([\d.]+) s(?:, then ([\d.]+) s per batch)?")
REPEAT_LINE = re.compile(r"bitdrift: .* on .*: (repeat \d+/\d+|traced repeat)")
TRACED_FULL = "analysis.traced_samples: full"
COLUMNS = ["device", "threads", "samples", "batch_size", "wall_s", "growing_s_per_batch",
           "fixed_traced", "target_samples", "wall_s_at_target"]


def passes(log_text: str) -> list[dict]:
    """Every pass line of a job's log: {repeat, run, batches, batch, seconds, first,
    per_batch, traced_full}; ``repeat`` is the repeat whose worker printed it."""
    found, repeat, traced_full = [], None, False
    for line in log_text.splitlines():
        started = REPEAT_LINE.search(line)
        if started:
            repeat = started.group(1)
            traced_full = repeat == "traced repeat" and TRACED_FULL in line
        matched = PASS_LINE.search(line)
        if matched and repeat:
            run, batches, batch, seconds, first, per_batch = matched.groups()
            found.append({"repeat": repeat, "run": run, "batches": int(batches),
                          "batch": int(batch), "seconds": float(seconds),
                          "first": float(first),
                          # one batch only: the first's seconds, an upper bound
                          "per_batch": float(per_batch) if per_batch else float(first),
                          "traced_full": traced_full})
    return found


def job_reading(log_text: str, wall: float, samples: int, target: int) -> dict:
    """One job's wall at ``target`` samples from its log and its wall at ``samples``."""
    found = passes(log_text)
    if not found:
        raise ValueError("no pass line (bitdrift: instrumented run of ...) in the log: a "
                         "device that failed, or a run of a bitdrift older than these lines")
    batch = found[0]["batch"]
    growing = sum(item["per_batch"] for item in found if not item["traced_full"])
    extra = math.ceil(target / batch) - math.ceil(samples / batch)
    return {"batch_size": batch, "growing_s_per_batch": round(growing, 3),
            "fixed_traced": any(item["traced_full"] for item in found),
            "wall_s_at_target": round(wall + extra * growing, 1)}


def schedule(jobs: list[tuple[float, int]], cores: int) -> float:
    """The wall of ``jobs`` (seconds, threads) started greedily, longest first, each as soon
    as its threads (at most ``cores``) are free: the order Snakemake's scheduler keeps
    close to when every job is ready at once."""
    waiting = sorted(((seconds, min(threads, cores)) for seconds, threads in jobs),
                     reverse=True)
    running: list[tuple[float, int]] = []  # (end, threads)
    now, free = 0.0, cores
    while waiting or running:
        started = True
        while started:
            started = False
            for index, (seconds, threads) in enumerate(waiting):
                if threads <= free:
                    heapq.heappush(running, (now + seconds, threads))
                    free -= threads
                    del waiting[index]
                    started = True
                    break
        end, threads = heapq.heappop(running)
        now, free = end, free + threads
    return now


def read_run(folder: Path, target: int) -> list[dict]:
    sys.path.insert(0, str(REPO / "src"))
    from bitdrift.config import load_config

    config = load_config(folder / "config.yaml")
    samples = len(config["samples"])
    rows = []
    for log in sorted((folder / "logs" / "run_inference").glob("*/*.log")):
        device = log.stem
        tsv = folder / "results" / "benchmarks" / "run_inference" / log.parent.name / \
            f"{device}.tsv"
        if not tsv.is_file():  # a job still running, or one that failed
            print(f"{device}: no {tsv.name} (not finished): left out", file=sys.stderr)
            continue
        with open(tsv) as handle:
            wall = float(next(csv.DictReader(handle, delimiter="\t"))["s"])
        threads = config["devices"][device].get("threads") or 1
        try:
            reading = job_reading(log.read_text(errors="replace"), wall, samples, target)
        except ValueError as error:  # a device that failed (its failure record) runs no pass
            print(f"{device}: {error}: left out", file=sys.stderr)
            continue
        rows.append({"device": device, "threads": threads, "samples": samples,
                     "wall_s": round(wall, 1), "target_samples": target, **reading})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a run's workdir (config.yaml, logs/)")
    parser.add_argument("--samples", type=int, default=100, help="the samples to read at")
    parser.add_argument("--cores", type=int, default=2, help="CPUs the jobs share")
    parser.add_argument("--out", type=Path, help="CSV of the per-device rows")
    args = parser.parse_args()
    rows = read_run(args.folder, args.samples)
    if not rows:
        sys.exit(f"{args.folder}: no logs/run_inference/*/*.log")
    rows.sort(key=lambda row: -row["wall_s_at_target"])
    print(f"{'device':26} {'threads':>7} {'wall':>8} {'s/batch':>8} "
          f"{'at ' + str(args.samples):>9}")
    for row in rows:
        print(f"{row['device']:26} {row['threads']:>7} {row['wall_s']:>8.1f} "
              f"{row['growing_s_per_batch']:>8.3f} {row['wall_s_at_target']:>9.1f}")
    for label, key in ((f"at {rows[0]['samples']} samples (measured)", "wall_s"),
                       (f"at {args.samples} samples (read)", "wall_s_at_target")):
        jobs = [(row[key], row["threads"]) for row in rows]
        packed = sum(seconds * min(threads, args.cores) for seconds, threads in jobs) / \
            args.cores
        print(f"inference {label}: {sum(seconds for seconds, _ in jobs):,.0f} s of jobs; "
              f"on {args.cores} cores {packed / 3600:.2f} h with no core idle, "
              f"{schedule(jobs, args.cores) / 3600:.2f} h scheduled greedily")
    if args.out:
        with open(args.out, "w", newline="") as handle:
            writer = csv.DictWriter(handle, COLUMNS)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
