"""Devices: selecting the backend, placing work on the requested accelerator, fingerprints.

A device that asks for a GPU or TPU the process cannot see raises AcceleratorMissing; it
never falls back to the CPU, which would silently corrupt a study of hardware differences.
A CPU device hides GPUs from the process (CUDA_VISIBLE_DEVICES="") so that it really
computes on the CPU even on a GPU node.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

from bitdrift.errors import AcceleratorMissing


def import_keras(backend: str):
    """Import Keras with ``backend``; refuse if Keras was already loaded with another."""
    if "keras" in sys.modules:
        keras = sys.modules["keras"]
        if keras.backend.backend() != backend:
            raise RuntimeError(f"Keras already loaded with backend {keras.backend.backend()!r}, "
                               f"cannot switch to {backend!r} in this process")
        return keras
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    keras = importlib.import_module("keras")
    if backend != "tensorflow":
        # Keras' serialisation asks whether TensorFlow is installed (`tf.available`) and
        # imports it to find out: a torch process would load TensorFlow (seconds of
        # start-up, and a TensorFlow version in a torch device's fingerprint). A process
        # of another backend never uses it, so Keras is told it is absent.
        from keras.src.utils import module_utils

        if "tensorflow" not in sys.modules:
            module_utils.tensorflow._available = False
    return keras


def device_environment(device: dict, base: dict | None = None) -> dict:
    """Environment of a fresh inference/training process for ``device``."""
    env = dict(os.environ if base is None else base)
    env["KERAS_BACKEND"] = device["backend"]
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if device["accelerator"] == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if device.get("threads"):
        env["OMP_NUM_THREADS"] = str(device["threads"])
    env.update(device.get("env", {}))
    return env


def configure_threads(backend: str, threads: int | None) -> None:
    if not threads:
        return
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    else:
        import torch

        torch.set_num_threads(threads)


def configure_determinism(backend: str, deterministic: bool) -> None:
    """The backend's own op-determinism switch."""
    if not deterministic:
        return
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    else:
        import torch

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def check_accelerator(name: str, device: dict) -> dict:
    """Verify the accelerator is visible; return a description of it for the fingerprint."""
    accelerator, backend = device["accelerator"], device["backend"]
    if accelerator == "cpu":
        return {"accelerator": "cpu"}
    if accelerator == "gpu":
        if backend == "tensorflow":
            import tensorflow as tf

            gpus = tf.config.list_physical_devices("GPU")
            if not gpus:
                raise AcceleratorMissing(
                    f"device {name!r} asks for a GPU but TensorFlow sees none "
                    f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                    "refusing to fall back to the CPU")
            details = tf.config.experimental.get_device_details(gpus[0])
            build = tf.sysconfig.get_build_info()
            return {"accelerator": "gpu", "gpu_name": details.get("device_name"),
                    "compute_capability": details.get("compute_capability"),
                    "cuda_version": build.get("cuda_version"),
                    "cudnn_version": build.get("cudnn_version"),
                    "driver_version": _nvidia_driver(), "gpu_count": len(gpus)}
        import torch

        if not torch.cuda.is_available():
            raise AcceleratorMissing(
                f"device {name!r} asks for a GPU but torch sees none "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); "
                "refusing to fall back to the CPU")
        return {"accelerator": "gpu", "gpu_name": torch.cuda.get_device_name(0),
                "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
                "cuda_version": torch.version.cuda,
                "cudnn_version": torch.backends.cudnn.version(),
                "driver_version": _nvidia_driver(), "gpu_count": torch.cuda.device_count(),
                "cudnn_deterministic": torch.backends.cudnn.deterministic,
                "cudnn_benchmark": torch.backends.cudnn.benchmark}
    if accelerator == "tpu":
        if backend != "tensorflow":
            raise AcceleratorMissing(f"device {name!r}: TPUs are supported with the "
                                     "tensorflow backend only")
        import tensorflow as tf

        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            raise AcceleratorMissing(f"device {name!r} asks for a TPU but none is visible "
                                     f"({error}); refusing to fall back to the CPU") from error
        tpus = tf.config.list_logical_devices("TPU")
        return {"accelerator": "tpu", "tpu_count": len(tpus),
                "tpu_names": [d.name for d in tpus], "_resolver": resolver}
    raise ValueError(f"device {name!r}: unknown accelerator {accelerator!r}")


