"""One training run of a training-variance plan, in a process of its own on its device.

The parent (:func:`train_run`, called by the Snakemake job or ``bitdrift train-run``)
runs the job in a process with the device's environment (threads, oneDNN ISA,
CUDA_VISIBLE_DEVICES), as inference does: a GPU device without a GPU fails there, it
never trains on the CPU instead. For TensorFlow and torch that process is a child forked
by the device's shared fork server (:mod:`bitdrift.run.fork_server`: the framework imported
once for all of a device's runs), elsewhere ``python -m bitdrift.studies.variance.runs
JOB_JSON``. The training itself is the core's one
loop (:func:`bitdrift.run.training.fit`), which says how each source of randomness is seeded.

Outputs: ``model.keras``, ``history.csv`` (per epoch: loss, accuracy, test loss and
accuracy, seconds, mean step seconds) and ``run.h5`` (final test logits and labels, the
trained weights as one vector, the initial weights' digest, per-step and per-epoch wall
times, the seeds and device fingerprint, and the test sub-group attributes when the
dataset has them). The test metrics are those of the final weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np

from bitdrift.atomic import atomic_output
from bitdrift.errors import TrainingRunError
from bitdrift.run.fork_server import training_workers
from bitdrift.run.training import cross_entropy, fit, run_seeds, save_model_and_history
from bitdrift.run.workers import worker_main
from bitdrift.studies.variance.paths import RUN_FILES

RUN_FORMAT = 2  # 2: init_sha256, the digest of the initial weights


def run_worker(job: dict) -> None:
    """Inside the run's process: train, then write model, history and run file."""
    from bitdrift.inputs.datasets import dataset_classes, read_dataset
    from bitdrift.run.devices import (
        check_accelerator,
        configure_determinism,
        configure_threads,
        fingerprint,
        import_keras,
        strategy_scope,
    )

    device, spec, switches = job["device"], job["spec"], job["switches"]
    seeds = run_seeds(switches, job["seed"], job["run"])
    keras = import_keras(device["backend"])
    configure_threads(device["backend"], device.get("threads"))
    configure_determinism(device["backend"], switches["deterministic"])
    accelerator = check_accelerator(job["device_name"], device)

    data = read_dataset(job["dataset_path"])
    classes = dataset_classes(data)
    trained = fit(keras, spec, spec, data, classes, seeds,
                  scope=strategy_scope(accelerator, device["backend"]))
    out = Path(job["out_dir"])
    save_model_and_history(trained, out / RUN_FILES["model"], out / RUN_FILES["history"])
    logits, step_seconds = trained.logits, trained.step_seconds
    with atomic_output(out / RUN_FILES["run"]) as tmp, h5py.File(tmp, "w") as handle:
        handle.create_dataset("logits", data=logits)
        handle.create_dataset("labels", data=data["y_test"])
        handle.create_dataset("weights", data=trained.weights, compression="gzip",
                              compression_opts=1)
        steps = max((len(s) for s in step_seconds), default=0)
        handle.create_dataset("step_seconds", data=np.array(
            [s + [np.nan] * (steps - len(s)) for s in step_seconds], dtype=np.float64))
        handle.create_dataset("epoch_seconds", data=[r["seconds"] for r in trained.history])
        if "a_test" in data:
            handle.create_dataset("attributes", data=data["a_test"])
            handle.attrs["attribute_names"] = data["attrs"]["attribute_names"]
        handle.attrs.update({
            "format": RUN_FORMAT, "plan": job["plan"], "arm": job["arm"],
            "device": job["device_name"], "run": job["run"], "study": job["study"],
            "model": job["model"], "spec": json.dumps(spec, sort_keys=True),
            "learning_rate": spec["learning_rate"], "classes": classes,
            "switches": json.dumps(switches, sort_keys=True), "seeds": json.dumps(seeds),
            "init_sha256": trained.init_sha256,
            "deterministic": bool(switches["deterministic"]), "backend": device["backend"],
            "dataset": str(data["attrs"].get("name")),
            "dataset_sha256": str(data["attrs"].get("source_sha256")),
            "test_accuracy": float(np.mean(logits.argmax(1) == data["y_test"])),
            "test_loss": cross_entropy(logits, data["y_test"]),
            "fingerprint": json.dumps(fingerprint(device, accelerator)),
        })


def train_run(*, plan_name: str, plan: dict, arm: str, device_name: str, device: dict,
              run: int, dataset_path: str | Path, out_dir: str | Path, log=sys.stderr) -> None:
    """Train run ``run`` of ``arm`` of a resolved plan on ``device`` in a process of its
    own (a served child or a fresh process)."""
    if arm not in plan["arms"]:
        raise TrainingRunError(f"plan {plan_name!r} has no arm {arm!r} ({sorted(plan['arms'])})")
    if not 0 <= run < plan.get("runs", run + 1):
        raise TrainingRunError(f"plan {plan_name!r} has runs 0..{plan['runs'] - 1}, not {run}")
    job = {"plan": plan_name, "arm": arm, "run": run, "seed": plan["seed"],
           "study": plan["study"], "model": plan["model"], "spec": plan["spec"],
           "switches": plan["arms"][arm], "device_name": device_name, "device": device,
           "dataset_path": str(dataset_path), "out_dir": str(out_dir)}
    print(f"bitdrift: {plan_name}/{arm} run {run} on {device_name}", file=log, flush=True)
    with training_workers("bitdrift.studies.variance.runs:run_worker", device,
                          f"plan {plan_name!r}, device {device_name!r}", log) as workers:
        status = workers.run(job)
    if status != 0:
        raise TrainingRunError(f"plan {plan_name!r}, arm {arm!r}, device {device_name!r}, run "
                               f"{run}: training failed (exit {status}); see log")


if __name__ == "__main__":
    worker_main(run_worker)
