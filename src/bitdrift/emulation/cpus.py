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
import os
import re
import subprocess
import sys
from pathlib import Path

from bitdrift.emulation.qemu import ARM_QEMU, QEMU, qemu_path, qemu_version
from bitdrift.errors import ConfigError, InferenceError, InstallError
from bitdrift.runtimes import AARCH64_WHEELS, X86_NEEDS

INSTALL = ("install Debian's qemu-user (`apt-get install qemu-user`; ./quickstart does), or "
           "run `bitdrift install-qemu` (a static build into this environment: no root)")
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
# gcc's -march of each x86 family. Inductor (torch_inductor) compiles its C++ kernels with
# -march=native, and gcc runs natively beside QEMU, so an emulated device would get the
# host's instructions (measured: SIGILL on a Zen 4 host emulating Haswell-v4); on the
# emulated CPU itself, native is this.
GCC_MARCH = {
    "Nehalem": "nehalem",
    "Westmere": "westmere", "Denverton": "goldmont", "Snowridge": "tremont",
    "SandyBridge": "sandybridge", "IvyBridge": "ivybridge", "Haswell": "haswell",
    "Broadwell": "broadwell", "Skylake-Client": "skylake", "EPYC": "znver1",
    "Dhyana": "znver1", "EPYC-Rome": "znver2", "EPYC-Milan": "znver3",
}  # the families without SSE4.2 run no torch (bitdrift.runtimes.X86_NEEDS)
# Instruction sets above which QEMU's TCG cannot go: a model needing them is refused.
BEYOND_TCG = ("avx512", "amx", "fma4", "xop")
# QEMU's x86 models that have them (`qemu-x86_64 -cpu help`, 7.2 to 10), named in the
# refusal: the model is not offered because TCG would run it without them.
BEYOND_TCG_MODELS = {
    **dict.fromkeys(("Skylake-Server", "Cascadelake-Server", "Cooperlake", "Icelake-Server",
                     "Icelake-Client", "KnightsMill", "EPYC-Genoa", "EPYC-Turin"), "AVX-512"),
    **dict.fromkeys(("SapphireRapids", "GraniteRapids", "DiamondRapids"), "AVX-512 and AMX"),
    **dict.fromkeys(("Opteron_G4", "Opteron_G5"), "FMA4 and XOP"),
}


# aarch64 models QEMU (10 or newer) emulates, with the float and SIMD extensions each shows
# (QEMU 10's /proc/cpuinfo): NEON (asimd), half-precision arithmetic (asimdhp), dot
# product (asimddp), SVE, SVE2, BF16 and int8 matrix multiply. Their runtimes and userland:
# bitdrift.emulation.aarch64.
ARM_FAMILIES = {
    "cortex-a53": ["asimd"], "cortex-a57": ["asimd"], "cortex-a72": ["asimd"],
    "cortex-a76": ["asimd", "asimdhp", "asimddp"], "neoverse-n1": ["asimd", "asimdhp", "asimddp"],
    "a64fx": ["asimd", "asimdhp", "sve"],
    "neoverse-v1": ["asimd", "asimdhp", "asimddp", "sve", "bf16", "i8mm"],
    "neoverse-n2": ["asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm"],
}


def family(model: str) -> str | None:
    """The family of a QEMU model name (``Haswell-v4`` -> ``Haswell``; an Arm model is its
    own); None if unknown."""
    if model in ARM_FAMILIES:
        return model
    match = MODEL.fullmatch(model)
    return match["family"] if match and match["family"] in FAMILIES else None


def beyond_tcg(model: str) -> str | None:
    """Why a QEMU model is not offered, where it is one TCG cannot run in full:
    ``has AVX-512, which QEMU's TCG does not emulate (...)``; None for any other name."""
    match = MODEL.fullmatch(str(model))
    sets = BEYOND_TCG_MODELS.get(match["family"]) if match else None
    if sets is None:
        return None
    them = "them" if " and " in sets else "it"
    return (f"has {sets}, which QEMU's TCG does not emulate (it would run the model without "
            f"{them}, not as that CPU); emulate a model without {them} (Skylake-Client-v4 or "
            "EPYC-Milan: AVX2 and FMA) or run a real one")


def gcc_march(model: str | None) -> str | None:
    """gcc's -march for the emulated x86 CPU ``model`` (None natively or on Arm)."""
    return GCC_MARCH.get(family(model)) if model and architecture(model) == "x86_64" else None


