"""PyTorch (Keras' torch backend, and the MaxPool study's plain torch): threads, op
determinism, GPUs."""

from __future__ import annotations

import contextlib
import os
import sys

from bitdrift.backends.keras import common as keras_common
from bitdrift.errors import AcceleratorMissing

NAME = "torch"
TRAINS = True
# Children forked from a parent that imported Keras (bitdrift.run.workers); measured bit for
# bit equal to fresh processes for every default device (tests/unit/test_prefork.py).
PREFORK = True

environment, preimport, import_keras = keras_common.members(NAME)


def configure_threads(threads: int | None) -> None:
    if not threads:
        return
    import torch

    torch.set_num_threads(threads)


def configure_determinism(deterministic: bool) -> None:
    """torch's deterministic algorithms (and cuDNN's), and no cuDNN autotuning. Off is set
    explicitly too: the MaxPool study measures GPU kernels' nondeterminism that way."""
    import torch

    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(deterministic, warn_only=False)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False


def configure_device(device: dict) -> None:
    """A device's own torch switches for inference (TF32, cuDNN autotuning, deterministic
    algorithms), set before the model runs; an unset key keeps torch's default."""
    import torch

    if device.get("allow_tf32") is not None:
        torch.backends.cuda.matmul.allow_tf32 = device["allow_tf32"]
        torch.backends.cudnn.allow_tf32 = device["allow_tf32"]
    if device.get("cudnn_benchmark") is not None:
        torch.backends.cudnn.benchmark = device["cudnn_benchmark"]
    if device.get("deterministic") is not None:
        configure_determinism(device["deterministic"])


def torch_device(name: str, accelerator: str):
    """The torch.device for an accelerator: cpu, or cuda when asked for; a missing GPU
    raises AcceleratorMissing, never falls back to the CPU."""
    import torch

    if accelerator == "cpu":
        return torch.device("cpu")
    if accelerator == "gpu":
        if not torch.cuda.is_available():
            raise AcceleratorMissing(
                f"{name} asks for a GPU but torch sees none (torch {torch.__version__}, "
                f"CUDA build {torch.version.cuda}); refusing to fall back to the CPU")
        return torch.device("cuda")
    raise AcceleratorMissing(f"{name}: torch has no {accelerator.upper()} support; "
                             "refusing to fall back to the CPU")


def check_accelerator(name: str, device: dict) -> dict:
    accelerator = device["accelerator"]
    torch_device(f"device {name!r}", accelerator)
    if accelerator == "cpu":
        return {"accelerator": "cpu"}
    import torch

    from bitdrift.backends.gpu import nvidia_driver

    return {"accelerator": "gpu", "gpu_name": torch.cuda.get_device_name(0),
            "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "cuda_version": torch.version.cuda,
            "cudnn_version": torch.backends.cudnn.version(),
            "driver_version": nvidia_driver(), "gpu_count": torch.cuda.device_count(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}


def strategy_scope(accelerator: dict):
    return contextlib.nullcontext()


def versions() -> dict:
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    return {"torch": torch.__version__, "torch_mkldnn": torch.backends.mkldnn.is_available(),
            "torch_deterministic": torch.are_deterministic_algorithms_enabled()}


def open_session(job: dict, name: str):
    return keras_common.open_session(sys.modules[__name__], job, name)


def trace_environment(device: dict) -> dict:
    """What a traced repeat sets to log every kernel call (bitdrift.analysis.kernels)."""
    from bitdrift.backends.gpu import kernel_log_environment

    return kernel_log_environment(device, {"ONEDNN_VERBOSE": "1", "MKL_VERBOSE": "1"})


# The session of a model file of each format this runtime runs (bitdrift.runtimes)
SESSIONS = {"keras": open_session}
# A repro script's thread settings (bitdrift.backends.keras.common.script_code): code
# before and after ``import keras``
SCRIPT_THREADS = ("", "import torch\n\ntorch.set_num_threads({n})\n")
SCRIPT_LAYER = keras_common.SCRIPT_LAYER
script_refusal = keras_common.script_refusal


def script_code(device: dict, layer) -> str:
    return keras_common.script_code(sys.modules[__name__], device, layer)
