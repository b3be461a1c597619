"""Check on demand: the share of a run's class pairs whose `bitdrift repro` scripts
reproduce both records (each script prints its record's digest of the first divergent
layer), per pair of runtimes, with the seconds the scripts took.

    python benchmarks/repro_share.py [--config config.yaml]

Reads results/tables/divergence.csv of a finished run (one row per pair of classes and
precision, plus each device against its precision's first); the pairs of classes only.
A device's script runs once per layer and input (most pairs of a device share them).
Printed as a Markdown table with the host's CPU named; the closing notes quote it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pandas as pd

from bitdrift import paths
from bitdrift.commands.common import read_config
from bitdrift.run.devices import cpu_info
from bitdrift.run.repro import EXPECTED, NotReproducible, write_repro


def run_once(folder: Path, name: str, entry: dict, printed: dict, seconds, key) -> bool:
    """Whether the device's script prints its record's digest; a script is run once per
    device, layer and input (the pairs of one device share most of them)."""
    if "script" not in entry:
        return False
    digest = hashlib.sha256((folder / "input.npy").read_bytes()).hexdigest()
    cache = (name, json.loads((folder / EXPECTED).read_text())["layer"], digest)
    if cache not in printed:
        started = time.perf_counter()
        done = subprocess.run([sys.executable if part == "python" else part
                               for part in entry["command"]], cwd=folder,
                              capture_output=True, text=True)
        seconds[key] += time.perf_counter() - started
        printed[cache] = (done.stdout.strip().splitlines() or [""])[-1]
    return printed[cache] == entry["expected"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="config.yaml")
    args = parser.parse_args()
    config = read_config(args.config)
    table = pd.read_csv(paths.table_file("divergence"), keep_default_na=False)
    pairs = table[(table["class_a"] != table["class_b"]) & (table["first_layer"] != "")]
    pairs = pairs.drop_duplicates(["model", "device_a", "device_b"])
    tally, seconds, refused, printed = Counter(), Counter(), Counter(), {}
    for row in pairs.itertuples():
        spec = config["models"][row.model]
        backends = [config["devices"][d]["backend"] for d in (row.device_a, row.device_b)]
        key = " vs ".join(sorted(backends))
        with tempfile.TemporaryDirectory() as folder:
            try:
                write_repro(paths.record_file(row.model, row.device_a),
                            paths.record_file(row.model, row.device_b),
                            paths.model_file(config, row.model), Path(folder) / "repro",
                            dataset_path=paths.dataset_file(spec["dataset"]))
            except NotReproducible as error:
                refused[key] += 1
                print(f"{row.device_a} vs {row.device_b}: {error}")
                continue
            results = {}
            for name, entry in json.loads((Path(folder) / "repro" / EXPECTED).read_text())[
                    "devices"].items():
                results[name] = run_once(Path(folder) / "repro", name, entry, printed,
                                         seconds, key)
        done = all(results.values())
        tally[(key, done)] += 1
        if not done:
            print(f"{row.device_a} vs {row.device_b} at {row.first_layer}: not reproduced by "
                  f"{', '.join(name for name, ok in results.items() if not ok)}")
    cpu = cpu_info()
    print(f"\nCPU: {cpu.get('brand_raw')} ({len(pairs)} class pairs)\n")
    # a script runs once per device, layer and input: its seconds count where it first ran
    print("| runtimes | pairs | both reproduced | refused | seconds of scripts first run here |")
    print("|---|---|---|---|---|")
    for key in sorted({key for key, _ in tally} | set(refused)):
        both, total = tally[(key, True)], tally[(key, True)] + tally[(key, False)]
        print(f"| {key} | {total + refused[key]} | {both} | {refused[key]} | "
              f"{seconds[key]:.0f} |")
    reproduced = sum(count for (_, done), count in tally.items() if done)
    print(f"\nreproduced: {reproduced} of {len(pairs)} class pairs; {len(printed)} scripts "
          f"run, {sum(seconds.values()):.0f} s")


if __name__ == "__main__":
    main()
