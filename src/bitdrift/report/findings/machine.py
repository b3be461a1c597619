"""The machine section: the CPU a record's process saw, the instruction sets that steer the
kernels (x86 and Arm), and the devices that ran under QEMU."""

from __future__ import annotations

# CPU flags (py-cpuinfo's names) that decide which kernels oneDNN, OpenBLAS, MLAS, XNNPACK
# and OpenVINO pick, in the order of their generations.
INSTRUCTION_SETS = [("SSE4.1", ("sse4_1",)), ("AVX", ("avx",)), ("AVX2", ("avx2",)),
                    ("FMA", ("fma",)), ("AVX-512", ("avx512f",)),
                    ("AVX512_VNNI", ("avx512_vnni", "avx512vnni")),
                    ("AVX512_BF16", ("avx512_bf16",)), ("AVX512_FP16", ("avx512_fp16",)),
                    ("AMX", ("amx_bf16", "amx_tile"))]
# The same for Arm (the Features of /proc/cpuinfo): NEON, half-precision arithmetic, dot
# product, SVE, SVE2, BF16
ARM_INSTRUCTION_SETS = [("NEON", ("asimd",)), ("FP16", ("asimdhp",)), ("DOTPROD", ("asimddp",)),
                        ("SVE", ("sve",)), ("SVE2", ("sve2",)), ("BF16", ("bf16",)),
                        ("I8MM", ("i8mm",))]


def instruction_sets(cpu: dict) -> list[tuple[str, tuple]]:
    """The sets that matter on ``cpu``'s architecture."""
    return ARM_INSTRUCTION_SETS if str(cpu.get("arch", "")).upper() in ("AARCH64", "ARM_8") \
        else INSTRUCTION_SETS


def machine(fingerprint: dict) -> list[str]:
    """Sentences naming the CPU and the instruction sets that matter, from a record's
    fingerprint (what the device's process saw)."""
    cpu = fingerprint.get("cpu") or {}
    flags = set(cpu.get("flags") or [])
    have = [name for name, names in instruction_sets(cpu) if flags & set(names)]
    lack = [name for name, names in instruction_sets(cpu) if not flags & set(names)]
    lines = [f"CPU: {cpu.get('brand') or 'unknown'} ({cpu.get('vendor') or '?'}, family "
             f"{cpu.get('family')}, model {cpu.get('model')}; {cpu.get('count')} CPUs, "
             f"{cpu.get('arch')}) on {fingerprint.get('platform', '?')}.",
             f"Instruction sets that steer the kernels: {', '.join(have) or 'none'}"
             + (f"; not present: {', '.join(lack)}." if lack else ".")]
    return lines


def emulated(fingerprints: dict) -> list[str]:
    """The devices that ran under QEMU, grouped by the CPU they saw, with its instruction
    sets."""
    groups: dict[tuple, list[str]] = {}
    for device, found in fingerprints.items():
        emulation = found.get("emulation")
        if not emulation:
            continue
        cpu = found.get("cpu") or {}
        flags = set(cpu.get("flags") or [])
        have = [name for name, names in instruction_sets(cpu) if flags & set(names)]
        key = (emulation.get("model"), (found.get("cpu") or {}).get("brand"),
               ", ".join(have) or "none of the sets above",
               str(emulation.get("qemu", "")).split(" ")[0])
        groups.setdefault(key, []).append(device)
    return [f"Emulated by QEMU {qemu} as {model} ({brand}; it saw {sets}): "
            f"{', '.join(devices)}." for (model, brand, sets, qemu), devices in groups.items()]
