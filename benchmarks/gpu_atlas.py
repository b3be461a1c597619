"""Record the reference set on a GPU machine, for the atlas (run on demand, one call).

    python benchmarks/gpu_atlas.py CARRIED OUT [--parallel 4]

CARRIED holds what the GPU machine cannot make without TensorFlow or a network:
``reference.npz`` (TensorFlow's reference of the reference model: `bitdrift export`) and
``model.onnx`` and ``deployed.onnx`` (its exports, for ONNX Runtime on the host CPU). The
reference model and its inputs come from the package (bitdrift.inputs.reference_set). Every device
below runs through `bitdrift infer` (all repeats, the traced repeat, the orders), one
record each under OUT/records; OUT gets ``records.tar.gz`` and ``log.txt``. `bitdrift atlas
add` turns the records into the machine's atlas entry where the analysis is installed.

The devices are the study's GPU questions for the reference model on torch (Keras' torch
backend): TF32 as torch sets it (convolutions with, matmuls without), TF32 everywhere and
nowhere, cuDNN's deterministic algorithms, cuDNN autotuning, float16 and bfloat16; JAX on
the GPU at its default and highest matmul precision; and the host's CPU through torch and
ONNX Runtime, an entry for another CPU. A device's processes see only its GPU: none falls
back to the CPU (bitdrift.backends.keras.torch.torch_device).

Devices run ``--parallel`` at a time (each its own processes; cuDNN autotuning alone, as
other jobs' kernels would sway its timing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from bitdrift.inputs import reference_set

GPU = {"accelerator": "gpu", "backend": "torch"}
DEVICES = {
    "torch_gpu": dict(GPU),
    "torch_gpu_tf32": {**GPU, "allow_tf32": True},
    "torch_gpu_no_tf32": {**GPU, "allow_tf32": False},
    "torch_gpu_deterministic": {**GPU, "deterministic": True},
    "torch_gpu_float16": {**GPU, "precision": "float16"},
    "torch_gpu_bfloat16": {**GPU, "precision": "bfloat16"},
    "jax_gpu": {"accelerator": "gpu", "backend": "jax"},
    "jax_gpu_highest": {"accelerator": "gpu", "backend": "jax", "matmul_precision": "highest"},
    "torch_1thread": {"accelerator": "cpu", "backend": "torch", "threads": 1},
    "torch_16threads": {"accelerator": "cpu", "backend": "torch", "threads": 16},
    "ort_all": {"accelerator": "cpu", "backend": "onnxruntime", "threads": 16},
}
ALONE = {"torch_gpu_cudnn_benchmark": {**GPU, "cudnn_benchmark": True}}
MODEL = "reference"


def config() -> dict:
    return {"samples": reference_set.samples(),
            "datasets": {"digits": {"source": "digits"}},
            "models": {MODEL: {"file": str(reference_set.model_file()), "dataset": "digits"}},
            "devices": {**DEVICES, **ALONE}}


def run_device(name: str, config_path: Path, carried: Path, records: Path, log) -> dict:
    command = [sys.executable, "-m", "bitdrift", "infer", "--config", str(config_path),
               "--model", MODEL, "--device", name, "--out", str(records / f"{name}.h5"),
               "--model-file", str(reference_set.model_file()),
               "--dataset-file", str(reference_set.inputs_file()),
               "--reference", str(carried / "reference.npz")]
    if DEVICES.get(name, ALONE.get(name))["backend"] == "onnxruntime":
        command += ["--export", str(carried / "model.onnx"),
                    "--deployed-export", str(carried / "deployed.onnx")]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.monotonic() - start
    log.write(f"==== {name}: exit {done.returncode} in {seconds:.1f} s\n{done.stderr[-6000:]}\n")
    log.flush()
    return {"device": name, "returncode": done.returncode, "seconds": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("carried", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--devices", nargs="+", help="only these devices (default: all)")
    args = parser.parse_args()
    chosen = [name for name in (*DEVICES, *ALONE) if not args.devices or name in args.devices]
    records = args.out / "records"
    records.mkdir(parents=True, exist_ok=True)
    config_path = args.out / "config.yaml"
    config_path.write_text(yaml.safe_dump(config()))
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with open(args.out / "log.txt", "w") as log:
        with ThreadPoolExecutor(args.parallel) as pool:
            results = list(pool.map(lambda name: run_device(
                name, config_path, args.carried, records, log),
                [name for name in chosen if name in DEVICES]))
        results += [run_device(name, config_path, args.carried, records, log)
                    for name in chosen if name in ALONE]
    (records / "results.json").write_text(json.dumps(results, indent=1))
    with tarfile.open(args.out / "records.tar.gz", "w:gz") as archive:
        archive.add(records, arcname="records")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
