"""Benchmark: what a `bitdrift infer` job costs beyond Keras itself (run on demand).

    python benchmarks/inference_overhead.py --repeats 3 --backend tensorflow

Times `bitdrift infer` (every repeat a fresh process, every layer recorded, the record
written) against the same number of fresh processes that only load the model with Keras
and predict the same samples, and breaks one bare process into start-up, load and predict.
The model is Cifar10-small with initial weights; the data are the embedded digits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BARE = r"""
import json, sys, time
start = time.perf_counter()
import keras, h5py, numpy as np
imported = time.perf_counter()
model = keras.saving.load_model(sys.argv[1], compile=False)
loaded = time.perf_counter()
with h5py.File(sys.argv[2]) as handle:
    x = handle["x_test"][:3]
model.predict(x, batch_size=1, verbose=0)
predicted = time.perf_counter()
print(json.dumps({"import": imported - start, "load": loaded - imported,
                  "predict": predicted - loaded}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="tensorflow", choices=["tensorflow", "torch"])
    args = parser.parse_args()
    env = {**os.environ, "KERAS_BACKEND": args.backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        config = {"samples": [0, 1, 6], "datasets": {"digits": {"source": "digits"}},
                  "models": {"m": {"architecture": "cifar10_small", "dataset": "digits"}},
                  "devices": {"d": {"accelerator": "cpu", "backend": args.backend,
                                    "threads": 2, "repeats": args.repeats}}}
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
        dataset, model = folder / "digits.h5", folder / "model.keras"
        subprocess.run([sys.executable, "-m", "bitdrift.cli", "prepare-dataset", "--config",
                        str(folder / "config.yaml"), "--dataset", "digits", "--out",
                        str(dataset)], check=True, env=env)
        subprocess.run([sys.executable, "-c",
                        "import sys, keras; from bitdrift.inputs.models import build_model; "
                        "build_model(keras, {'architecture': 'cifar10_small'}, (32, 32, 3), 10)"
                        f".save({str(model)!r})"], check=True, env=env)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "bitdrift.cli", "infer", "--config",
                        str(folder / "config.yaml"), "--model", "m", "--device", "d",
                        "--model-file", str(model), "--dataset-file", str(dataset),
                        "--out", str(folder / "record.h5")], check=True, env=env,
                       stderr=subprocess.DEVNULL)
        job = time.perf_counter() - start
        parts = []
        start = time.perf_counter()
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, "-c", BARE, str(model), str(dataset)],
                                 check=True, env=env, capture_output=True, text=True)
            parts.append(json.loads(out.stdout.strip().splitlines()[-1]))
        bare = time.perf_counter() - start
    mean = {key: sum(p[key] for p in parts) / len(parts) for key in parts[0]}
    print(f"bitdrift infer ({args.repeats} repeats, {args.backend}, every layer, record "
          f"written): {job:.1f} s; bare Keras load + predict in {args.repeats} fresh "
          f"processes: {bare:.1f} s; ratio {job / bare:.2f}x (target <= 1.3)")
    print("one bare process: " + ", ".join(f"{k} {v:.2f} s" for k, v in mean.items()))


if __name__ == "__main__":
    main()
