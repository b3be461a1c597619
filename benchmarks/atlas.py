"""Benchmark: identify against an atlas of 10,000 records (run on demand).

    python benchmarks/atlas.py [--records 10000] [--classes 300]

Writes synthetic inference records (real HDF5 records, bitdrift.record.writer.write_record: one
model, 3 samples, 2 repeats, a 10-logit output; devices in ``--classes`` bit-identical
classes, each class perturbed from a common output in its low mantissa bits), builds the
atlas index (bitdrift.atlas.digest_index) and times: the index build from the records, its write and
read, and one query (an exact match and a no-match that needs the nearest search), against
``identify --against`` (bitdrift.analysis.explain.identify) on a subset for scale.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bitdrift.atlas.digest_index import Index
from bitdrift.record.reader import Record, open_records
from bitdrift.record.writer import write_record

ATTRS = {"backend": "tensorflow", "precision": "float32", "model_sha256": "m" * 64,
         "input_sha256": "i" * 64, "fingerprint": {"hostname": "benchmark"}, "model": "m"}


def write_atlas(folder: Path, records: int, classes: int, rng) -> list[Path]:
    base = rng.standard_normal((3, 10)).astype(np.float32)
    class_outputs = []
    for _ in range(classes):
        raw = base.view(np.uint32).copy()
        raw ^= rng.integers(0, 1 << int(rng.integers(1, 12)), size=raw.shape, dtype=np.uint32)
        class_outputs.append(raw.view(np.float32))
    paths = []
    for number in range(records):
        output = class_outputs[number % classes]
        path = folder / f"record{number:05d}.h5"
        write_record(path, {**ATTRS, "device": f"device{number:05d}"},
                     {s: {"output": np.stack([output[s], output[s]])} for s in range(3)})
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--classes", type=int, default=300)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        started = time.perf_counter()
        paths = write_atlas(folder, args.records, args.classes, rng)
        print(f"wrote {len(paths)} records in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        records = open_records(paths)
        index = Index.build(records)
        built = time.perf_counter() - started
        started = time.perf_counter()
        index.write(folder / "atlas.h5")
        written = time.perf_counter() - started
        started = time.perf_counter()
        index = Index.read(folder / "atlas.h5")
        read = time.perf_counter() - started
        query = Record(paths[7])
        started = time.perf_counter()
        found = index.identify(query)
        exact = time.perf_counter() - started
        assert found.matched and len(found.records) == len(range(7, args.records, args.classes))
        stranger = folder / "stranger.h5"
        output = query.tensor(0, "output").values[0].view(np.uint32) ^ np.uint32(1 << 15)
        write_record(stranger, {**ATTRS, "device": "unknown"},
                     {s: {"output": np.stack([output.view(np.float32)] * 2)}
                      for s in range(3)})
        started = time.perf_counter()
        found = index.identify(Record(stranger))
        nearest = time.perf_counter() - started
        assert not found.matched
        subset = records[:500]
        from bitdrift.analysis.explain import identify

        started = time.perf_counter()
        identify(query, subset)
        brute = time.perf_counter() - started
    print("| records | index build (read every record) | index write | index read | "
          f"query, exact match | query, nearest search | `identify --against` {len(subset)} "
          "records |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.records:,} | {built:.1f} s | {written:.2f} s | {read:.2f} s | "
          f"{exact * 1000:.1f} ms | {nearest * 1000:.1f} ms | {brute:.1f} s |")


if __name__ == "__main__":
    main()
