"""Benchmark: lossless codecs on a record's values, HDF5's own and hdf5plugin's (on demand).

    nice -n 10 python benchmarks/compression.py RECORD.h5 [RECORD.h5 ...] \\
        [--limit-bytes N] [--codecs NAME ...] [--csv compression.csv]

Takes every layer dataset holding values in each record (samples/<i>/layers/<layer>; a
format-4 tensor of digests only, 0 rows, is skipped) as it is stored: its distinct
repeats, dtype and chunk shape. For each codec it writes the array into a fresh HDF5 file
in a temporary folder (the record's chunks and Fletcher-32 checksum, HDF5's chunk cache
off so every chunk goes through the filters), reads it back and requires it bit for bit
equal (a codec that is not lossless is an error). Measured per codec: stored / raw bytes,
and write and read MB/s (10^6 bytes of raw values per second), by the wall clock and by
the process's CPU time (the wall is noisy on a shared machine, the CPU time less so).
Every codec runs on one thread: gzip, LZF, Zstd, LZ4 and Bitshuffle have none other,
hdf5plugin's wheel builds Bitshuffle without OpenMP, and Blosc2's HDF5 filter compresses
with one thread by default (BLOSC_NTHREADS=1 is set as well; hdf5plugin has no API for it).

Writes CSV (codec, raw_bytes, stored_bytes, ratio, write_MBps, read_MBps, then the CPU
time rates write_MBps_cpu, read_MBps_cpu) and beside it CSV's stem + _by_class.csv (the
same per Keras layer class, with the share of values that are zero); prints both as
tables. The sanity line: the codec the records use (shuffle+gzip-1) must store the layers
measured in the bytes the records themselves take (within 1 %), else the measurement is
not of what bitdrift writes and the run fails. --limit-bytes stops after the layer that
reaches N raw bytes (a quick run). hdf5plugin is imported here only: records stay
readable without it.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

# What every record dataset carries (CHECKSUM), kept on each codec so the bytes compare
# with a record's; the codec records use (COMPRESSION), which the sanity line checks
# reproduces the records' own bytes; LIBVER: records' object headers and chunk indexes.
from bitdrift.record.hdf5 import CHECKSUM as FLETCHER32
from bitdrift.record.hdf5 import COMPRESSION, LIBVER

RECORD_CODEC = "shuffle+gzip-1"
# Within this share of the records' own stored bytes, the record codec reproduces them.
SANITY_TOLERANCE = 0.01
COLUMNS = ["codec", "raw_bytes", "stored_bytes", "ratio", "write_MBps", "read_MBps",
           "write_MBps_cpu", "read_MBps_cpu"]


def codecs() -> dict[str, dict]:
    """{name: h5py create_dataset options} of every codec measured."""
    os.environ["BLOSC_NTHREADS"] = "1"  # before Blosc2 first compresses
    try:
        import hdf5plugin
    except ImportError:
        raise SystemExit("hdf5plugin is not installed (requirements.txt pins it)") from None

    blosc2 = hdf5plugin.Blosc2
    return {
        "none": FLETCHER32,
        RECORD_CODEC: {**COMPRESSION, **FLETCHER32},
        "shuffle+gzip-4": {"shuffle": True, "compression": "gzip", "compression_opts": 4,
                           **FLETCHER32},
        "shuffle+lzf": {"shuffle": True, "compression": "lzf", **FLETCHER32},
        "blosc2-lz4-bitshuffle-5": {**blosc2("lz4", 5, blosc2.BITSHUFFLE), **FLETCHER32},
        "blosc2-lz4-shuffle-5": {**blosc2("lz4", 5, blosc2.SHUFFLE), **FLETCHER32},
        "blosc2-zstd-bitshuffle-5": {**blosc2("zstd", 5, blosc2.BITSHUFFLE), **FLETCHER32},
        "blosc2-zstd-shuffle-5": {**blosc2("zstd", 5, blosc2.SHUFFLE), **FLETCHER32},
        "zstd-3": {**hdf5plugin.Zstd(clevel=3), **FLETCHER32},
        "lz4": {**hdf5plugin.LZ4(), **FLETCHER32},
        "bitshuffle-lz4": {**hdf5plugin.Bitshuffle(cname="lz4"), **FLETCHER32},
    }


@dataclass
class Layer:
    """One layer dataset of a record, as stored there."""

    key: str  # record path: its dataset
    layer_class: str
    values: np.ndarray  # (distinct repeats, *shape)
    chunks: tuple | None
    stored_in_record: int | None  # bytes, where the record uses RECORD_CODEC; else None


def _uses_record_codec(dataset: h5py.Dataset) -> bool:
    return (dataset.shuffle == COMPRESSION["shuffle"]
            and dataset.compression == COMPRESSION["compression"]
            and dataset.compression_opts == COMPRESSION["compression_opts"]
            and dataset.fletcher32)


def record_layers(paths: list[str], limit_bytes: int | None = None) -> Iterator[Layer]:
    """Every layer dataset holding values in the records, in sample and model order; with
    ``limit_bytes``, until the layer that reaches that many raw bytes."""
    taken = 0
    for path in paths:
        if not Path(path).is_file():
            raise SystemExit(f"{path}: no such file")
        try:
            handle = h5py.File(path, "r", rdcc_nbytes=0)
        except OSError as error:
            raise SystemExit(f"{path}: not an HDF5 file ({error})") from None
        with handle:
            samples = handle.get("samples")
            if not isinstance(samples, h5py.Group):
                raise SystemExit(f"{path}: not a bitdrift record (no group 'samples')")
            for sample in sorted(samples, key=int):
                layers = samples[sample].get("layers")
                if not isinstance(layers, h5py.Group):
                    continue  # a record of final outputs only (analysis.layers: false)
                datasets = sorted(layers.values(), key=lambda found: found.attrs["position"])
                for dataset in datasets:
                    if dataset.shape[0] == 0:
                        continue  # digests only
                    class_name = dataset.attrs.get("class_name", "")
                    yield Layer(f"{path}:{dataset.name}",
                                class_name.decode() if isinstance(class_name, bytes)
                                else str(class_name), dataset[()], dataset.chunks,
                                dataset.id.get_storage_size()
                                if _uses_record_codec(dataset) else None)
                    taken += dataset.size * dataset.dtype.itemsize
                    if limit_bytes is not None and taken >= limit_bytes:
                        return


@dataclass
class Tally:
    """Bytes and seconds of one codec over some layers."""

    raw: int = 0
    stored: int = 0
    write_s: float = 0.0
    read_s: float = 0.0
    write_cpu_s: float = 0.0
    read_cpu_s: float = 0.0
    zeros: int = 0
    values: int = 0

    def row(self, codec: str) -> dict:
        def rate(seconds: float) -> float:
            return round(self.raw / 1e6 / seconds, 1) if seconds else float("nan")

        return {"codec": codec, "raw_bytes": self.raw, "stored_bytes": self.stored,
                "ratio": round(self.raw / self.stored, 4) if self.stored else float("nan"),
                "write_MBps": rate(self.write_s), "read_MBps": rate(self.read_s),
                "write_MBps_cpu": rate(self.write_cpu_s),
                "read_MBps_cpu": rate(self.read_cpu_s)}


@dataclass
class Results:
    """Per codec its tally over every layer and per layer class; the records' own bytes."""

    total: dict[str, Tally] = field(default_factory=dict)
    by_class: dict[tuple[str, str], Tally] = field(default_factory=dict)
    record_stored: int = 0  # the records' bytes of the layers measured, where known
    record_raw: int = 0  # raw bytes of those layers
    layers: int = 0


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def measure(layers, options: dict[str, dict], folder: str | Path) -> Results:
    """Writes each layer with each codec into a fresh file in ``folder`` and reads it back;
    SystemExit naming the codec and layer if it does not read back bit for bit."""
    results = Results()
    for layer in layers:
        values = np.ascontiguousarray(layer.values)
        results.layers += 1
        if layer.stored_in_record is not None:
            results.record_stored += layer.stored_in_record
            results.record_raw += values.nbytes
        zeros = int(np.count_nonzero(values == 0))
        for codec, codec_options in options.items():
            path = Path(folder, f"{codec}.h5")
            with h5py.File(path, "w", libver=LIBVER, rdcc_nbytes=0) as handle:
                wall, cpu = _clock()
                dataset = handle.create_dataset("values", data=values, chunks=layer.chunks,
                                                **codec_options)
                wall_after, cpu_after = _clock()
                stored = dataset.id.get_storage_size()
                back = handle["values"][()]
                wall_read, cpu_read = _clock()
            path.unlink()
            if back.dtype != values.dtype or back.shape != values.shape or \
                    not np.array_equal(back.view(np.uint8), values.view(np.uint8)):
                raise SystemExit(f"{codec}: {layer.key} read back differs from the values "
                                 "written: the codec is not lossless")
            for tally in (results.total.setdefault(codec, Tally()),
                          results.by_class.setdefault((layer.layer_class, codec), Tally())):
                tally.raw += values.nbytes
                tally.stored += stored
                tally.write_s += wall_after - wall
                tally.write_cpu_s += cpu_after - cpu
                tally.read_s += wall_read - wall_after
                tally.read_cpu_s += cpu_read - cpu_after
                tally.zeros += zeros
                tally.values += values.size
    return results


