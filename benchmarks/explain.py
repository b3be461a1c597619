"""Benchmark: `bitdrift explain` on many records with many CPU flags (run on demand).

    python benchmarks/explain.py --records 1000 --flags 200

Writes one small record per device whose fingerprint holds a random subset of the flags
(in blocks, so flags group as on real CPU generations), a core count and a thread setting;
the device's class is determined by two of these attributes. Times `explain_table` (reading
the records included) and checks that the attributes found are the planted ones.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bitdrift.analysis.explain import explain_table
from bitdrift.record.reader import open_records
from bitdrift.record.writer import write_record


def make_records(folder: Path, records: int, flags: int) -> list[Path]:
    rng = np.random.default_rng(0)
    names = [f"flag{index:03d}" for index in range(flags)]
    blocks = np.array_split(np.arange(flags), 12)  # 12 "CPU generations" of flags
    paths = []
    for device in range(records):
        generation = int(rng.integers(1, 13))
        present = [names[i] for block in blocks[:generation] for i in block]
        threads = int(rng.choice([1, 2, 4, 8]))
        # planted cause: generations 1-6 vs 7-12, and one thread vs more
        bits = 0 if generation <= 6 else 1
        output = np.array([[1.0, 2.0, 3.0 + bits * 1e-6 + (threads > 1) * 2e-6]],
                          dtype=np.float32)
        path = folder / f"d{device:04d}.h5"
        write_record(path, {
            "model": "net", "device": f"d{device:04d}", "backend": "torch",
            "precision": "float32", "model_sha256": "m" * 64, "input_sha256": "i" * 64,
            "fingerprint": {"cpu": {"flags": present, "count": 2 * generation,
                                    "brand": f"CPU generation {generation}"},
                            "threads": threads, "hostname": f"host{device}"}},
            {0: {"output": output}})
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1000)
    parser.add_argument("--flags", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        paths = make_records(Path(folder), args.records, args.flags)
        started = time.perf_counter()
        explain, flags, classes = explain_table(open_records(paths))
        seconds = time.perf_counter() - started
    row = explain.iloc[0]
    print(f"explain: {args.records} records x {args.flags} flags: {seconds:.2f} s "
          f"({row['n_eqc']} classes, {len(set(flags['group']))} flag groups)")
    print(f"attributes: {row['attributes']} (determined {row['determined']}, "
          f"search {row['search']})")


if __name__ == "__main__":
    main()
