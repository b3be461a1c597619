"""Benchmark: what the spine costs as the work grows (on demand; docs/benchmarks.md).

    nice -n 10 python benchmarks/scale.py --out /tmp/scale --devices 2 --samples 3 6
    python benchmarks/scale.py --out /tmp/scale --devices 2 4 8 30 --samples 3 10 100
    python benchmarks/scale.py --out /tmp/scale --devices 1 --samples 3 --kernels on
    python benchmarks/scale.py --out /tmp/scale --devices 2 --samples 3 --stage locate_divergence
    python benchmarks/scale.py --out /tmp/scale --devices 2 --samples 3 --overlay more.yaml
    python benchmarks/scale.py --out /tmp/scale --plot-only   # redraw from OUT/scale.csv

For every point of the grid (devices x samples x kernels on/off) it writes a complete
config (ResNet-50 from the model zoo at --image-size on the embedded digits resized to it,
untrained: `epochs: 0`, the initialised weights, which cost what trained ones do) and runs
the spine with Snakemake (`snakemake all`: inference with the traced repeat and the
orders when kernels are on, eqc, precision, divergence, explain, effective precision,
findings, the report) in its own folder OUT/runs/dDEVICES_sSAMPLES[_kernels]. The N
devices are the first N of the default config's (config.yaml, the `cast` matrix expanded)
taken in turn from each runtime (tensorflow, onnxruntime, torch, openvino, jax, litert),
so a small N already pays for the exports and the reference; --device names them instead.

Measured per job, through the workflow only (so it runs unchanged on a newer record
format): wall seconds, Snakemake's cpu_time (the job's own processes, not a fork
server's workers) and max_rss from the rules' `benchmark:` files
(results/benchmarks/RULE/...tsv; Snakemake samples a job every 0.5 s for its first 15 s,
then every 30 s, so a long job's peak can be missed), and the peak resident memory
sampled here every 0.25 s over the job's process and its workers, those its fork servers
fork included (the sum of their RSS; exact with --cores 1, the default: one job at a time);
bytes on disk per rule, from the files `snakemake --detailed-summary` names as the rule's
outputs. Writes OUT/scale.csv (one row per point and rule) and OUT/scale.png (rule x wall
time, CPU time, peak memory and bytes against devices x samples). --stage RULE reruns that rule
alone (with --forcerun, on the records already there) for each point and appends its
rows. Times on a shared machine are noisy; memory and bytes are not.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
BACKEND_ORDER = ("tensorflow", "onnxruntime", "torch", "openvino", "jax", "litert")
COLUMNS = ["devices", "samples", "kernels", "image_size", "rule", "jobs", "wall_s",
           "wall_s_max_job", "peak_rss_mb", "snakemake_max_rss_mb", "bytes", "files",
           "device_names", "cpu_s"]


def default_devices() -> list[str]:
    """The default config's devices (matrix expanded), taken in turn from each runtime."""
    sys.path.insert(0, str(REPO / "src"))
    from bitdrift.config import load_config

    devices = load_config(REPO / "config.yaml")["devices"]
    by_backend = defaultdict(list)
    for name, spec in devices.items():
        by_backend[spec["backend"]].append(name)
    order = [b for b in BACKEND_ORDER if b in by_backend] + \
        [b for b in by_backend if b not in BACKEND_ORDER]
    queues = [list(by_backend[b]) for b in order]
    chosen = []
    while any(queues):
        for queue in queues:
            if queue:
                chosen.append(queue.pop(0))
    return chosen