def sanity_line(results: Results) -> tuple[str, bool]:
    """(the line comparing the record codec's bytes here with the records' own, whether
    they agree within SANITY_TOLERANCE)."""
    if RECORD_CODEC not in results.total:
        return f"sanity: {RECORD_CODEC} not measured (--codecs): no check", True
    if results.record_raw != results.total[RECORD_CODEC].raw:
        return (f"sanity: not every layer measured is stored with {RECORD_CODEC} in its "
                "record (a record of format 1-3?): no check"), True
    here = results.total[RECORD_CODEC].stored
    off = here / results.record_stored - 1
    return (f"sanity: the records store these {results.layers} layers in "
            f"{results.record_stored:,} bytes (ratio "
            f"{results.record_raw / results.record_stored:.4f}); {RECORD_CODEC} here "
            f"{here:,} bytes (ratio {results.record_raw / here:.4f}, {off:+.3%})",
            abs(off) <= SANITY_TOLERANCE)


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    from bitdrift.atomic import atomic_output

    with atomic_output(path) as tmp, open(tmp, "w", newline="") as out:
        writer = csv.DictWriter(out, columns)
        writer.writeheader()
        writer.writerows(rows)


def print_tables(results: Results) -> None:
    print(f"{'codec':26s} {'raw MB':>9s} {'stored MB':>9s} {'ratio':>6s} {'write MB/s':>10s}"
          f" {'read MB/s':>9s} {'write (CPU)':>11s} {'read (CPU)':>10s}")
    for codec, tally in results.total.items():
        row = tally.row(codec)
        print(f"{codec:26s} {row['raw_bytes'] / 1e6:9.2f} {row['stored_bytes'] / 1e6:9.2f}"
              f" {row['ratio']:6.3f} {row['write_MBps']:10.1f} {row['read_MBps']:9.1f}"
              f" {row['write_MBps_cpu']:11.1f} {row['read_MBps_cpu']:10.1f}")
    classes = list(dict.fromkeys(layer_class for layer_class, _ in results.by_class))
    width = max(len(name) for name in classes) + 1
    first = next(iter(results.total))
    print("\nratio per layer class (zeros: share of values that are 0)")
    print(f"{'codec':26s}" + "".join(f"{name:>{width}s}" for name in classes))
    print(f"{'raw MB':26s}" + "".join(
        f"{results.by_class[name, first].raw / 1e6:{width}.2f}" for name in classes))
    print(f"{'zeros':26s}" + "".join(
        f"{results.by_class[name, first].zeros / results.by_class[name, first].values:{width}.1%}"
        for name in classes))
    for codec in results.total:
        print(f"{codec:26s}" + "".join(
            f"{results.by_class[name, codec].row(codec)['ratio']:{width}.3f}"
            for name in classes))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", nargs="+", help="bitdrift records (HDF5)")
    parser.add_argument("--limit-bytes", type=int, help="stop after the layer that reaches "
                        "this many raw bytes (over all records)")
    parser.add_argument("--codecs", nargs="+", help="measure these codecs only")
    parser.add_argument("--csv", default="compression.csv", type=Path,
                        help="the table per codec; STEM_by_class.csv beside it per class")
    args = parser.parse_args(argv)
    options = codecs()
    unknown = sorted(set(args.codecs or ()) - set(options))
    if unknown:
        raise SystemExit(f"--codecs: no codec {', '.join(unknown)} (there are "
                         f"{', '.join(options)})")
    if args.codecs:
        options = {name: options[name] for name in options if name in args.codecs}
    with tempfile.TemporaryDirectory(prefix="bitdrift-compression-") as folder:
        results = measure(record_layers(args.records, args.limit_bytes), options, folder)
    if not results.layers:
        raise SystemExit(f"{', '.join(args.records)}: no layer holds values")
    write_csv(args.csv, [tally.row(codec) for codec, tally in results.total.items()], COLUMNS)
    by_class = args.csv.with_name(f"{args.csv.stem}_by_class.csv")
    write_csv(by_class, [{"layer_class": layer_class, **tally.row(codec),
                          "zero_share": round(tally.zeros / tally.values, 4)}
                         for (layer_class, codec), tally in results.by_class.items()],
              ["layer_class", *COLUMNS, "zero_share"])
    print_tables(results)
    line, agrees = sanity_line(results)
    print(line)
    print(f"wrote {args.csv} and {by_class}")
    if not agrees:
        sys.exit(f"{line}: off by more than {SANITY_TOLERANCE:.0%}: this measurement is "
                 "not of what bitdrift writes")


if __name__ == "__main__":
    main()
