"""Benchmark: how long Snakemake takes to build a large bitdrift DAG (run on demand).

    python benchmarks/dag.py --devices 200 --models 10 --samples 3

Writes a config with that many CPU devices and trained models (no studies), then times
`snakemake -n all` in an empty folder: 2,000 inference jobs for the defaults. This is
mostly Snakemake's own work (parsing, DAG, job selection); bitdrift's part is the config
check and the input functions.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def config(devices: int, models: int, samples: int) -> dict:
    return {
        "samples": list(range(samples)),
        "datasets": {"digits": {"source": "digits"}},
        "models": {f"model{m:02d}": {"architecture": "cifar10_small", "dataset": "digits",
                                     "train": {"epochs": 1, "seeds": [m + 1]}}
                   for m in range(models)},
        "devices": {f"device{d:03d}": {"accelerator": "cpu", "backend": "tensorflow",
                                       "threads": 1 + d % 4, "batch_size": 1 + d % 8}
                    for d in range(devices)},
        "analysis": {"precision": "float32"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(yaml.safe_dump(config(args.devices, args.models, args.samples)))
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                                 "-d", folder, "-n", "--cores", "2", "all", "--configfile",
                                 str(path)], capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(result.stderr[-3000:])
    jobs = {line.split()[0]: int(line.split()[1]) for line in result.stdout.splitlines()
            if len(line.split()) == 2 and line.split()[1].isdigit()}
    print(f"snakemake -n: {seconds:.1f} s for {jobs.get('run_inference', 0)} inference jobs "
          f"({jobs.get('total', 0)} in all; target < 10 s)")


if __name__ == "__main__":
    main()
