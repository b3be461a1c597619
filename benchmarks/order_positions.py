"""Benchmark: the order search of a Conv2D at every output position and at the replay's
sample (config analysis.replay_positions), run on demand.

    python benchmarks/order_positions.py [--batch 1] [--positions 1024]

Two of ResNet-50's convolutions at 224x224 (conv2's 3x3, 64 -> 64 channels, 'same', 56x56
output; conv1's 7x7, 3 -> 64, stride 2, 112x112 output), each probed as
bitdrift's Keras runtimes probe it (bitdrift.backends.keras.common: the layer alone on an
input of ones, Keras on torch, one thread), revealed by
bitdrift.analysis.accumulation.reveal.reveal_places
at every pixel and at the sample: seconds, probe calls, the peak of what Python allocated
during the search (tracemalloc: the answers kept and compared; the runtime's own buffers
are outside it), and the order's name. Printed as a Markdown table with the host's CPU;
docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import os
import time
import tracemalloc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--positions", type=int, default=1024)
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "torch")
    os.environ["OMP_NUM_THREADS"] = "1"
    import cpuinfo
    import keras
    import numpy as np
    import torch

    from bitdrift.analysis.accumulation.names import order_name
    from bitdrift.analysis.accumulation.probes import conv_grid, probe_output, probe_spec
    from bitdrift.analysis.accumulation.replay import conv_border
    from bitdrift.analysis.accumulation.reveal import reveal_places
    from bitdrift.analysis.accumulation.trees import from_flat

    torch.set_num_threads(1)
    cpu = cpuinfo.get_cpu_info()
    print(f"CPU: {cpu.get('brand_raw')} ({cpu.get('count')} CPUs), torch {torch.__version__}"
          f", Keras {keras.__version__}, one thread, batch {args.batch}\n")
    print("| layer | search | positions | seconds | probe calls | seconds per call | peak MB "
          "(Python) | order |")
    print("|---|---|---|---|---|---|---|---|")
    for label, size, kernel, channels, stride in (("3x3, 64 -> 64 at 56x56", 56, 3, 64, 1),
                                                   ("7x7, 3 -> 64, stride 2, at 224x224",
                                                    224, 7, 3, 2)):
        config = {"filters": 64, "kernel_size": [kernel, kernel], "strides": [stride, stride],
                  "padding": "same", "dilation_rate": [1, 1], "data_format": "channels_last",
                  "groups": 1, "use_bias": True}
        spec = probe_spec("Conv2D", config, (size, size, channels),
                          (kernel, kernel, channels, 64))
        layer = keras.layers.Conv2D(**spec["config"])
        layer.build((None, *spec["input_shape"]))
        ones = np.ones((args.batch, *spec["input_shape"]), dtype="float32")
        calls = [0]

        def probe(weights, bias, spec=spec, layer=layer, ones=ones, calls=calls):
            calls[0] += 1
            layer.set_weights([weights.reshape(spec["kernel_shape"]), bias])
            return probe_output(spec, keras.ops.convert_to_numpy(layer(ones, training=False)))

        grid, live = conv_grid(spec)
        border = conv_border(spec["config"], spec["kernel_shape"])
        plain = (np.ones((spec["terms"], 64), np.float32), np.ones(64, np.float32))
        probe(*plain)  # warm-up
        per_call = []
        for _ in range(3):  # the probe's own cost, apart
            start = time.perf_counter()
            probe(*plain)
            per_call.append(time.perf_counter() - start)
        for search, positions in (("every pixel", None), ("sampled", args.positions)):
            calls[0] = 0
            tracemalloc.start()
            start = time.perf_counter()
            found = reveal_places(probe, spec["terms"], spec["units"], "float32", True,
                                  args.batch, grid, live, positions=positions, border=border)
            seconds = time.perf_counter() - start
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            entry = found.entry(spec["terms"] + 1, True)
            name = order_name([from_flat(tree, entry["terms"]) for tree in entry["trees"]],
                              entry["places"], True)
            left = sum(line.count("-") for line in entry["places"]["maps"][0])
            pixels = grid[0] * grid[1]
            print(f"| {label} | {search} | {pixels - left} of {pixels} | {seconds:.1f} | "
                  f"{calls[0]} | {sorted(per_call)[1]:.3f} | {peak:.0f} | {name[:200]} |")


if __name__ == "__main__":
    main()