def architecture(model: str) -> str | None:
    """``aarch64`` or ``x86_64``: which QEMU runs ``model``; None if unknown."""
    return "aarch64" if model in ARM_FAMILIES else "x86_64" if family(model) else None


def instruction_sets(model: str) -> list[str]:
    return ARM_FAMILIES.get(model) or FAMILIES[family(model)]


def check_device(name: str, device: dict) -> None:
    """A config check: an emulated device runs on the CPU, on a model QEMU emulates in
    full, with a runtime that can run there (one line naming the key and why)."""
    model = device.get("emulate")
    if not model:
        return
    key = f"devices.{name}.emulate"
    if beyond_tcg(model):
        raise ConfigError(f"config key {key}: {model!r} {beyond_tcg(model)}")
    if family(model) is None:
        raise ConfigError(f"config key {key}: {model!r} is not a CPU model QEMU emulates in "
                          f"full for floating point (one of the families "
                          f"{', '.join(FAMILIES)}, e.g. Haswell-v4, or the Arm models "
                          f"{', '.join(ARM_FAMILIES)}; models with AVX-512 or AMX are beyond "
                          "QEMU's TCG)")
    if device.get("accelerator") != "cpu":
        raise ConfigError(f"config key {key}: an emulated CPU runs on the CPU; the device's "
                          f"accelerator is {device.get('accelerator')!r} (set accelerator: "
                          "cpu, or remove emulate)")
    why = unavailable(device.get("backend"), model)
    if why and architecture(model) == "aarch64":
        raise ConfigError(f"config key {key}: backend {device.get('backend')!r} does not "
                          f"run on the emulated Arm CPU {model}; its aarch64 userland "
                          f"holds {', '.join(AARCH64_WHEELS)} (use one of them, or an x86 "
                          "model)")
    if why:
        raise ConfigError(f"config key {key}: backend {device['backend']!r} {why}, which "
                          f"{model} lacks (its wheel is built for it); emulate a newer CPU or "
                          "use another backend")


def unavailable(backend: str | None, model: str) -> str | None:
    """Why ``backend`` cannot run on the emulated CPU ``model``, in a few words, else None:
    an instruction set its x86 wheel is built for that the CPU lacks, or a runtime the Arm
    userland does not hold."""
    if architecture(model) == "aarch64":
        return None if backend in AARCH64_WHEELS else "not in the Arm userland"
    needed = X86_NEEDS.get(backend)
    if needed and needed not in instruction_sets(model):
        return f"needs {needed.upper().replace('_', '.')}"
    return None


def python_command(device: dict, python: str = sys.executable) -> list[str]:
    """How to start ``python`` for ``device``: as is natively; under ``qemu-x86_64 -cpu
    MODEL,-feature...`` for an emulated x86 CPU, the features TCG cannot emulate (QEMU
    warns of each, none of them a float instruction set on the offered models) switched
    off, so that the CPUID the process reads claims only what runs; for an Arm CPU, the
    aarch64 root's own python under ``qemu-aarch64 -L ROOT`` (see bitdrift.emulation.aarch64)."""
    model = device.get("emulate")
    if not model:
        return [python]
    if architecture(model) == "aarch64":
        from bitdrift.emulation import aarch64

        qemu = _found(ARM_QEMU, model, "`bitdrift install-aarch64` (QEMU 10 and the Arm "
                      "userland, into this environment)")
        if aarch64.version_tuple(qemu_version(ARM_QEMU)) < aarch64.LEAST_QEMU:
            raise InferenceError(f"device key emulate: {model} needs QEMU 10 or newer "
                                 f"({qemu} is {qemu_version(ARM_QEMU)}: 7.2 crashes in LiteRT "
                                 "and ONNX Runtime); run `bitdrift install-aarch64`")
        try:
            manifest = aarch64.installed()
        except InstallError as error:
            raise InferenceError(f"device key emulate: {model}: {error}") from error
        if manifest is None:
            raise InferenceError(f"device key emulate: {model} runs in an aarch64 userland "
                                 f"that is not built ({aarch64.folder()}); run `bitdrift "
                                 "install-aarch64`")
        backend = device.get("backend")
        if backend and backend not in manifest.get("runtimes", ()):
            raise InferenceError(f"device key emulate: {model}: the aarch64 userland holds "
                                 f"{', '.join(manifest.get('runtimes', ())) or 'no runtime'}, "
                                 f"not {backend}; run `bitdrift install-aarch64`")
        if changed := aarch64.stale(manifest):
            raise InferenceError(f"device key emulate: {model}: the aarch64 userland was "
                                 f"built for other versions than this environment's "
                                 f"({'; '.join(changed)}); run `bitdrift install-aarch64`")
        root = aarch64.folder() / "root"
        return [qemu, "-cpu", model, "-L", str(root), str(root / aarch64.PYTHON)]
    qemu = _found(QEMU, model, INSTALL)
    return [qemu, "-cpu", ",".join([model, *(f"-{name}" for name in unsupported(model))]),
            python]