def point_config(devices: list[str], samples: int, kernels: bool, image_size: int,
                 workdir: Path) -> dict:
    default = yaml.safe_load((REPO / "config.yaml").read_text())
    # the default's device entries, the `cast` matrix written out one device at a time
    sys.path.insert(0, str(REPO / "src"))
    from bitdrift.config import load_config

    expanded = load_config(REPO / "config.yaml")["devices"]
    entries = {name: default["devices"].get(name) or _unexpanded(expanded[name])
               for name in devices}
    # each device fills its last batch from the test set (bitdrift.run.selection.batch_indices)
    limit_test = max(16, *(-(-samples // expanded[name]["batch_size"])
                           * expanded[name]["batch_size"] for name in devices))
    return {
        "workdir": str(workdir),
        "samples": list(range(samples)),
        "datasets": {"digits": {"source": "digits", "image_size": image_size,
                                "limit_train": 16, "limit_test": limit_test}},
        "models": {"resnet50": {"architecture": "resnet50", "dataset": "digits",
                                "train": {"epochs": 0, "seeds": [1]}}},
        "devices": entries,
        "analysis": {"precision": "float32", "kernels": kernels},
    }


def _unexpanded(spec: dict) -> dict:
    """A matrix-expanded device's entry as a config would write it (defaults left out)."""
    keep = ("accelerator", "backend", "threads", "precision", "env", "batch_size",
            "xla_flags", "graph_optimization_level", "execution_mode",
            "inference_precision_hint", "op_resolver")
    return {key: spec[key] for key in keep if key in spec and spec[key] not in ({}, None)}


def rule_scripts() -> dict[str, str]:
    """script file stem -> rule, from rules/*.smk; a script several rules run (the plots'
    plot_with_cli) names itself, as its jobs cannot be told apart here."""
    rules = defaultdict(set)
    for smk in sorted((REPO / "rules").glob("*.smk")):
        for rule, body in re.findall(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", smk.read_text(),
                                     re.MULTILINE):
            found = re.search(r"scripts/(\w+)\.py", body)
            if found:
                rules[found.group(1)].add(rule)
    return {script: next(iter(names)) if len(names) == 1 else f"{script} (several rules)"
            for script, names in rules.items()}


class MemorySampler(threading.Thread):
    """Peak RSS per Snakemake job: every process below ``root`` is assigned to the nearest
    ancestor running a job's script (.snakemake/scripts/tmpXXXX.SCRIPT.py), their RSS
    summed at each sample; the peak per job and the job's script are kept. A job's repeats
    and training runs are forked by bitdrift's fork servers, which leave the job's process
    tree (they outlive it to serve the next job): the workers of this run's servers (their
    socket under ``servers``) count towards every job running at that moment (exact with
    --cores 1, one job at a time; the idle server itself is not counted), once: a server
    the job started is in its tree while the job runs, its workers counted there."""

    SCRIPT = re.compile(r"\.snakemake/scripts/tmp[^/]*?\.(\w+)\.py")

    def __init__(self, root: int, servers: str, interval: float = 0.25):
        super().__init__(daemon=True)
        self.root, self.servers, self.interval = root, servers, interval
        self._server_pids: set[int] = set()
        self._last_scan = 0.0
        self.peaks: dict[int, float] = {}
        self.script_of: dict[int, str] = {}
        self._cmdlines: dict[int, str] = {}
        self._done = threading.Event()

    def _script(self, proc: psutil.Process) -> str | None:
        # only a match is kept: a job's process is Snakemake's until it execs the script
        if proc.pid not in self._cmdlines:
            try:
                found = self.SCRIPT.search(" ".join(proc.cmdline()))
            except psutil.Error:
                return None
            if not found:
                return None
            self._cmdlines[proc.pid] = found.group(1)
        return self._cmdlines[proc.pid]

    def run(self) -> None:
        try:
            root = psutil.Process(self.root)
        except psutil.Error:
            return
        while not self._done.is_set():
            try:
                procs = root.children(recursive=True)
            except psutil.Error:
                break
            parent_of = {}
            for proc in procs:
                try:
                    parent_of[proc.pid] = proc.ppid()
                except psutil.Error:
                    pass
            totals = defaultdict(float)
            for proc in procs:
                pid, job = proc.pid, None
                while pid in parent_of:  # nearest ancestor (or itself) running a script
                    try:
                        if self._script(psutil.Process(pid)):
                            job = pid
                            break
                    except psutil.Error:
                        break
                    pid = parent_of[pid]
                if job is None:
                    continue
                try:
                    totals[job] += proc.memory_info().rss / 2**20
                except psutil.Error:
                    pass
            # a server the job started is in its tree: its workers are counted there
            workers = self._workers_rss(exclude={proc.pid for proc in procs})
            for job, rss in totals.items():
                self.peaks[job] = max(self.peaks.get(job, 0.0), rss + workers)
                self.script_of[job] = self._cmdlines[job]
            self._done.wait(self.interval)

    def _workers_rss(self, exclude: set[int]) -> float:
        """RSS (MB) of the workers this run's fork servers have forked, now, but those in
        ``exclude`` (counted in a job's tree already)."""
        if time.monotonic() - self._last_scan > 2:  # servers are long-lived: scan seldom
            self._last_scan = time.monotonic()
            for proc in psutil.process_iter(["cmdline"]):
                line = " ".join(proc.info["cmdline"] or ())
                if "bitdrift.run.fork_server" in line and self.servers in line:
                    self._server_pids.add(proc.pid)
        total = 0.0
        for pid in list(self._server_pids):
            try:
                for worker in psutil.Process(pid).children(recursive=True):
                    if worker.pid not in exclude:
                        total += worker.memory_info().rss / 2**20
            except psutil.Error:
                self._server_pids.discard(pid)
        return total

    def stop(self) -> None:
        self._done.set()
        self.join()

    def peak_by_script(self) -> dict[str, float]:
        peaks = defaultdict(float)
        for job, rss in self.peaks.items():
            peaks[self.script_of[job]] = max(peaks[self.script_of[job]], rss)
        return peaks


def snakemake(args: list[str], log: Path, cores: int) -> tuple[int, dict[str, float]]:
    command = [sys.executable, "-m", "snakemake", *args, "--profile", "profiles/local",
               "--cores", str(cores)]
    # this run's fork servers put their sockets under a folder of its own (short: a socket
    # path has at most 107 bytes), which tells them from other runs' on the machine
    servers = tempfile.mkdtemp(prefix="bdscale")
    env = {key: value for key, value in os.environ.items() if key != "XDG_RUNTIME_DIR"}
    env.update(TMPDIR=servers, PYTHONPATH=f"{REPO / 'src'}" + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    with open(log, "a") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                   env=env)
        sampler = MemorySampler(process.pid, servers)
        sampler.start()
        status = process.wait()
        sampler.stop()
    shutil.rmtree(servers, ignore_errors=True)
    return status, sampler.peak_by_script()


def benchmark_rows(results: Path, rules: set[str] | None = None) -> dict[str, list[dict]]:
    """rule -> one dict per job: wall seconds, Snakemake's max_rss (MB) and cpu_time (s)."""
    jobs = defaultdict(list)
    root = results / "benchmarks"
    for path in sorted(root.rglob("*.tsv")):
        rule = path.relative_to(root).parts[0]
        if rules and rule not in rules:
            continue
        rows = list(csv.DictReader(path.open(), delimiter="\t"))
        if rows:
            row = rows[-1]
            rss, cpu = row.get("max_rss", "NA"), row.get("cpu_time", "NA")
            jobs[rule].append({"s": float(row["s"]),
                               "max_rss": float(rss) if rss not in ("NA", "-", "") else 0.0,
                               "cpu": float(cpu) if cpu not in ("NA", "-", "") else 0.0})
    return jobs


def bytes_by_rule(config_file: Path, workdir: Path, cores: int) -> dict[str, tuple[int, int]]:
    """rule -> (bytes, files) of the outputs Snakemake's --detailed-summary names."""
    command = [sys.executable, "-m", "snakemake", "all", "--configfile", str(config_file),
               "--detailed-summary", "--cores", str(cores)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    text = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env).stdout
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith("output_file\t")), None)
    if header is None:
        return {}
    names = lines[header].split("\t")
    totals = defaultdict(lambda: [0, 0])
    for line in lines[header + 1:]:
        fields = dict(zip(names, line.split("\t"), strict=False))
        if "rule" not in fields:
            continue
        path = workdir / fields["output_file"]
        paths = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else \
            [path] if path.is_file() else []
        for one in paths:
            totals[fields["rule"]][0] += one.stat().st_size
            totals[fields["rule"]][1] += 1
    return {rule: tuple(value) for rule, value in totals.items()}


