"""JAX (Keras' jax backend, XLA): threads, XLA flags, matmul precision, float64, GPUs and
TPUs. Every knob is set in the process's environment before JAX starts its backend (XLA
reads ``XLA_FLAGS`` once, when the first computation creates its client)."""

from __future__ import annotations

import contextlib
import os
import sys

from bitdrift.backends.keras import common as keras_common
from bitdrift.backends.keras.common import import_keras as _import_keras
from bitdrift.backends.keras.common import keras_environment
from bitdrift.errors import AcceleratorMissing

NAME = "jax"
TRAINS = True
# Fresh processes: JAX warns that forking its (multithreaded) process may deadlock, and a
# repeat's time here is XLA compiling, which a forked child would do again anyway (2 jobs:
# 20.9 s fresh, 22.7 s forked).
PREFORK = False
# The platform JAX may use for a device: a GPU device that gets none fails at the first
# computation instead of running on the CPU.
PLATFORMS = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}
# (It also held `intra_op_parallelism_threads=1`, a word without "--": XLA stops reading its
# flags there, so it did nothing and hid any flag after it; the affinity sets the threads.)
SINGLE_THREAD_FLAGS = "--xla_cpu_multi_thread_eigen=false"


def environment(device: dict) -> dict:
    flags = [device.get("xla_flags", "")]
    if device.get("threads") == 1:
        flags.append(SINGLE_THREAD_FLAGS)
    env = {**keras_environment(NAME), "JAX_PLATFORMS": PLATFORMS[device["accelerator"]],
           "XLA_FLAGS": " ".join(flag for flag in flags if flag)}
    if device.get("precision") == "float64":
        env["JAX_ENABLE_X64"] = "1"  # without it JAX computes float64 arrays in float32
    if device.get("matmul_precision"):
        env["JAX_DEFAULT_MATMUL_PRECISION"] = device["matmul_precision"]
    return env


def preimport() -> None:
    keras_common.preimport(NAME)


def import_keras():
    return _import_keras(NAME)


def configure_threads(threads: int | None) -> None:
    """XLA sizes its CPU thread pool by the CPUs the process may run on, when its client
    starts (after Keras' import, at the first computation): the process is pinned to
    ``threads`` CPUs here."""
    if not threads or not hasattr(os, "sched_setaffinity"):
        return
    available = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(available[:threads]))


def configure_determinism(deterministic: bool) -> None:
    """XLA's deterministic GPU ops (its CPU code is deterministic already)."""
    if deterministic and "--xla_gpu_deterministic_ops" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_gpu_deterministic_ops=true").strip()


def check_accelerator(name: str, device: dict) -> dict:
    import jax

    accelerator = device["accelerator"]
    try:
        devices = jax.devices(PLATFORMS[accelerator])
    except (RuntimeError, AssertionError, ValueError) as error:  # JAX 0.10 asserts
        raise AcceleratorMissing(f"device {name!r} asks for a {accelerator.upper()} but JAX "
                                 f"sees none ({type(error).__name__}: {error}); refusing to "
                                 "fall back to the CPU") from error
    if jax.default_backend() != PLATFORMS[accelerator].replace("cuda", "gpu"):
        raise AcceleratorMissing(f"device {name!r}: JAX computes on {jax.default_backend()}, "
                                 f"not the {accelerator} asked for")
    described = {"accelerator": accelerator, f"{accelerator}_count": len(devices)}
    if accelerator != "cpu":
        described[f"{accelerator}_name"] = devices[0].device_kind
    return described


def strategy_scope(accelerator: dict):
    return contextlib.nullcontext()


def versions() -> dict:
    jax = sys.modules.get("jax")
    if jax is None:
        return {}
    import jaxlib

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "jax_xla_flags": os.environ.get("XLA_FLAGS", ""),
            "jax_x64": bool(jax.config.jax_enable_x64),
            "jax_matmul_precision": str(jax.config.jax_default_matmul_precision)}


def open_session(job: dict, name: str):
    return keras_common.open_session(sys.modules[__name__], job, name)


def trace_environment(device: dict) -> dict:
    """Nothing to set before the process starts: XLA logs no kernel per call, and the
    traced repeat's worker has XLA dump what it compiles (trace_layers)."""
    return {}


def trace_layers(job: dict):
    """Called in a traced repeat's worker before JAX starts: XLA writes the optimised HLO
    of every module it compiles to a folder beside the job's output (inside the
    inference's work folder, removed with it). Returns ``attach(model)``, which wraps the
    layers and returns {layer: [KernelCall as dict]}, filled as the layers are called:
    before a layer's first call JAX's compiled functions are dropped (jax.clear_caches),
    so every operation it runs compiles again and is dumped; the modules that appeared
    during the call are the layer's (bitdrift.analysis.kernels.xla_module_calls). Dumping changes
    nothing XLA compiles (the traced repeat's outputs are compared with the measured)."""
    from dataclasses import asdict
    from pathlib import Path

    from bitdrift.analysis.kernels import xla_module_calls

    folder = Path(job["out"]).with_suffix(".xla")
    folder.mkdir(exist_ok=True)
    # first: XLA stops reading XLA_FLAGS at a word without "--" (a user's flags may hold one)
    os.environ["XLA_FLAGS"] = (f"--xla_dump_to={folder} --xla_dump_hlo_as_text "
                               f"{os.environ.get('XLA_FLAGS', '')}").strip()

    def attach(model) -> dict:
        import jax

        kernels: dict = {}

        def traced(layer, call):
            def wrapper(*args, **kwargs):
                if layer.name in kernels:
                    return call(*args, **kwargs)
                jax.clear_caches()
                before = set(folder.iterdir())
                result = call(*args, **kwargs)
                kernels[layer.name] = [
                    asdict(one) for path in sorted(set(folder.iterdir()) - before)
                    if path.name.endswith("after_optimizations.txt")
                    for one in xla_module_calls(path.read_text(errors="replace"))]
                return result

            return wrapper

        for layer in model.layers:
            layer.call = traced(layer, layer.call)
        return kernels

    return attach


# The session of a model file of each format this runtime runs (bitdrift.runtimes)
SESSIONS = {"keras": open_session}
# A repro script's thread settings (bitdrift.backends.keras.common.script_code): XLA sizes
# its thread pool by the CPUs the process may use, so the script restricts them before
# ``import keras``
SCRIPT_THREADS = ("os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:{n}])\n", "")
SCRIPT_LAYER = keras_common.SCRIPT_LAYER
script_refusal = keras_common.script_refusal


def script_code(device: dict, layer) -> str:
    return keras_common.script_code(sys.modules[__name__], device, layer)
