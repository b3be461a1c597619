"""Benchmark: where a fresh-process job's time goes, per job kind (run on demand).

    python benchmarks/startup.py --runs 3

Every inference repeat and training run of the protocol is a process in which nothing has
run before (fresh, or forked from a pre-imported parent: bitdrift.run.workers). Per kind this
starts one fresh process several times and splits its wall time into: the interpreter
(up to the first line of the script), the framework import (Keras on its backend, with what
bitdrift imports beside it), the model load, the work (one inference repeat of three
samples, every layer recorded, or one training epoch), and the write. Analysis commands are
timed as whole `bitdrift` commands (they load no framework). A second table times a
device's inference job (two repeats and the traced one of the real worker). ``--before``
measures as before issue 27: the whole Keras import, the teardown at exit, every repeat
fresh. The tables are printed in Markdown; README quotes them. Model: Cifar10-small,
initial weights; data: embedded digits.
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

INFERENCE = r"""
import time
begun = time.perf_counter()
import json, sys
from bitdrift.run.devices import import_keras
if sys.argv[5] == "after":
    from bitdrift import backends
    backends.get(sys.argv[3]).preimport()
keras = import_keras(sys.argv[3])
import numpy as np
from bitdrift.inputs.datasets import read_test_images
from bitdrift.inputs.models import layer_probe
imported = time.perf_counter()
model = keras.saving.load_model(sys.argv[1], compile=False)
probe, _ = layer_probe(keras, model)
loaded = time.perf_counter()
images = read_test_images(sys.argv[2], [0, 1, 6])
outputs = [probe(images[i:i + 1], training=False) for i in range(3)]
arrays = [keras.ops.convert_to_numpy(o) for out in outputs for o in out]
worked = time.perf_counter()
np.savez(sys.argv[4], *arrays)
written = time.perf_counter()
print(json.dumps({"begun": begun, "import": imported - begun, "load": loaded - imported,
                  "work": worked - loaded, "write": written - worked}))
if sys.argv[5] == "after":
    from bitdrift.run.workers import exit_now
    exit_now(0)
"""

TRAINING = r"""
import time
begun = time.perf_counter()
import json, sys
from bitdrift.run.devices import import_keras
if sys.argv[5] == "after":
    from bitdrift import backends
    backends.get(sys.argv[3]).preimport()
keras = import_keras(sys.argv[3])
from bitdrift.inputs.datasets import dataset_classes, read_dataset
from bitdrift.run.training import SOURCES, fit, run_seeds
imported = time.perf_counter()
data = read_dataset(sys.argv[2])
loaded = time.perf_counter()
spec = {"architecture": "small_cnn", "epochs": 1, "batch_size": 32}
trained = fit(keras, spec, spec, data, dataset_classes(data),
              run_seeds(dict.fromkeys(SOURCES, "fixed"), 0, 0))
worked = time.perf_counter()
trained.model.save(sys.argv[4])
written = time.perf_counter()
print(json.dumps({"begun": begun, "import": imported - begun, "load": loaded - imported,
                  "work": worked - loaded, "write": written - worked}))
if sys.argv[5] == "after":
    from bitdrift.run.workers import exit_now
    exit_now(0)
