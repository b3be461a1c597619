"""Benchmark: EQC + remaining precision over synthetic records (run on demand).

    python benchmarks/analysis.py --devices 100 --layers 50 --elements 100000

Writes one record per device (float32, 1 sample, 1 repeat, every layer perturbed in its
low bits for some devices), then times `eqc_tables` + `precision_table`, measures peak
Python-heap memory (tracemalloc sees NumPy buffers) for L and L/2 layers (streaming: the
peak must not grow with the number of layers), and compares with a naive
pairwise-and-shift implementation on the first layers of the same data.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from bitdrift.eqc import eqc_tables, precision_table
from bitdrift.record import open_records, write_record


def make_records(folder: Path, devices: int, layers: int, elements: int) -> list[Path]:
    rng = np.random.default_rng(0)
    base = [rng.normal(size=(1, elements)).astype(np.float32) for _ in range(layers)]
    paths = []
    for d in range(devices):
        noisy = []
        for values in base:
            bits = values.view(np.uint32).copy()
            if d % 3:  # two thirds of the devices deviate in up to d % 12 low bits
                bits ^= rng.integers(0, 2 ** (d % 12 + 1), size=bits.shape, dtype=np.uint32)
            noisy.append(bits.view(np.float32))
        path = folder / f"dev{d:03d}.h5"
        write_record(path, {"model": "bench", "device": f"dev{d:03d}", "backend": "synthetic",
                            "precision": "float32", "fingerprint": {},
                            "model_sha256": "0" * 64, "input_sha256": "0" * 64},
                     {0: {"output": noisy[-1],
                          "layers": [(f"layer{i:02d}", v) for i, v in enumerate(noisy[:-1])]}})
        paths.append(path)
    return paths


def naive_layer(arrays: list[np.ndarray]) -> tuple[int, int]:
    """Pairs and shifts: for every pair, drop bits until equal; classes by pairwise compare."""
    ints = [a.view(np.uint32).ravel() for a in arrays]
    worst = 0
    for a in range(len(ints)):
        for b in range(a + 1, len(ints)):
            dropped = 0
            while not np.array_equal(ints[a] >> np.uint32(dropped), ints[b] >> np.uint32(dropped)):
                dropped += 1
            worst = max(worst, dropped)
    classes: list[np.ndarray] = []
    for values in ints:
        if not any(np.array_equal(values, c) for c in classes):
            classes.append(values)
    return 23 - worst, len(classes)


def timed_analysis(paths):
    tracemalloc.start()
    start = time.perf_counter()
    records = open_records(paths)
    eqc_tables(records)
    precision_table(records)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    for record in records:
        record.close()
    return seconds, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--layers", type=int, default=50)
    parser.add_argument("--elements", type=int, default=100_000)
    parser.add_argument("--naive-layers", type=int, default=2,
                        help="layers timed with the naive implementation")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        half = Path(tmp) / "half"
        full = Path(tmp) / "full"
        half.mkdir()
        full.mkdir()
        paths = make_records(full, args.devices, args.layers, args.elements)
        half_paths = make_records(half, args.devices, max(args.layers // 2, 2), args.elements)
        seconds, peak = timed_analysis(paths)
        _, half_peak = timed_analysis(half_paths)
        records = open_records(paths)
        naive_seconds = 0.0
        for layer in range(args.naive_layers):
            arrays = [r.tensor(0, f"layer{layer:02d}").values[0] for r in records]
            start = time.perf_counter()
            naive_layer(arrays)
            naive_seconds += time.perf_counter() - start
        naive_per_layer = naive_seconds / args.naive_layers
        ours_per_layer = seconds / args.layers
    size_mb = args.devices * args.elements * 4 / 1e6
    print(f"records: {args.devices} devices x {args.layers} layers x {args.elements} elements "
          f"(float32, {size_mb:.0f} MB per layer over all devices)")
    print(f"bitdrift eqc+precision: {seconds:.2f} s total, {ours_per_layer * 1e3:.1f} ms/layer")
    print(f"peak traced memory: {peak / 1e6:.1f} MB with {args.layers} layers, "
          f"{half_peak / 1e6:.1f} MB with {max(args.layers // 2, 2)} layers")
    print(f"naive pairwise-and-shift: {naive_per_layer * 1e3:.1f} ms/layer "
          f"(measured on {args.naive_layers} layers, class counting included)")
    print(f"speed-up per layer: {naive_per_layer / ours_per_layer:.1f}x")


if __name__ == "__main__":
    main()
