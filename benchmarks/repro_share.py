"""Check on demand: the share of a run's class pairs whose `bitdrift repro` scripts
reproduce both records (each script prints its record's digest of the first divergent
layer), per pair of runtimes, with the seconds the scripts took.

    python benchmarks/repro_share.py [--config config.yaml]

Reads results/tables/divergence.csv of a finished run (one row per pair of classes and
precision, plus each device against its precision's first); the pairs of classes only.
Printed as a Markdown table with the host's CPU named; the closing notes quote it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import pandas as pd

from bitdrift import paths
from bitdrift.commands.common import read_config
from bitdrift.devices import cpu_info
from bitdrift.repro import NotReproducible, check_repro, write_repro


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="config.yaml")
    args = parser.parse_args()
    config = read_config(args.config)
    table = pd.read_csv(paths.table_file("divergence"), keep_default_na=False)
    pairs = table[(table["class_a"] != table["class_b"]) & (table["first_layer"] != "")]
    pairs = pairs.drop_duplicates(["model", "device_a", "device_b"])
    tally, seconds, refused = Counter(), Counter(), Counter()
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
            started = time.perf_counter()
            results = check_repro(Path(folder) / "repro")
            seconds[key] += time.perf_counter() - started
        done = all(result["reproduced"] for result in results.values())
        tally[(key, done)] += 1
        if not done:
            print(f"{row.device_a} vs {row.device_b} at {row.first_layer}: " + json.dumps(
                {name: result["why"] or "other digest" for name, result in results.items()
                 if not result["reproduced"]}))
    cpu = cpu_info()
    print(f"\nCPU: {cpu.get('brand_raw')} ({len(pairs)} class pairs)\n")
    print("| runtimes | pairs | both reproduced | refused | scripts' seconds |")
    print("|---|---|---|---|---|")
    for key in sorted({key for key, _ in tally} | set(refused)):
        both, total = tally[(key, True)], tally[(key, True)] + tally[(key, False)]
        print(f"| {key} | {total + refused[key]} | {both} | {refused[key]} | "
              f"{seconds[key]:.0f} |")
    reproduced = sum(count for (_, done), count in tally.items() if done)
    print(f"\nreproduced: {reproduced} of {len(pairs)} class pairs")


if __name__ == "__main__":
    main()
