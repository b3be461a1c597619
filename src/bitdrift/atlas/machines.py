"""The atlas's machines in words: a readable label per machine (its CPU model, its GPUs,
emulated or real), the processor a device ran on, the software versions that can change
a device's arithmetic, and the list of machines docs/atlas.md shows.

A label never holds an entry's file name or digest: "AMD EPYC Zen 4 (fam 25 model 17)",
"Intel Xeon Emerald Rapids (fam 6 model 207) with NVIDIA H100 80GB HBM3", "emulated Intel
Core Haswell (fam 6 model 60)". A GPU machine's CPU devices ran on its host CPU, so a
machine's label leads with its CPU and a CPU device's processor is that CPU, never the GPU.
"""

from __future__ import annotations

import re
from pathlib import Path

# The microarchitecture of the x86 CPU models the atlas holds or that are common in
# servers, by (vendor, family, model) as CPUID reports them; a model not here is named by
# its brand and numbers alone.
MICROARCHITECTURES = {
    ("GenuineIntel", 6, 42): "Sandy Bridge", ("GenuineIntel", 6, 45): "Sandy Bridge-EP",
    ("GenuineIntel", 6, 58): "Ivy Bridge", ("GenuineIntel", 6, 60): "Haswell",
    ("GenuineIntel", 6, 63): "Haswell-EP", ("GenuineIntel", 6, 79): "Broadwell-EP",
    ("GenuineIntel", 6, 85): "Skylake-SP or Cascade Lake", ("GenuineIntel", 6, 94): "Skylake",
    ("GenuineIntel", 6, 106): "Ice Lake-SP", ("GenuineIntel", 6, 143): "Sapphire Rapids",
    ("GenuineIntel", 6, 207): "Emerald Rapids", ("GenuineIntel", 6, 173): "Granite Rapids",
    ("AuthenticAMD", 23, 1): "Zen 1", ("AuthenticAMD", 23, 49): "Zen 2",
    ("AuthenticAMD", 25, 1): "Zen 3", ("AuthenticAMD", 25, 17): "Zen 4",
    ("AuthenticAMD", 26, 2): "Zen 5",
}
EMULATED = "emulated"
# A brand's words that name no model: trade marks, "CPU", "Processor", the clock, and
# QEMU's notes in parentheses ("(Haswell, no TSX, IBRS)": the microarchitecture is named
# from the numbers instead)
_NOISE = re.compile(r"\((?:R|TM|tm)\)|\bCPU\b|\bProcessor\b|@.*$|\(.*?\)")


def brand_words(cpu: dict) -> str:
    """A CPU brand without the words that name no model ("Intel Xeon")."""
    brand = _NOISE.sub(" ", str(cpu.get("brand") or "unknown CPU"))
    return " ".join(brand.split()) or "unknown CPU"


def _number(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def cpu_label(cpu: dict) -> str:
    """A CPU model in words: brand, microarchitecture where known, family and model
    (x86: "AMD EPYC Zen 4 (fam 25 model 17)"); an Arm CPU by its brand (its family is the
    architecture's version, its model a part number)."""
    brand = brand_words(cpu)
    family, model = _number(cpu.get("family")), _number(cpu.get("model"))
    if family is None or model is None or not str(cpu.get("arch") or "X86").upper().startswith(
            ("X86", "AMD64", "I686")):
        return brand
    micro = MICROARCHITECTURES.get((cpu.get("vendor"), family, model))
    named = f"{brand} {micro}" if micro and micro.split()[0] not in brand else brand
    return f"{named} (fam {family} model {model})"


def gpu_names(machine: dict) -> list[str]:
    # each name once: torch and JAX describe one GPU with other fields
    return list(dict.fromkeys(gpu.get("gpu_name") or "GPU" for gpu in machine.get("gpus", [])))


def host_label(machine: dict) -> str:
    """The machine's CPU: the emulated model named as such."""
    return (f"{EMULATED} " if "emulated" in machine else "") + cpu_label(machine["cpu"])


def machine_label(machine: dict) -> str:
    """A machine in words: its CPU (emulated or real), then its GPUs."""
    gpus = gpu_names(machine)
    return host_label(machine) + (f" with {' and '.join(gpus)}" if gpus else "")


def processor(machine: dict, part: dict) -> str:
    """What a device of the machine ran on: its GPU for a GPU device, else the host CPU."""
    accelerator = part.get("accelerator") or {}
    if accelerator.get("accelerator", "cpu") != "cpu":
        return accelerator.get("gpu_name") or " and ".join(gpu_names(machine)) or "GPU"
    return host_label(machine)


def is_emulated(machine: dict) -> bool:
    return "emulated" in machine


# What a fingerprint's versions hold that computes nothing of the model: the interpreter,
# the arrays the record is read into, the HDF5 library. Everything else there is the
# device's runtime (its version and the settings it reports, bitdrift.backends' versions()),
# the GPU's driver, CUDA and cuDNN, and can change a bit.
NOT_ARITHMETIC = ("python", "numpy", "h5py")


def arithmetic(versions: dict) -> dict:
    """The versions (and runtime settings) that can change a device's arithmetic."""
    return {name: value for name, value in versions.items() if name not in NOT_ARITHMETIC}


# -- the list of machines in docs/atlas.md --------------------------------------------------
LIST_BEGIN = "<!-- the machines, generated from the entries: bitdrift atlas list --doc " \
    "docs/atlas.md -->"
LIST_END = "<!-- end of the generated list -->"


def machines_list(entries: dict[str, dict], folder: str | Path) -> list[str]:
    """The atlas's machines as a Markdown table (``entries``: file name -> entry, as
    bitdrift.atlas.entries.read_atlas gives them from ``folder``): label, real or
    emulated, the devices, the entry's size and file."""
    rows = []
    for name, entry in entries.items():
        machine = entry["machine"]
        emulated = machine.get("emulated")
        host = brand_words({"brand": emulated.get("host")}) if emulated else ""
        how = "real" if not emulated else (
            f"emulated: `{emulated.get('model')}` under QEMU "
            f"{str(entry['software'].get('qemu') or '?').split()[0]} on {host}")
        devices = sorted(entry["devices"])
        shown = ", ".join(f"`{device}`" for device in devices) if len(devices) <= 3 else \
            f"{len(devices)} devices"
        size = (Path(folder) / name).stat().st_size / 1024
        rows.append((is_emulated(machine), machine_label(machine), how, shown, size, name))
    lines = ["| machine | real or emulated | devices | size | entry |", "|---|---|---|---|---|"]
    lines += [f"| {label} | {how} | {shown} | {size:.0f} KiB | `{name}` |"
              for _, label, how, shown, size, name in sorted(rows)]
    return lines


def replace_list(text: str, lines: list[str], where: str) -> str:
    """``text`` (a document) with the lines between LIST_BEGIN and LIST_END replaced."""
    begin, end = text.find(LIST_BEGIN), text.find(LIST_END)
    if begin < 0 or end < begin:
        from bitdrift.errors import ConfigError

        raise ConfigError(f"{where}: no list of machines to replace (the lines "
                          f"{LIST_BEGIN!r} and {LIST_END!r})")
    return text[:begin] + "\n".join([LIST_BEGIN, *lines, LIST_END]) + \
        text[end + len(LIST_END):]


def listed(text: str) -> list[str]:
    """The lines between LIST_BEGIN and LIST_END of a document (empty: none)."""
    begin, end = text.find(LIST_BEGIN), text.find(LIST_END)
    if begin < 0 or end < begin:
        return []
    return text[begin + len(LIST_BEGIN):end].strip("\n").splitlines()