def strategy_scope(accelerator: dict):
    """The distribution scope models are built in: TPUStrategy on a TPU, else none."""
    import contextlib

    if accelerator.get("accelerator") != "tpu":
        return contextlib.nullcontext()
    import tensorflow as tf

    return tf.distribute.TPUStrategy(accelerator["_resolver"]).scope()


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def cpu_info() -> dict:
    """py-cpuinfo's description of this CPU. It takes about a second per call (it measures
    the clock), and a study starts hundreds of processes on one machine: the result is kept
    per host and boot (Linux's boot id) in the temporary folder, so a machine rebooted onto
    other hardware, or another host, is described afresh."""
    import tempfile

    import cpuinfo

    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return cpuinfo.get_cpu_info()
    cache = Path(tempfile.gettempdir()) / f"bitdrift-cpuinfo-{socket.gethostname()}-{boot}.json"
    try:
        return json.loads(cache.read_text())
    except (OSError, ValueError):
        pass
    info = cpuinfo.get_cpu_info()
    try:
        from bitdrift.atomic import atomic_output

        with atomic_output(cache) as tmp:
            tmp.write_text(json.dumps(info))
    except OSError:
        pass  # a read-only temporary folder: describe the CPU again next time
    return info


def fingerprint(device: dict, accelerator_info: dict) -> dict:
    """Where and with what a result was computed (stored as JSON in every record)."""
    info = cpu_info()
    versions = {"python": platform.python_version()}
    for module in ("keras", "numpy", "tensorflow", "torch", "h5py"):
        if module in sys.modules:
            versions[module] = getattr(sys.modules[module], "__version__", "unknown")
    if "tensorflow" in sys.modules:
        build = sys.modules["tensorflow"].sysconfig.get_build_info()
        versions["tensorflow_cuda"] = build.get("cuda_version")
        versions["tensorflow_onednn"] = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default")
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        versions["torch_mkldnn"] = torch.backends.mkldnn.is_available()
        versions["torch_deterministic"] = torch.are_deterministic_algorithms_enabled()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": {
            "brand": info.get("brand_raw"), "vendor": info.get("vendor_id_raw"),
            "family": info.get("family"), "model": info.get("model"),
            "stepping": info.get("stepping"), "arch": info.get("arch"),
            "count": info.get("count"), "flags": sorted(info.get("flags", [])),
        },
        "accelerator": {k: v for k, v in accelerator_info.items() if not k.startswith("_")},
        "versions": versions,
        "threads": device.get("threads"),
        "environment": dict(device.get("env", {})),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def describe(device: dict) -> str:
    return json.dumps(device, sort_keys=True)


# -- one job per fresh process: inference repeats and training runs ------------------------
def run_in_fresh_process(module: str, job: dict, device: dict, what: str, log) -> int:
    """``python -m MODULE JOB_JSON`` with ``device``'s environment; its output goes to
    ``log``. A worker that could not see its accelerator (exit status of AcceleratorMissing)
    is raised here as AcceleratorMissing, naming ``what``; any other status is returned."""
    completed = subprocess.run([sys.executable, "-m", module, json.dumps(job)],
                               env=device_environment(device), stdout=log, stderr=log)
    if completed.returncode == AcceleratorMissing.exit_code:
        raise AcceleratorMissing(f"{what} asks for a {device['accelerator'].upper()} that the "
                                 "process cannot see; refusing to fall back to the CPU "
                                 "(details in the log)")
    return completed.returncode


def worker_main(function) -> None:
    """The entry point of a worker process: ``function(job)`` with the job from argv; a
    bitdrift error becomes one line in the log and the error's exit status for the parent."""
    from bitdrift.errors import BitdriftError

    try:
        function(json.loads(sys.argv[1]))
    except BitdriftError as error:
        print(f"bitdrift: error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
