"""What every GPU runtime asks the machine: the NVIDIA driver's version."""

from __future__ import annotations

import subprocess

# cuDNN's API log and cuBLASLt's trace, both to stdout, where the layer markers are
# (cuBLASLt prints to stdout when CUBLASLT_LOG_FILE is unset).
KERNEL_LOG_ENVIRONMENT = {"CUDNN_LOGLEVEL_DBG": "3", "CUDNN_LOGDEST_DBG": "stdout",
                          "CUBLASLT_LOG_LEVEL": "5"}


def kernel_log_environment(device: dict, cpu: dict) -> dict:
    """The variables a traced repeat sets: the CPU libraries' logging, and on a GPU the
    GPU libraries' too."""
    return {**cpu, **(KERNEL_LOG_ENVIRONMENT if device["accelerator"] == "gpu" else {})}


def nvidia_driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