def overlaid(config: dict, overlay: dict) -> dict:
    """config with overlay's keys written over it, mappings merged key by key."""
    merged = dict(config)
    for key, value in overlay.items():
        merged[key] = overlaid(merged[key], value) \
            if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
    return merged


def measure_point(out: Path, devices: list[str], samples: int, kernels: bool,
                  image_size: int, cores: int, stage: str | None,
                  overlay: dict | None = None) -> list[dict]:
    name = f"d{len(devices)}_s{samples}" + ("_kernels" if kernels else "")
    workdir = (out / "runs" / name).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "config.yaml"
    config = overlaid(point_config(devices, samples, kernels, image_size, workdir),
                      overlay or {})
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    log = workdir / "snakemake.log"
    args = ["all", "--configfile", str(config_file)]
    if stage:
        args += ["--forcerun", stage, "--until", stage]
    started = time.time()
    status, peaks = snakemake(args, log, cores)
    print(f"{name}: snakemake exit {status} after {time.time() - started:.0f} s "
          f"(log {log})", flush=True)
    scripts = rule_scripts()
    peaks_by_rule = {scripts.get(script, script): rss for script, rss in peaks.items()}
    jobs = benchmark_rows(workdir / "results", {stage} if stage else None)
    sizes = bytes_by_rule(config_file, workdir, cores)
    rows = []
    for rule in sorted(set(jobs) | (set() if stage else set(sizes)) | set(peaks_by_rule)):
        seconds = [job["s"] for job in jobs.get(rule, [])]
        size, files = sizes.get(rule, (0, 0))
        rows.append({
            "devices": len(devices), "samples": samples, "kernels": kernels,
            "image_size": image_size, "rule": rule, "jobs": len(seconds),
            "wall_s": round(sum(seconds), 1),
            "wall_s_max_job": round(max(seconds), 1) if seconds else "",
            "peak_rss_mb": round(peaks_by_rule.get(rule, 0.0)),
            "snakemake_max_rss_mb": round(max((j["max_rss"] for j in jobs.get(rule, [])),
                                              default=0.0)),
            "bytes": size, "files": files, "device_names": " ".join(devices),
            # the jobs' own processes: a fork server's workers (the repeats) not counted
            "cpu_s": round(sum(job["cpu"] for job in jobs.get(rule, [])), 1),
        })
    if status:
        print(f"{name}: the run failed; rows written for the jobs that finished",
              file=sys.stderr)
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """Four panels (wall time, CPU time, peak memory, bytes), a line per rule across the points in
    order of devices x samples; kernels-on points are drawn apart (hollow, not joined to
    the kernels-off ones), and one legend serves the panels. Times and bytes also get
    the whole run (every rule summed, dashed); memory is drawn on a linear axis from 0 with
    issue 52's 4 GB bound, so a flat line reads as flat."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    points = sorted({(r["devices"], r["samples"], r["kernels"]) for r in rows},
                    key=lambda p: (p[2], p[0] * p[1], p[0]))
    labels = [f"{d}x{s}\n({d * s})" + ("\nkernels on" if k else "") for d, s, k in points]
    rules = sorted({r["rule"] for r in rows})
    figure, axes = plt.subplots(1, 4, figsize=(20, 6.5))
    # (column, title, unit, the least worth a line: 5 s, 0.3 GiB, 1 MB, log scale)
    measures = (("wall_s", "wall time, all jobs of the rule (s)", 1, 5, True),
                ("cpu_s", "CPU time of the jobs' processes (s)", 1, 5, True),
                ("peak_rss_mb", "peak memory of one job (GiB)", 1024, 0.3, False),
                ("bytes", "bytes on disk (GB)", 1e9, 1e-3, True))
    colours = plt.get_cmap("tab20")
    legend = {}
    for axis, (column, title, scale, least, log) in zip(axes, measures, strict=True):
        for rule in rules:
            values = []
            for point in points:
                found = [r for r in rows if (r["devices"], r["samples"], r["kernels"]) == point
                         and r["rule"] == rule]
                # rows of an older scale.py have no cpu_s
                value = max((float(r.get(column) or 0) for r in found), default=0.0)
                if column == "peak_rss_mb":
                    value = max(value, max((float(r["snakemake_max_rss_mb"] or 0)
                                            for r in found), default=0.0))
                values.append(value / scale if value else float("nan"))
            if max((v for v in values if v == v), default=0) < least:
                continue
            index = list(legend).index(rule) if rule in legend else len(legend)
            for kernels in (False, True):
                where = [i for i, point in enumerate(points) if point[2] == kernels]
                if where:
                    (line,) = axis.plot(where, [values[i] for i in where],
                                        "os^vD<>p"[index % 8] + "-", color=colours(index % 20),
                                        markerfacecolor="none" if kernels else None)
                    legend.setdefault(rule, line)
        if column != "peak_rss_mb":  # the whole run: every rule's seconds, every byte
            totals = [sum(float(r.get(column) or 0) for r in rows
                          if (r["devices"], r["samples"], r["kernels"]) == point) / scale
                      for point in points]
            for kernels in (False, True):
                where = [i for i, point in enumerate(points) if point[2] == kernels]
                if where:
                    shown = [i for i in where if totals[i]]
                    (line,) = axis.plot(shown, [totals[i] for i in shown], "k*--",
                                        markerfacecolor="none" if kernels else None)
                    legend.setdefault("all rules (sum)", line)
        if log:
            axis.set_yscale("log")
            # plain numbers (50, 200, 1000), not powers of ten, on a log axis
            axis.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        else:  # memory on a linear axis, from 0: flat reads as flat
            axis.set_ylim(bottom=0)
            axis.axhline(4e9 / 2**30, color="grey", linestyle="--", linewidth=1)
            axis.annotate("4 GB (issue 52's bound)", (0, 4e9 / 2**30), xytext=(2, 3),
                          textcoords="offset points", fontsize=8, color="grey")
        axis.set_title(title)
        axis.set_xticks(range(len(points)), labels)
        axis.set_xlabel("devices x samples")
        axis.grid(alpha=0.3)
    figure.legend(list(legend.values()), list(legend), loc="lower center", ncol=5,
                  fontsize=8, frameon=False)
    figure.suptitle("bitdrift spine, ResNet-50 at "
                    f"{rows[0]['image_size']}x{rows[0]['image_size']}, per rule")
    figure.tight_layout(rect=(0, 0.13, 1, 1))
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder of the runs, CSV, PNG")
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8, 30],
                        help="device counts (the first N of the default config's)")
    parser.add_argument("--samples", type=int, nargs="+", default=[3, 10, 100],
                        help="sample counts (test images 0..N-1)")
    parser.add_argument("--kernels", choices=("on", "off"), nargs="+", default=["off"],
                        help="analysis.kernels: the traced repeat, orders and replay")
    parser.add_argument("--device", action="append", dest="device_names",
                        help="name the devices instead (repeatable); --devices then cuts it")
    parser.add_argument("--image-size", type=int, default=224,
                        help="side of the digits resized (the datasets key image_size)")
    parser.add_argument("--cores", type=int, default=1,
                        help="Snakemake's --cores (1: one job at a time, so every fork-server "
                             "worker is the running job's; a device keeps its own threads)")
    parser.add_argument("--overlay", type=Path, metavar="YAML",
                        help="config keys written over each point's (e.g. analysis settings "
                             "a newer bitdrift offers), mappings merged key by key")
    parser.add_argument("--stage", metavar="RULE",
                        help="rerun this rule alone at each point (its records already there)")
    parser.add_argument("--plot-only", action="store_true",
                        help="run nothing: draw OUT/scale.png from OUT/scale.csv (e.g. the "
                             "rows of several --out folders put together)")
    args = parser.parse_args()
    available = args.device_names or default_devices()
    overlay = yaml.safe_load(args.overlay.read_text()) if args.overlay else {}
    args.out.mkdir(parents=True, exist_ok=True)
    table = args.out / "scale.csv"
    rows = list(csv.DictReader(table.open())) if table.exists() else []
    if args.plot_only and not rows:
        raise SystemExit(f"--plot-only: no rows in {table}")
    for kernels in [] if args.plot_only else args.kernels:
        for count in args.devices:
            if count > len(available):
                raise SystemExit(f"--devices {count}: only {len(available)} devices")
            for samples in args.samples:
                new = measure_point(args.out, available[:count], samples, kernels == "on",
                                    args.image_size, args.cores, args.stage, overlay)
                key = (str(count), str(samples), str(kernels == "on"))
                stage_rules = {r["rule"] for r in new}
                # a point measured again replaces its rows (a --stage run: that rule's)
                rows = [r for r in rows if (str(r["devices"]), str(r["samples"]),
                                            str(r["kernels"])) != key
                        or (args.stage and r["rule"] not in stage_rules)] + new
                with open(table, "w", newline="") as handle:
                    writer = csv.DictWriter(handle, COLUMNS)
                    writer.writeheader()
                    writer.writerows(rows)
    for row in rows:
        row["kernels"] = str(row["kernels"]) == "True"
        row["devices"], row["samples"] = int(row["devices"]), int(row["samples"])
    plot(rows, args.out / "scale.png")
    print(f"wrote {table} and {args.out / 'scale.png'}")


if __name__ == "__main__":
    main()
