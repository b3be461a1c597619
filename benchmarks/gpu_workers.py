"""Check on demand, on a machine with an NVIDIA GPU: a torch GPU device's workers.

    python benchmarks/gpu_workers.py ASSETS OUT

ASSETS holds ``small.keras`` and ``digits.h5`` (made where TensorFlow is installed, with
``tests.utils.small_model_assets``) and ``train.h5`` (``prepare_dataset("digits", ...)``,
128 training and 32 test images); OUT gets ``result.json`` and the jobs' log. It checks:
the worker selection (bitdrift.run.workers.worker_processes,
bitdrift.run.fork_server.repeat_workers)
gives a GPU device fresh processes, whose repeats agree bit for bit; a training run through
the fork server's selection equals a fresh one (arm ``control``: op determinism on); the
whole inference job writes a record that names the GPU, with and without its traced
repeat; a device whose GPU is hidden fails with AcceleratorMissing, never on the CPU.
On an NVIDIA H200 (2026-11-26) everything held except the traced repeat, whose log the
parser could not read then (benchmarks/gpu_kernel_logs.py; docs/benchmarks.md).
"""

import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

from bitdrift.config import load_config
from bitdrift.errors import AcceleratorMissing
from bitdrift.run import fork_server as forkserver
from bitdrift.run.workers import FreshProcesses, worker_processes
from bitdrift.studies.variance.plans import ARMS
from bitdrift.studies.variance.runs import train_run

ASSETS, OUT = (Path(argument).resolve() for argument in sys.argv[1:3])
WORK = Path(tempfile.mkdtemp(prefix="bitdrift-gpu-"))
os.environ["XDG_RUNTIME_DIR"] = str(WORK)  # its fork servers, if any, apart from a user's
result = {}
DEFAULTS = load_config(Path(__file__).parents[1] / "config.yaml")["devices"]
device = DEFAULTS["torch_1thread"] | {"accelerator": "gpu"}
result["device"] = device
log = open(OUT / "jobs.log", "a")


def job(out):
    return {"device": device, "device_name": "torch_gpu",
            "model_path": str(ASSETS / "small.keras"),
            "dataset_path": str(ASSETS / "digits.h5"), "samples": [0, 3, 5],
            "layers": True, "out": str(out), "fingerprint": True, "reference": None,
            "export": None, "trace": False}


def arrays(path):
    with np.load(path) as data:
        return json.loads(str(data["meta"])), {k: data[k] for k in data.files if k != "meta"}


WORKER = "bitdrift.run.repeat:run_repeat"
outs = {}
for name, make in (("fresh1", None), ("fresh2", None),
                   ("worker_processes", worker_processes),
                   ("repeat_workers", forkserver.repeat_workers)):
    started = time.time()
    try:
        with (contextlib.nullcontext(FreshProcesses(WORKER, device, "torch_gpu", log))
              if make is None else make(WORKER, device, "torch_gpu", log)) as workers:
            status = workers.run(job(WORK / f"{name}.npz"))
        result[name] = {"status": status, "how": workers.HOW,
                        "seconds": round(time.time() - started, 2)}
        if status == 0:
            outs[name] = arrays(WORK / f"{name}.npz")
    except Exception as error:
        result[name] = {"error": f"{type(error).__name__}: {error}",
                        "trace": traceback.format_exc()[-1500:]}
if "fresh1" in outs:
    meta, base = outs["fresh1"]
    result["accelerator_seen"] = meta.get("fingerprint", {}).get("accelerator")
    for name, (_, other) in outs.items():
        result[f"{name}_equal_fresh1"] = sorted(other) == sorted(base) and all(
            other[k].tobytes() == base[k].tobytes() for k in base)
    result["array_keys"] = len(base)
# training: served vs fresh, op determinism on (arm control)
plan = {"study": "plan", "model": "small", "seed": 3, "runs": 1,
        "spec": {"architecture": "small_cnn", "dataset": "digits", "epochs": 1,
                 "batch_size": 32, "optimizer": "adam", "learning_rate": 0.001,
                 "momentum": 0.0, "augmentation": {}}, "arms": {"control": ARMS["control"]}}
runs = {}
for name in ("served", "fresh", "fresh_again"):
    os.environ[forkserver.FRESH] = "0" if name == "served" else "1"
    try:
        train_run(plan_name="p", plan=plan, arm="control", device_name="torch_gpu",
                  device=device, run=0, dataset_path=ASSETS / "train.h5",
                  out_dir=WORK / "train" / name, log=log)
        import h5py
        with h5py.File(WORK / "train" / name / "run.h5") as handle:
            runs[name] = {k: handle[k][()] for k in ("logits", "weights")}
        result[f"train_{name}"] = "ok"
    except Exception as error:
        result[f"train_{name}"] = f"{type(error).__name__}: {error}"[:1500]
os.environ[forkserver.FRESH] = "0"
for name in ("served", "fresh_again"):
    if name in runs and "fresh" in runs:
        result[f"train_{name}_equal_fresh"] = all(
            np.array_equal(runs[name][k].view(np.uint8), runs["fresh"][k].view(np.uint8))
            for k in ("logits", "weights"))
# the whole inference job, as the workflow runs it (repeats, record, traced repeat)
from bitdrift.run.inference import infer  # noqa: E402

for kernels in (False, True):
    try:
        infer(model_name="small", device_name="torch_gpu", device=device,
              model_path=ASSETS / "small.keras", dataset_path=ASSETS / "digits.h5",
              samples=[0, 3, 5], out=WORK / f"record_{kernels}.h5", layers=True,
              reference=None, export=None, kernels=kernels, log=log)
        import h5py

        with h5py.File(WORK / f"record_{kernels}.h5") as handle:
            attrs = dict(handle.attrs)
        result[f"infer_kernels_{kernels}"] = {
            k: str(v)[:300] for k, v in attrs.items()
            if any(word in k for word in ("accelerator", "gpu", "device", "kernel"))}
    except Exception as error:
        result[f"infer_kernels_{kernels}"] = f"{type(error).__name__}: {error}"[:1500]
# a hidden GPU: the served job must fail, naming the GPU
hidden = device | {"env": {**device.get("env", {}), "CUDA_VISIBLE_DEVICES": ""}}
try:
    status = forkserver.ServedChildren(WORKER, hidden, "torch_gpu_hidden", log).run(
        job(WORK / "hidden.npz") | {"device": hidden})
    result["hidden_gpu"] = f"no error, status {status}"
except AcceleratorMissing as error:
    result["hidden_gpu"] = f"AcceleratorMissing: {error}"[:600]
except Exception as error:
    result["hidden_gpu"] = f"{type(error).__name__}: {error}"[:600]
log.close()
print(json.dumps(result, indent=1, default=str))
(OUT / "result.json").write_text(json.dumps(result, indent=1, default=str))
