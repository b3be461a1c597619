"""Benchmark: what an emulated CPU costs (run on demand; needs Debian's qemu-user).

    python benchmarks/emulation.py --model Haswell-v4 --runs 1
    python benchmarks/emulation.py --model neoverse-n1 --runs 1   # Arm: LiteRT, ONNX Runtime

Per runtime: the seconds of its import in a fresh process, natively and under
`qemu-x86_64 -cpu MODEL` (an Arm model: `qemu-aarch64` in the aarch64 userland of
`bitdrift install-aarch64`), and of one device's whole inference job (bitdrift.run.inference.infer:
two repeats and no traced one, Cifar10-small with initial weights on three digits),
natively and emulated. Printed as a Markdown table with the host's CPU named; the
benchmark docs quote it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

IMPORTS = {"tensorflow": "import tensorflow", "torch": "import torch",
           "jax": "import jax, jax.numpy", "onnxruntime": "import onnxruntime",
           "openvino": "import openvino", "litert": "import ai_edge_litert.interpreter"}


def timed(command: list[str], env: dict | None = None) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, env=env)
    return time.perf_counter() - started


def job_seconds(folder: Path, backend: str, emulate: str | None) -> float:
    """One device's inference job, timed in a process of its own."""
    code = f"""
import sys, time
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from bitdrift.run.inference import infer
folder = Path({str(folder)!r})
device = {{"accelerator": "cpu", "threads": 1, "batch_size": 1, "precision": "float32",
          "env": {{}}, "repeats": 2, "external": False, "backend": {backend!r},
          **({{"emulate": {emulate!r}}} if {emulate!r} else {{}})}}
export = {{"onnxruntime": "model.onnx", "openvino": "model.onnx", "litert": "model.tflite"}}
started = time.perf_counter()
with open(folder / "log", "a") as log:
    infer(model_name="small", device_name="d", device=device, model_path=folder / "small.keras",
          dataset_path=folder / "digits.h5", samples=[0, 1, 6], out=folder / "r.h5", log=log,
          kernels=False, reference=folder / "reference.npz" if {backend!r} != "tensorflow"
          else None, export=folder / export[{backend!r}] if {backend!r} in export else None)
print(time.perf_counter() - started)
"""
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="Haswell-v4", help="the emulated CPU model")
    parser.add_argument("--runs", type=int, default=1, help="runs per measurement (median)")
    parser.add_argument("--runtimes", nargs="+", help="default: every runtime that runs on "
                        "the model")
    args = parser.parse_args()
    from bitdrift.emulation import aarch64
    from bitdrift.emulation.cpus import architecture, environment, python_command
    from bitdrift.emulation.qemu import ARM_QEMU, QEMU, qemu_version
    from bitdrift.run.devices import cpu_info
    from tests.utils import small_model_assets

    arm = architecture(args.model) == "aarch64"
    runtimes = args.runtimes or (list(aarch64.RUNTIMES) if arm else list(IMPORTS))
    emulated = {"emulate": args.model}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        small_model_assets(folder)
        code = ("import sys; "
                "from bitdrift.backends.keras.export import export_model, write_reference; "
                "write_reference(sys.argv[1], sys.argv[2], sys.argv[3] + '/reference.npz'); "
                "export_model(sys.argv[1], 'onnx', sys.argv[3] + '/model.onnx'); "
                "export_model(sys.argv[1], 'tflite', sys.argv[3] + '/model.tflite')")
        subprocess.run([sys.executable, "-c", code, str(folder / "small.keras"),
                        str(folder / "digits.h5"), str(folder)], check=True,
                       capture_output=True)
        rows = []
        for runtime in runtimes:
            row = {"runtime": runtime}
            for where, device in (("native", {}), ("emulated", emulated)):
                row[f"import_{where}"] = statistics.median(
                    timed([*python_command(device), "-c", IMPORTS[runtime]],
                          {**os.environ, **environment(device)}) for _ in range(args.runs))
                row[f"job_{where}"] = statistics.median(
                    job_seconds(folder, runtime, device.get("emulate"))
                    for _ in range(args.runs))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    host = cpu_info().get("brand_raw")
    print(f"Host: {host}; QEMU {qemu_version(ARM_QEMU if arm else QEMU)} emulating "
          f"{args.model}; median of "
          f"{args.runs} run(s), seconds.\n")
    print("| runtime | import native | import emulated | job native | job emulated | "
          "job slowdown |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['runtime']} | {row['import_native']:.1f} | {row['import_emulated']:.1f} "
              f"| {row['job_native']:.1f} | {row['job_emulated']:.1f} | "
              f"{row['job_emulated'] / row['job_native']:.1f}x |")


if __name__ == "__main__":
    main()
