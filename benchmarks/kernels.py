"""Benchmark: what a traced repeat (kernel provenance) costs against a measured repeat.

    python benchmarks/kernels.py --runs 3

Per runtime (TensorFlow, torch), one inference repeat of the real worker
(`python -m bitdrift.run.repeat JOB`: a fresh process, three samples, every layer) is timed
as the workflow runs it, once measured and once traced (the libraries' verbose logs on,
markers around every layer, stdout captured to a file), each `--runs` times; the median
wall times, the traced repeat's extra seconds and the log's size are printed as a Markdown
table. Model: Cifar10-small, initial weights; data: the embedded digits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bitdrift import backends
from bitdrift.inputs.datasets import prepare_dataset
from bitdrift.run.devices import device_environment

BUILD = ("import keras, sys; from bitdrift.inputs.models import build_model; "
         "keras.utils.set_random_seed(0); "
         "build_model(keras, {'architecture': 'cifar10_small'}, (32, 32, 3), 10).save(sys.argv[1])")


def repeat(job: dict, device: dict, trace: bool, folder: Path) -> tuple[float, int]:
    """Wall seconds of one worker process, and the bytes it logged to stdout."""
    job = {**job, "trace": trace, "out": str(folder / f"{trace}.npz")}
    if trace:
        device = {**device, "env": {**device["env"],
                                    **backends.get(device["backend"]).trace_environment(device)}}
    log = folder / "stdout.txt"
    with open(log, "w") as stdout:
        begun = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bitdrift.run.repeat", json.dumps(job)],
                       env=device_environment(device), stdout=stdout,
                       stderr=subprocess.DEVNULL, check=True)
        return time.perf_counter() - begun, log.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        dataset, model = folder / "digits.h5", folder / "model.keras"
        prepare_dataset("digits", {"source": "digits", "limit_test": 16}, dataset)
        subprocess.run([sys.executable, "-c", BUILD, str(model)], check=True,
                       env={**os.environ, "KERAS_BACKEND": "tensorflow"},
                       stderr=subprocess.DEVNULL)
        print("| runtime | measured repeat (s) | traced repeat (s) | extra (s) | log (KB) |")
        print("|---|---|---|---|---|")
        for backend in ("tensorflow", "torch"):
            device = {"accelerator": "cpu", "backend": backend, "threads": 2, "batch_size": 1,
                      "precision": "float32", "env": {}, "repeats": 1, "external": False}
            job = {"device": device, "device_name": backend, "model_path": str(model),
                   "dataset_path": str(dataset), "samples": [0, 1, 6], "layers": True,
                   "fingerprint": False}
            times = {False: [], True: []}
            size = 0
            for _ in range(args.runs):
                for trace in (False, True):
                    seconds, logged = repeat(job, device, trace, folder)
                    times[trace].append(seconds)
                    size = logged if trace else size
            measured, traced = (statistics.median(times[key]) for key in (False, True))
            print(f"| {backend} | {measured:.2f} | {traced:.2f} | {traced - measured:+.2f} | "
                  f"{size / 1024:.1f} |")


if __name__ == "__main__":
    main()
