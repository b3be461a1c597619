"""Emulated CPUs as devices: a device's processes run under QEMU's user-mode emulation of
another x86-64 CPU (``qemu-x86_64 -cpu MODEL``, Debian's qemu-user). Kernel choice in
oneDNN, OpenBLAS, MLAS and XNNPACK follows the CPU's instruction sets (CPUID), and QEMU
shows the process the emulated CPU's CPUID and runs its instructions with IEEE-exact
arithmetic: a CPU generation the user does not own becomes a device.

QEMU's TCG cannot emulate AVX-512, AMX, FMA4 or XOP: a model with any of them would run
without them (QEMU drops the feature and warns), so such models are not offered. Whether
emulation is faithful is checked, not assumed: ``bitdrift emulation-check``.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess

from bitdrift.errors import ConfigError, InferenceError

QEMU = "qemu-x86_64"
INSTALL = "install Debian's qemu-user (`apt-get install qemu-user`; ./quickstart does)"
# The instruction sets that matter for float kernels, per CPU family QEMU offers (as
# QEMU 7.2's CPUID shows them; tests/unit/test_emulation.py reads them back through QEMU).
SSE = ["sse", "sse2", "sse3", "ssse3"]
FAMILIES = {
    "Conroe": SSE, "core2duo": SSE, "Penryn": [*SSE, "sse4_1"],
    "Nehalem": [*SSE, "sse4_1", "sse4_2"], "Westmere": [*SSE, "sse4_1", "sse4_2"],
    "Denverton": [*SSE, "sse4_1", "sse4_2"], "Snowridge": [*SSE, "sse4_1", "sse4_2"],
    "SandyBridge": [*SSE, "sse4_1", "sse4_2", "avx"],
    "IvyBridge": [*SSE, "sse4_1", "sse4_2", "avx", "f16c"],
    **{name: [*SSE, "sse4_1", "sse4_2", "avx", "f16c", "avx2", "fma"]
       for name in ("Haswell", "Broadwell", "Skylake-Client", "EPYC", "EPYC-Rome",
                    "EPYC-Milan", "Dhyana")},
    "Opteron_G1": ["sse", "sse2"], "Opteron_G2": ["sse", "sse2", "sse3"],
    "Opteron_G3": ["sse", "sse2", "sse3"],
}
# QEMU's names of each family: the family, its versions and its variants (mitigations,
# no TSX), as `qemu-x86_64 -cpu help` lists them.
MODEL = re.compile(r"(?P<family>[A-Za-z0-9_]+(?:-[A-Z][a-z]+)?)(?:-(?:IBRS|IBPB|noTSX|noTSX-IBRS|"
                   r"v[0-9]+))?")
# The least instruction set each runtime's wheels need (measured under QEMU 7.2: without
# AVX TensorFlow dies of an illegal instruction and jaxlib refuses to start; below SSE4.2,
# on Conroe, numpy 2 itself (x86-64-v2) and so every runtime dies the same way).
BASELINE = "sse4_2"
RUNTIME_NEEDS = {"tensorflow": "avx", "jax": "avx", "torch": BASELINE,
                 "onnxruntime": BASELINE, "openvino": BASELINE, "litert": BASELINE}
# Instruction sets above which QEMU's TCG cannot go: a model needing them is refused.
BEYOND_TCG = ("avx512", "amx", "fma4", "xop")


def family(model: str) -> str | None:
    """The family of a QEMU model name (``Haswell-v4`` -> ``Haswell``); None if unknown."""
    match = MODEL.fullmatch(model)
    return match["family"] if match and match["family"] in FAMILIES else None


def instruction_sets(model: str) -> list[str]:
    return FAMILIES[family(model)]


def check_device(name: str, device: dict) -> None:
    """A config check: an emulated device runs on the CPU, on a model QEMU emulates in
    full, with a runtime that can run there (one line naming the key and why)."""
    model = device.get("emulate")
    if not model:
        return
    key = f"devices.{name}.emulate"
    if family(model) is None:
        raise ConfigError(f"config key {key}: {model!r} is not a CPU model QEMU emulates in "
                          f"full for floating point (one of the families "
                          f"{', '.join(FAMILIES)}, e.g. Haswell-v4; models with AVX-512 or "
                          "AMX are beyond QEMU's TCG)")
    if device.get("accelerator") != "cpu":
        raise ConfigError(f"config key {key}: an emulated CPU runs on the CPU; the device's "
                          f"accelerator is {device.get('accelerator')!r} (set accelerator: "
                          "cpu, or remove emulate)")
    needed = RUNTIME_NEEDS.get(device.get("backend"))
    if needed and needed not in instruction_sets(model):
        raise ConfigError(f"config key {key}: backend {device['backend']!r} needs "
                          f"{needed.upper().replace('_', '.')}, which {model} lacks (its wheel "
                          "is built for it); emulate a newer CPU or use another backend")


def command_prefix(device: dict) -> list[str]:
    """``[qemu-x86_64, -cpu, MODEL,-feature...]`` for an emulated device, else nothing. The
    features TCG cannot emulate (QEMU warns of each, none of them a float instruction set
    on the offered models) are switched off, so that the CPUID the process reads claims
    only what runs."""
    model = device.get("emulate")
    if not model:
        return []
    qemu = shutil.which(QEMU)
    if qemu is None:
        raise InferenceError(f"device key emulate: {model} needs {QEMU}, which is not on the "
                             f"PATH; {INSTALL}")
    return [qemu, "-cpu", ",".join([model, *(f"-{name}" for name in unsupported(model))])]


@functools.cache
def unsupported(model: str) -> tuple[str, ...]:
    """The features of ``model`` QEMU's TCG does not support (its start-up warnings); an
    instruction set that matters for floats among them refuses the model."""
    qemu = shutil.which(QEMU)
    done = subprocess.run([qemu, "-cpu", model, "/bin/true"], capture_output=True, text=True,
                          timeout=60)
    names = tuple(dict.fromkeys(re.findall(r"TCG doesn't support requested feature: "
                                           r"CPUID\.[^ ]*?\.([a-z0-9_-]+)", done.stderr)))
    lost = [name for name in names if name.startswith(BEYOND_TCG)]
    if lost:
        raise InferenceError(f"device key emulate: QEMU's TCG cannot emulate {model}'s "
                             f"{', '.join(lost)}; it would run without them")
    return names


def qemu_version() -> str:
    try:
        first = subprocess.run([QEMU, "--version"], capture_output=True, text=True,
                               timeout=30).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return first[0].split("version", 1)[-1].strip() if first else "unknown"


def seen_cpu() -> dict:
    """The CPU this process sees through CPUID alone (brand, family, model, flags): under
    QEMU, the emulated one. py-cpuinfo's usual answer merges /proc/cpuinfo, which is the
    host's even under emulation."""
    import contextlib
    import io

    from cpuinfo import cpuinfo

    # py-cpuinfo's in-process CPUID reader prints its trace on stdout
    with contextlib.redirect_stdout(io.StringIO()):
        found = cpuinfo._get_cpu_info_from_cpuid_actual()
    info = found.get("info", found) if isinstance(found, dict) else {}
    return {"brand": info.get("brand_raw"), "vendor": info.get("vendor_id_raw"),
            "family": info.get("family"), "model": info.get("model"),
            "stepping": info.get("stepping"), "flags": sorted(info.get("flags", []))}
