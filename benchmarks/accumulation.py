"""Benchmark: what revealing a Dense layer's summation order costs (run on demand).

    python benchmarks/accumulation.py

For each Keras runtime (TensorFlow, torch, JAX) and numpy, in a fresh process: the seconds
bitdrift.accumulation.reveal takes for the default model's three Dense shapes (320 -> 128,
128 -> 128, 128 -> 10, bias included, batch 1, one thread), and the number of Dense calls
it made. Printed as a Markdown table with the host's CPU named; docs/benchmarks.md quotes
it. The first call of a runtime (its own warm-up) is outside the timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

SHAPES = [(320, 128), (128, 128), (128, 10)]
CODE = """
import json, os, sys, time
import numpy as np
backend = sys.argv[1]
shapes = json.loads(sys.argv[2])
if backend != "numpy":
    os.environ["KERAS_BACKEND"] = backend
    import keras
from bitdrift.accumulation import OrderError, reveal, summary
rows = []
for terms, units in shapes:
    calls = [0]
    ones = np.ones((1, terms), np.float32)
    if backend == "numpy":
        def dense(w, b):
            calls[0] += 1
            return ones @ w + b
    else:
        layer = keras.layers.Dense(units)
        layer.build((None, terms))
        def dense(w, b):
            calls[0] += 1
            layer.set_weights([w, b])
            return keras.ops.convert_to_numpy(layer(ones))
    dense(np.ones((terms, units), np.float32), np.ones(units, np.float32))  # warm-up
    calls[0] = 0
    start = time.perf_counter()
    try:
        order = summary(reveal(dense, terms, units))
    except OrderError as error:  # a kernel whose sums are not a tree: said, not hidden
        order = f"not revealed: {error}"
    rows.append({"shape": f"{terms} -> {units}", "seconds": time.perf_counter() - start,
                 "calls": calls[0], "order": order})
print(json.dumps(rows))
"""


def main() -> None:
    import cpuinfo

    cpu = cpuinfo.get_cpu_info()
    print(f"CPU: {cpu.get('brand_raw')} ({cpu.get('count')} CPUs)\n")
    print("| runtime | Dense shape | seconds | Dense calls | order |")
    print("|---|---|---|---|---|")
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    for backend in ("numpy", "tensorflow", "torch", "jax"):
        done = subprocess.run([sys.executable, "-c", CODE, backend, json.dumps(SHAPES)],
                              capture_output=True, text=True, env=environment, check=True)
        for row in json.loads(done.stdout.strip().splitlines()[-1]):
            print(f"| {backend} | {row['shape']} | {row['seconds']:.2f} | {row['calls']} | "
                  f"{row['order']} |")


if __name__ == "__main__":
    main()
