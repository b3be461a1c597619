"""Devices: selecting the backend, placing work on the requested accelerator, fingerprints.

A device that asks for a GPU or TPU the process cannot see raises AcceleratorMissing; it
never falls back to the CPU, which would silently corrupt a study of hardware differences.
A CPU device hides GPUs from the process (CUDA_VISIBLE_DEVICES="") so that it really
computes on the CPU even on a GPU node.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from pathlib import Path

from bitdrift import backends


def import_keras(backend: str):
    """Keras on ``backend`` (see bitdrift.backends)."""
    return backends.get(backend).import_keras()


def device_environment(device: dict, base: dict | None = None) -> dict:
    """Environment of a fresh inference/training process for ``device``."""
    env = dict(os.environ if base is None else base)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # a user's own log level is kept
    # What the runtime sets is the device's (its XLA flags, its platform): it wins over an
    # inherited value.
    env.update(backends.get(device["backend"]).environment(device))
    if device["accelerator"] == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if device.get("threads"):
        env["OMP_NUM_THREADS"] = str(device["threads"])
    env.update(device.get("env", {}))
    # An emulated device's process must know it: py-cpuinfo's usual answer (and its cache)
    # is the host's, and its fingerprint names the CPU it sees through CPUID instead
    env.pop(EMULATED, None)
    if device.get("emulate"):
        from bitdrift.emulation.cpus import environment

        env[EMULATED] = device["emulate"]
        env.update(environment(device))
    return env


def configure_threads(backend: str, threads: int | None) -> None:
    backends.get(backend).configure_threads(threads)


def configure_determinism(backend: str, deterministic: bool) -> None:
    """The backend's own op-determinism switch (on only: off is every framework's default
    in a fresh process)."""
    if deterministic:
        backends.get(backend).configure_determinism(True)


def check_accelerator(name: str, device: dict) -> dict:
    """Verify the accelerator is visible; return a description of it for the fingerprint."""
    return backends.get(device["backend"]).check_accelerator(name, device)


def strategy_scope(accelerator: dict, backend: str):
    """The distribution scope models are built in: TPUStrategy on a TPU, else none."""
    return backends.get(backend).strategy_scope(accelerator)


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


EMULATED = "BITDRIFT_EMULATED_CPU"


def fingerprint(device: dict, accelerator_info: dict) -> dict:
    """Where and with what a result was computed (stored as JSON in every record): the
    device's own runtime's versions, never those of a framework the process only loaded.
    Under emulation, the CPU the process sees (CPUID), and the emulated model."""
    emulated = os.environ.get(EMULATED)
    if emulated:
        from bitdrift.emulation.cpus import seen_cpu

        seen = seen_cpu()
        info = {"brand_raw": seen["brand"], "vendor_id_raw": seen["vendor"],
                "family": seen["family"], "model": seen["model"],
                "stepping": seen["stepping"], "arch": platform.machine().upper(),
                "count": os.cpu_count(), "flags": seen["flags"]}
    else:
        info = cpu_info()
    versions = {"python": platform.python_version()}
    for module in ("keras", "numpy", "h5py"):
        if module in sys.modules:
            versions[module] = getattr(sys.modules[module], "__version__", "unknown")
    versions.update(backends.get(device["backend"]).versions())
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
        **({"emulation": {"model": emulated}} if emulated else {}),
    }


def emulation_host(fingerprint_: dict) -> dict:
    """An emulated record's fingerprint completed by the parent (native) process: QEMU's
    version and the host CPU the emulation ran on."""
    if not fingerprint_ or "emulation" not in fingerprint_:
        return fingerprint_
    from bitdrift.emulation.cpus import architecture
    from bitdrift.emulation.qemu import ARM_QEMU, QEMU, qemu_version

    host = cpu_info()
    qemu = ARM_QEMU if architecture(fingerprint_["emulation"]["model"]) == "aarch64" else QEMU
    fingerprint_["emulation"].update({"qemu": qemu_version(qemu),
                                      "host_brand": host.get("brand_raw"),
                                      "host_flags": sorted(host.get("flags", []))})
    return fingerprint_


def describe(device: dict) -> str:
    return json.dumps(device, sort_keys=True)

