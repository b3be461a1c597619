"""TensorFlow (Keras' tensorflow backend): threads, op determinism, GPU and TPU."""

from __future__ import annotations

import contextlib
import os
import sys

from bitdrift.backends.keras import common as keras_common
from bitdrift.errors import AcceleratorMissing

NAME = "tensorflow"
TRAINS = True
# Children forked from a parent that imported Keras (bitdrift.run.workers); measured bit for
# bit equal to fresh processes for every default device (tests/unit/test_prefork.py).
PREFORK = True

environment, preimport, import_keras = keras_common.members(NAME)


def configure_threads(threads: int | None) -> None:
    if not threads:
        return
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def configure_determinism(deterministic: bool) -> None:
    if not deterministic:
        return
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()


def check_accelerator(name: str, device: dict) -> dict:
    accelerator = device["accelerator"]
    if accelerator == "cpu":
        return {"accelerator": "cpu"}
    import tensorflow as tf

    if accelerator == "gpu":
        from bitdrift.backends.gpu import nvidia_driver

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
                "driver_version": nvidia_driver(), "gpu_count": len(gpus)}
    if accelerator == "tpu":
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
    raise AcceleratorMissing(f"device {name!r}: unknown accelerator {accelerator!r}")


def strategy_scope(accelerator: dict):
    """TPUStrategy on a TPU, else no scope."""
    if accelerator.get("accelerator") != "tpu":
        return contextlib.nullcontext()
    import tensorflow as tf

    return tf.distribute.TPUStrategy(accelerator["_resolver"]).scope()


def versions() -> dict:
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return {}
    build = tf.sysconfig.get_build_info()
    return {"tensorflow": tf.__version__, "tensorflow_cuda": build.get("cuda_version"),
            "tensorflow_onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default")}


def open_session(job: dict, name: str):
    return keras_common.open_session(sys.modules[__name__], job, name)


def trace_environment(device: dict) -> dict:
    """What a traced repeat sets to log every kernel call (bitdrift.analysis.kernels)."""
    from bitdrift.backends.gpu import kernel_log_environment

    return kernel_log_environment(device, {"ONEDNN_VERBOSE": "1"})


# The session of a model file of each format this runtime runs (bitdrift.runtimes)
SESSIONS = {"keras": open_session}
# A repro script's thread settings (bitdrift.backends.keras.common.script_code): code
# before and after ``import keras``
SCRIPT_THREADS = ("", "import tensorflow as tf\n\ntf.config.threading.set_intra_op_parallelism_"
                  "threads({n})\ntf.config.threading.set_inter_op_parallelism_threads({n})\n")
SCRIPT_LAYER = keras_common.SCRIPT_LAYER
script_refusal = keras_common.script_refusal


def script_code(device: dict, layer) -> str:
    return keras_common.script_code(sys.modules[__name__], device, layer)
