"""Benchmark: EQC + remaining precision over synthetic records (run on demand).

    python benchmarks/analysis.py --devices 100 --layers 50 --elements 100000
    python benchmarks/analysis.py --ratios --devices 64 --layers 16 --elements 65536

Writes one record per device (float32, 1 sample, 1 repeat, every layer perturbed in its
low bits for some devices), then times `eqc_tables` + `precision_table`, measures peak
Python-heap memory (tracemalloc sees NumPy buffers) for L and L/2 layers (streaming: the
peak must not grow with the number of layers), and compares with a naive
pairwise-and-shift implementation on the first layers of the same data.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import h5py
import numpy as np

from bitdrift.analysis.eqc import eqc_tables, precision_table
from bitdrift.record.reader import open_records
from bitdrift.record.writer import write_record


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
    import pandas  # noqa: F401  (imported before tracing: eqc_tables imports it on first use,
    # and its 26 MB of code objects are not the analysis's memory)

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


def read_floor(paths) -> float:
    """Seconds to open every record and read every stored layer with h5py: the floor."""
    def read(name, obj):
        if isinstance(obj, h5py.Dataset):
            obj[()]  # visititems stops at the first callback that returns a value

    start = time.perf_counter()
    for path in paths:
        with h5py.File(path, "r") as handle:
            handle.visititems(read)
    return time.perf_counter() - start


READ_PROGRAM = """
import sys, h5py
def read(name, obj):
    if isinstance(obj, h5py.Dataset):
        obj[()]
for path in sys.argv[1:]:
    with h5py.File(path, "r") as handle:
        handle.visititems(read)
"""


def read_floor_process(paths) -> float:
    """The floor as a user meets it: a fresh Python that imports h5py and reads every
    layer of every file (start-up included, as for `bitdrift precision`)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", READ_PROGRAM, *map(str, paths)], check=True)
    return time.perf_counter() - start


def command_seconds(paths, out: Path) -> float:
    """Seconds of `bitdrift precision` as a user runs it: a fresh process, start-up included."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bitdrift.cli", "precision", *map(str, paths),
                    "--out", str(out)], check=True)
    return time.perf_counter() - start


PEAK_RSS_PROGRAM = """
import resource, subprocess, sys
subprocess.run(sys.argv[1:], check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def command_peak_rss(paths, out: Path) -> float:
    """Peak resident memory (MB) of `bitdrift precision --workers 1`: what the process
    holds, HDF5's own memory included (tracemalloc sees NumPy buffers only)."""
    command = [sys.executable, "-m", "bitdrift.cli", "precision", *map(str, paths),
               "--out", str(out), "--workers", "1"]
    result = subprocess.run([sys.executable, "-c", PEAK_RSS_PROGRAM, *command], check=True,
                            capture_output=True, text=True)
    return int(result.stdout.split()[-1]) / 1024


def ratios(paths, folder: Path, layers: int) -> None:
    """The issue's measure, in one run: `bitdrift precision` vs the read floor and vs the
    naive pairwise-and-shift loop over every layer (the same files, warm page cache).
    Both sides of the floor ratio are fresh processes, start-up included; the in-process
    read time is printed too."""
    read_floor(paths)  # warm the page cache once, so every timing reads from memory
    floor_in_process = min(read_floor(paths) for _ in range(3))
    floor = min(read_floor_process(paths) for _ in range(5))
    ours = min(command_seconds(paths, folder / "precision.csv") for _ in range(5))
    records = open_records(paths)
    # The same tensors as the command: every layer and the final output.
    names = [f"layer{layer:02d}" for layer in range(layers)] + ["output"]
    start = time.perf_counter()
    for name in names:
        naive_layer([r.tensor(0, name).values[0] for r in records])
    naive = time.perf_counter() - start
    print(f"read floor {floor:.2f} s in a fresh process ({floor_in_process:.2f} s of it "
          f"reading); bitdrift precision {ours:.2f} s (start-up included); naive loop "
          f"{naive:.2f} s (in process, no start-up)")
    print(f"bitdrift precision / read floor = {ours / floor:.2f}x (target <= 1.3); "
          f"naive / bitdrift precision = {naive / ours:.1f}x (target >= 10)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--layers", type=int, default=50)
    parser.add_argument("--elements", type=int, default=100_000)
    parser.add_argument("--naive-layers", type=int, default=2,
                        help="layers timed with the naive implementation")
    parser.add_argument("--ratios", action="store_true",
                        help="only the ratios to the read floor and the naive loop (the "
                        "issue's set-up: --devices 64 --layers 16 --elements 65536)")
    args = parser.parse_args()
    if args.ratios:
        with tempfile.TemporaryDirectory() as tmp:
            paths = make_records(Path(tmp), args.devices, args.layers, args.elements)
            ratios(paths, Path(tmp), args.layers - 1)
        return
    with tempfile.TemporaryDirectory() as tmp:
        half = Path(tmp) / "half"
        full = Path(tmp) / "full"
        half.mkdir()
        full.mkdir()
        paths = make_records(full, args.devices, args.layers, args.elements)
        half_paths = make_records(half, args.devices, max(args.layers // 2, 2), args.elements)
        seconds, peak = timed_analysis(paths)
        _, half_peak = timed_analysis(half_paths)
        rss = command_peak_rss(paths, Path(tmp) / "precision.csv")
        half_rss = command_peak_rss(half_paths, Path(tmp) / "precision.csv")
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
    print(f"peak resident memory of `bitdrift precision`: {rss:.0f} MB with {args.layers} "
          f"layers, {half_rss:.0f} MB with {max(args.layers // 2, 2)} layers")
    print(f"naive pairwise-and-shift: {naive_per_layer * 1e3:.1f} ms/layer "
          f"(measured on {args.naive_layers} layers, class counting included)")
    print(f"speed-up per layer: {naive_per_layer / ours_per_layer:.1f}x")


if __name__ == "__main__":
    main()
