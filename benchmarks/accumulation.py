"""Benchmark: what revealing a Dense layer's summation order costs (run on demand).

    python benchmarks/accumulation.py

For numpy, each Keras runtime (TensorFlow, torch, JAX) and each exported runtime (ONNX
Runtime, OpenVINO, LiteRT with XNNPACK), in a fresh process: the seconds
bitdrift.analysis.accumulation.reveal takes for the default model's three Dense shapes (320 -> 128,
128 -> 128, 128 -> 10, bias included, batch 1, one thread), and the number of Dense calls
it made. Printed as a Markdown table with the host's CPU named; docs/benchmarks.md quotes
it. The first call of a runtime (its own warm-up; for LiteRT the converter process that
makes the one-layer templates, timed apart) is outside the timing; an exported runtime
compiles a one-layer model per call, inside it.
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
EXPORTED = ("onnxruntime", "openvino", "litert")
if backend in EXPORTED:
    from bitdrift import backends
    from bitdrift.backends.exported import common as exported
    runtime = backends.get(backend)
    device = {"accelerator": "cpu", "threads": 1, "batch_size": 1, "precision": "float32",
              "op_resolver": "xnnpack", "graph_optimization_level": "all"}
    accelerator = runtime.check_accelerator("benchmark", device)
    from bitdrift.analysis.accumulation.probes import probe_spec
    layers = {f"dense_{index}": probe_spec("Dense", {"use_bias": True}, (terms,),
                                           (terms, units))
              for index, (terms, units) in enumerate(shapes)}
    probe = (runtime.order_probe if backend == "litert" else exported.onnx_order_probe)(
        runtime, device, accelerator, layers)
elif backend != "numpy":
    os.environ["KERAS_BACKEND"] = backend
    import keras
from bitdrift.analysis.accumulation.names import summary
from bitdrift.analysis.accumulation.reveal import reveal
from bitdrift.analysis.accumulation.trees import OrderError
rows = []
setup = 0.0
for terms, units in shapes:
    calls = [0]
    ones = np.ones((1, terms), np.float32)
    if backend == "numpy":
        def dense(w, b):
            calls[0] += 1
            return ones @ w + b
    elif backend in EXPORTED:
        call = probe(next(spec for spec in layers.values()
                          if (spec["terms"], spec["units"]) == (terms, units)), 1)
        def dense(w, b):
            calls[0] += 1
            return call(w, b)
    else:
        layer = keras.layers.Dense(units)
        layer.build((None, terms))
        def dense(w, b):
            calls[0] += 1
            layer.set_weights([w, b])
            return keras.ops.convert_to_numpy(layer(ones))
    started = time.perf_counter()
    dense(np.ones((terms, units), np.float32), np.ones(units, np.float32))  # warm-up
    setup += time.perf_counter() - started
    calls[0] = 0
    start = time.perf_counter()
    try:
        order = summary(reveal(dense, terms, units))
    except OrderError as error:  # a kernel whose sums are not a tree: said, not hidden
        order = f"not revealed: {error}"
    rows.append({"shape": f"{terms} -> {units}", "seconds": time.perf_counter() - start,
                 "calls": calls[0], "order": order, "setup": setup})
print(json.dumps(rows))
"""


def main() -> None:
    import cpuinfo

    cpu = cpuinfo.get_cpu_info()
    print(f"CPU: {cpu.get('brand_raw')} ({cpu.get('count')} CPUs)\n")
    print("| runtime | Dense shape | seconds | Dense calls | order |")
    print("|---|---|---|---|---|")
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    setups = {}
    for backend in ("numpy", "tensorflow", "torch", "jax", "onnxruntime", "openvino",
                    "litert"):
        done = subprocess.run([sys.executable, "-c", CODE, backend, json.dumps(SHAPES)],
                              capture_output=True, text=True, env=environment, check=True)
        rows = json.loads(done.stdout.strip().splitlines()[-1])
        for row in rows:
            print(f"| {backend} | {row['shape']} | {row['seconds']:.2f} | {row['calls']} | "
                  f"{row['order']} |")
        setups[backend] = rows[-1]["setup"]
    print("\nWarm-up calls (outside the timings; LiteRT's includes its converter process): " +
          ", ".join(f"{name} {seconds:.1f} s" for name, seconds in setups.items()))


if __name__ == "__main__":
    main()