def _found(name: str, model: str, fix: str) -> str:
    path = qemu_path(name)
    if path is None:
        raise InferenceError(f"device key emulate: {model} needs {name}, which is neither in "
                             f"{Path(sys.prefix) / 'bin'} nor on the PATH; {fix}")
    return path


HOST_PYTHON = "BITDRIFT_HOST_PYTHON"
HOST_PYTHONPATH = "BITDRIFT_HOST_PYTHONPATH"  # the host's own PYTHONPATH, for those helpers


def environment(device: dict) -> dict:
    """What an emulated Arm device's process needs in its environment: the aarch64 site
    (its wheels and bitdrift) as its only path, and the host's python for helpers that run
    natively (LiteRT's converter needs TensorFlow, which the Arm userland lacks)."""
    model = device.get("emulate")
    if not model or architecture(model) != "aarch64":
        return {}
    from bitdrift.emulation import aarch64

    return {"PYTHONPATH": aarch64.python_path(), "PYTHONNOUSERSITE": "1",
            HOST_PYTHON: sys.executable,
            HOST_PYTHONPATH: os.environ.get("PYTHONPATH", "")}


@functools.cache
def unsupported(model: str) -> tuple[str, ...]:
    """The features of ``model`` QEMU's TCG does not support (its start-up warnings); an
    instruction set that matters for floats among them refuses the model."""
    qemu = qemu_path() or QEMU
    done = subprocess.run([qemu, "-cpu", model, "/bin/true"], capture_output=True, text=True,
                          timeout=60)
    names = tuple(dict.fromkeys(re.findall(r"TCG doesn't support requested feature: "
                                           r"CPUID\.[^ ]*?\.([a-z0-9_-]+)", done.stderr)))
    lost = [name for name in names if name.startswith(BEYOND_TCG)]
    if lost:
        raise InferenceError(f"device key emulate: QEMU's TCG cannot emulate {model}'s "
                             f"{', '.join(lost)}; it would run without them")
    return names


# Arm's part numbers (MIDR) of the emulated models, for a readable brand
ARM_PARTS = {("0x41", "0xd03"): "Cortex-A53", ("0x41", "0xd07"): "Cortex-A57",
             ("0x41", "0xd08"): "Cortex-A72", ("0x41", "0xd0b"): "Cortex-A76",
             ("0x41", "0xd0c"): "Neoverse-N1", ("0x41", "0xd40"): "Neoverse-V1",
             ("0x41", "0xd49"): "Neoverse-N2", ("0x46", "0x001"): "A64FX"}


def seen_cpu() -> dict:
    """The CPU this process sees through CPUID alone (brand, family, model, flags): under
    QEMU, the emulated one. py-cpuinfo's usual answer merges /proc/cpuinfo, which is the
    host's even under emulation of x86; QEMU's aarch64 emulation writes its own
    /proc/cpuinfo (the emulated MIDR and features), which is what an Arm process reads."""
    import platform

    if platform.machine() == "aarch64":
        return _seen_arm_cpu()
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


def _seen_arm_cpu() -> dict:
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if ":" in line:
            key, value = (part.strip() for part in line.split(":", 1))
            fields.setdefault(key, value)
    if "CPU implementer" not in fields:
        # QEMU emulates /proc/cpuinfo for aarch64 guests; without it the host's would be read
        raise InferenceError("an emulated Arm CPU: /proc/cpuinfo names no CPU implementer "
                             "(QEMU too old to emulate it?); run `bitdrift install-aarch64`")
    implementer, part = fields["CPU implementer"], fields.get("CPU part", "")
    name = ARM_PARTS.get((implementer, part), f"implementer {implementer} part {part}")
    return {"brand": f"Arm {name}", "vendor": implementer, "family": fields.get(
        "CPU architecture"), "model": part, "stepping": fields.get("CPU revision"),
        "flags": sorted(fields.get("Features", "").split())}
