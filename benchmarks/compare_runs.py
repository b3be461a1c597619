"""Compare two finished runs bit for bit: did a change to how jobs run change a result?

    python benchmarks/compare_runs.py BEFORE_RUN_FOLDER AFTER_RUN_FOLDER

Every inference record (``results/inference/**/*.h5``): every dataset bit for bit except
``kernels`` (it holds each kernel call's time), whose per-layer signatures are compared
instead; the model and input digests. Every training run file (``results/training/**/
run.h5``): its logits, labels and weights bit for bit (step and epoch seconds are
timings). Prints one line per file that differs and a summary; exits 1 if any differs or
a file is in one run only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import h5py
import numpy as np

TIMINGS = {"kernels", "step_seconds", "epoch_seconds"}


def contents(path: Path) -> dict:
    items = {}
    with h5py.File(path, "r") as handle:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name.split("/")[-1] not in TIMINGS:
                items[name] = obj[()]
        handle.visititems(visit)
        for key in ("model_sha256", "input_sha256"):
            if key in handle.attrs:
                items[f"@{key}"] = np.array(str(handle.attrs[key]))
    if "inference" in path.parts:
        from bitdrift.record.reader import Record

        with Record(path) as record:
            kernels = record.kernels
        if kernels:
            items["@kernel_signatures"] = np.array(repr(sorted(
                (layer, entry["signature"]) for layer, entry in kernels["layers"].items())))
    return items


def differences(before: Path, after: Path) -> list[str]:
    a, b = contents(before), contents(after)
    found = [f"only in one run: {name}" for name in sorted(a.keys() ^ b.keys())]
    for name in sorted(a.keys() & b.keys()):
        x, y = np.asarray(a[name]), np.asarray(b[name])
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            found.append(name)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    files = {}
    for which, root in (("before", args.before), ("after", args.after)):
        for pattern in ("results/inference/**/*.h5", "results/training/**/run.h5"):
            for path in root.glob(pattern):
                files.setdefault(path.relative_to(root), {})[which] = path
    differing = 0
    for relative, found in sorted(files.items()):
        if len(found) != 2:
            print(f"{relative}: only in the {next(iter(found))} run")
            differing += 1
            continue
        changed = differences(found["before"], found["after"])
        if changed:
            differing += 1
            print(f"{relative}: differs in {', '.join(changed[:6])}"
                  f"{' ...' if len(changed) > 6 else ''}")
    print(f"{len(files)} files compared, {len(files) - differing} bit for bit equal, "
          f"{differing} differ or are in one run only")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