"""


def timed_child(code: str, args: list[str], env: dict) -> dict:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, env=env, check=True)
    total = time.perf_counter() - started
    phases = json.loads(done.stdout.strip().splitlines()[-1])
    # perf_counter is one clock across processes on Linux (CLOCK_MONOTONIC)
    return {"interpreter": phases.pop("begun") - started, **phases, "total": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="processes per job kind")
    parser.add_argument("--before", action="store_true",
                        help="as before issue 27: the whole Keras import, the frameworks' "
                             "teardown at exit, every repeat a fresh process")
    args = parser.parse_args()
    mode = "before" if args.before else "after"
    from bitdrift.inputs.datasets import prepare_dataset

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        dataset, model = folder / "digits.h5", folder / "model.keras"
        prepare_dataset("digits", {"source": "digits", "limit_train": 256}, dataset)
        build = ("import keras, sys; from bitdrift.inputs.models import build_model; "
                 "build_model(keras, {'architecture': 'cifar10_small'}, (32, 32, 3), 10)"
                 ".save(sys.argv[1])")
        subprocess.run([sys.executable, "-c", build, str(model)], check=True,
                       env={**os.environ, "KERAS_BACKEND": "tensorflow"})
        rows = []
        for backend in ("tensorflow", "torch", "jax"):
            env = {**os.environ, "KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": "",
                   "TF_CPP_MIN_LOG_LEVEL": "2", "JAX_PLATFORMS": "cpu"}
            for kind, code in (("inference repeat", INFERENCE), ("training run", TRAINING)):
                out = folder / ("out.npz" if code is INFERENCE else "trained.keras")
                samples = [timed_child(code, [str(model), str(dataset), backend, str(out),
                                              mode], env) for _ in range(args.runs)]
                rows.append((f"{kind}, {backend}",
                             {k: statistics.median(s[k] for s in samples) for k in samples[0]}))
        jobs = [(backend, device_job(folder, model, dataset, backend, args.before))
                for backend in ("tensorflow", "torch")]
        analysis = []
        for _ in range(args.runs):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "bitdrift", "--version"], check=True,
                           capture_output=True)
            analysis.append(time.perf_counter() - started)
    print(f"| job kind (median of {args.runs} fresh processes) | interpreter | import | load "
          "| work | write | exit | total | start-up + exit share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, t in rows:
        # exit: after the write until the process is gone (the frameworks' teardown)
        exit_seconds = t["total"] - sum(t[k] for k in ("interpreter", "import", "load",
                                                        "work", "write"))
        fixed = t["interpreter"] + t["import"] + exit_seconds
        print(f"| {name} | {t['interpreter']:.2f} s | {t['import']:.2f} s | {t['load']:.2f} s "
              f"| {t['work']:.2f} s | {t['write']:.2f} s | {exit_seconds:.2f} s | "
              f"{t['total']:.2f} s | {fixed / t['total']:.0%} |")
    print(f"| `bitdrift --version` (an analysis command's start-up) | | | | | | | "
          f"{statistics.median(analysis):.2f} s | |")
    print()
    print("| a device's inference job: 2 repeats + the traced one, real worker | processes "
          "| seconds |")
    print("|---|---|---|")
    for backend, (how, seconds) in jobs:
        print(f"| {backend} | {how} | {seconds:.2f} s |")


def device_job(folder: Path, model: Path, dataset: Path, backend: str,
               before: bool) -> tuple[str, float]:
    """Three repeats of the real inference worker (bitdrift.run.repeat.run_repeat) as
    ``infer`` runs them: fresh processes before, children of a pre-imported parent after
    (bitdrift.run.workers; the runtime's PREFORK)."""
    from contextlib import nullcontext

    from bitdrift import backends
    from bitdrift.run.workers import FreshProcesses, worker_processes

    device = {"backend": backend, "accelerator": "cpu", "precision": "float32",
              "batch_size": 1, "threads": 1, "repeats": 2}
    worker = "bitdrift.run.repeat:run_repeat"
    started = time.perf_counter()
    with open(os.devnull, "w") as log:
        context = nullcontext(FreshProcesses(worker, device, backend, log)) if before \
            else worker_processes(worker, device, backend, log)
        with context as workers:
            for repeat in range(3):
                job = {"device": device, "device_name": backend, "model_path": str(model),
                       "dataset_path": str(dataset), "samples": [0, 1, 6], "layers": True,
                       "out": str(folder / "repeat.npz"), "fingerprint": repeat == 0,
                       "reference": None, "export": None, "trace": repeat == 2}
                if workers.run(job) != 0:
                    raise RuntimeError(f"{backend}: repeat {repeat} failed")
    how = "fresh processes (with the lean import and quick exit)" if before \
        else "fresh processes" if not backends.get(backend).PREFORK \
        else "forked from one pre-imported parent"
    return how, time.perf_counter() - started


if __name__ == "__main__":
    main()
