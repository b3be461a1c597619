"""The atlas: one small file per machine and software versions, of the reference model.

Each machine that ran the reference model (bitdrift.inputs.reference_set) on some devices leaves
an entry, a gzipped JSON file of a few kilobytes (``bitdrift atlas add RECORDS``):

    format_version       FORMAT_VERSION; a reader refuses a newer one
    reference            model_sha256, input_sha256 and samples of the records
    machine              the hardware: CPU (brand, vendor, family, model, stepping, arch,
                         flags), the accelerators the devices ran on (GPU, driver), the CPU
                         model emulated where one was (bitdrift.emulation.cpus)
    software             the OS, and the library versions of every device's runtime
    devices/<name>       config (the device's entry in the config), accelerator, layers
                         (labels in model order, the final output last), digests
                         (per sample: per layer the SHA-256 of the representative of its
                         repeats, as the classes use; 32 hex digits), outputs (per sample
                         the final output's raw bits, for the remaining precision between
                         machines), kernels (per layer the kernel signature, where traced),
                         accumulation_orders (the revealed orders, where recorded)

Records of several machines (the host and its emulated CPU generations) make one entry
per machine. Entries are compared per device (same name and configuration): machines
whose digests are all equal give the same bits; otherwise the first layer in model order
whose digest differs is where they part, and a difference between two machines of the
same hardware is named by the software versions that differ.

The entries ship with the package, beside the reference model they are of
(``bitdrift/reference_set/atlas``): a pip install compares its machine without a clone.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bitdrift.errors import ConfigError, RecordError

if TYPE_CHECKING:
    import pandas as pd

FORMAT_VERSION = 1
SUFFIX = ".json.gz"
DIGEST_HEX = 32  # 128 bits of each SHA-256: collision-free at any atlas size


def default_folder() -> Path:
    """The atlas shipped with bitdrift, beside the reference model it is of."""
    from bitdrift.inputs import reference_set

    return reference_set.FOLDER / "atlas"


class AtlasError(RecordError):
    """An atlas entry that cannot be read, or cannot be compared with the others."""


# -- making an entry ------------------------------------------------------------------------
def _hardware(fingerprint: dict) -> dict:
    cpu = fingerprint.get("cpu") or {}
    hardware = {"cpu": {key: cpu.get(key) for key in ("brand", "vendor", "family", "model",
                                                      "stepping", "arch", "flags")}}
    if "emulation" in fingerprint:
        emulation = fingerprint["emulation"]
        hardware["emulated"] = {"model": emulation.get("model"),
                                "host": emulation.get("host_brand")}
    return hardware


def _accelerator(fingerprint: dict) -> dict:
    return dict(fingerprint.get("accelerator") or {})


# What a GPU is (bitdrift.backends' check_accelerator); its driver and CUDA libraries are
# software versions, its cuDNN switches the device's settings
GPU_HARDWARE = ("accelerator", "gpu_name", "compute_capability", "gpu_count")
GPU_SOFTWARE = ("driver_version", "cuda_version", "cudnn_version")


def _is_gpu(accelerator: dict) -> bool:
    return accelerator.get("accelerator", "cpu") != "cpu"


def _software(fingerprint: dict) -> dict:
    software = {"os": fingerprint.get("platform")}
    if "emulation" in fingerprint:
        software["qemu"] = fingerprint["emulation"].get("qemu")
    return software


def machine_key(machine: dict, software: dict) -> str:
    """What one entry is of: its hardware and software, as a short digest."""
    text = json.dumps({"machine": machine, "software": software}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def machine_name(machine: dict) -> str:
    """A machine in words: its GPUs, else its CPU (the emulated model named as such)."""
    # each name once: torch and JAX describe one GPU with other fields
    gpus = list(dict.fromkeys(gpu.get("gpu_name") or "GPU" for gpu in machine.get("gpus", [])))
    found = machine["cpu"]
    cpu = found.get("brand") or "unknown CPU"
    if found.get("family") is not None:  # a brand alone ("AMD EPYC") spans generations
        cpu += f" family {found['family']} model {found.get('model')}"
    if "emulated" in machine:
        cpu = f"emulated {machine['emulated']['model']} ({cpu})"
    return " + ".join(gpus) + f" on {cpu}" if gpus else cpu


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:48] or "machine"


def _device_part(record) -> tuple[dict, dict]:
    """A record's device: its part of the entry, and the fingerprint it was made on."""
    from bitdrift.analysis.eqc import summarize_repeats
    from bitdrift.analysis.remaining_precision import integer_view

    layers, digests, outputs = None, {}, {}
    for sample in record.samples:
        infos = record.layers(sample)
        labels = [info.label for info in infos]
        if layers is None:
            layers = labels
        elif labels != layers:
            raise AtlasError(f"{record.path}: sample {sample} has layers {labels}, sample "
                             f"{record.samples[0]} has {layers}")
        per_layer = []
        for info in infos:
            # the majority of the repeats' digests (first seen among ties), as the classes
            # take the majority of their values; read without the values in format 4
            counts = Counter(record.digests(sample, info))
            per_layer.append(max(counts, key=counts.get).hex()[:DIGEST_HEX])
            # the final output's bits where the record holds its values (a sample outside
            # analysis.full_samples holds digests only)
            if info.final and record.has_values(sample, info):
                tensor = record.tensor(sample, info)
                _, representative = summarize_repeats(record.device, tensor.values,
                                                      tensor.float_format)
                bits = integer_view(representative, tensor.float_format)
                outputs[str(sample)] = {
                    "format": tensor.float_format, "shape": list(representative.shape),
                    "bits": bits.astype(bits.dtype.newbyteorder("<")).tobytes().hex()}
        digests[str(sample)] = per_layer
    config = record.json_attr("device_config", default={})
    quantization = quantized_settings(record)
    if quantization is not None:
        config = {**config, QUANTIZE_KEY: quantization}
    part = {"config": config,
            "backend": record.attr("backend"), "precision": record.precision,
            "accelerator": _accelerator(record.fingerprint),
            "versions": {**(record.fingerprint.get("versions") or {}),
                         **{key: value for key, value in
                            (record.fingerprint.get("accelerator") or {}).items()
                            if key in GPU_SOFTWARE}},
            "layers": layers, "digests": digests, "outputs": outputs}
    kernels = record.kernels
    if kernels:
        part["kernels"] = {layer: entry.get("signature", "")
                           for layer, entry in kernels.get("layers", {}).items()}
    orders = record.accumulation_orders
    if orders:
        part["accumulation_orders"] = orders
    return part, record.fingerprint


# A quantized device of an entry: the device that ran the reference model quantized
# (config key atlas.quantize), named apart from the device's float run, its configuration
# carrying the quantizer's settings and the quantized file's SHA-256 under QUANTIZE_KEY
QUANTIZED_DEVICE = "{device}+quantized"
QUANTIZE_KEY = "quantize"
# what of a record's fingerprint["quantization"] names the float model, not the settings
FLOAT_MODEL_KEYS = ("model", "model_file", "model_sha256")


def quantized_settings(record) -> dict | None:
    """How the workflow quantized the record's model (the quantizer and its settings, and
    the quantized file's SHA-256: two machines whose quantizer wrote other bytes ran other
    models); None for a record of a float model."""
    quantization = record.fingerprint.get("quantization")
    if not quantization:
        return None
    return {**{key: value for key, value in quantization.items()
               if key not in FLOAT_MODEL_KEYS},
            "model_sha256": record.attr("model_sha256")}


def entry_device(record) -> str:
    """The record's device as an entry names it: DEVICE, or DEVICE+quantized for the
    quantized reference model."""
    quantized = record.fingerprint.get("quantization")
    return QUANTIZED_DEVICE.format(device=record.device) if quantized else record.device


def float_model_digest(record) -> str | None:
    """The SHA-256 of the float model the record's model is, or was quantized from."""
    quantization = record.fingerprint.get("quantization")
    return quantization.get("model_sha256") if quantization else record.attr("model_sha256")


def entries_from_records(paths: list[str | Path]) -> list[dict]:
    """This machine's entries from its records of the reference model: one per machine
    the records were made on (the host, each emulated CPU)."""
    from bitdrift.inputs import reference_set
    from bitdrift.record.reader import open_records, read_failure

    expected = reference_set.manifest()["model"]["model_sha256"]
    if all(read_failure(path) is not None for path in paths):
        return []  # every device failed here: no entry (the failures say why)
    records = open_records(paths)
    entries: dict[str, dict] = {}
    for record in records:
        with record:
            digest = float_model_digest(record)
            if digest != expected:
                quantized = " quantized from" if record.fingerprint.get("quantization") else ""
                raise AtlasError(f"{record.path}: model{quantized} digest "
                                 f"{str(digest)[:12]}... is not the reference "
                                 f"model's {expected[:12]}... (bitdrift/reference_set); an "
                                 "atlas entry is of the reference model only")
            part, fingerprint = _device_part(record)
            device = entry_device(record)
        hardware = _hardware(fingerprint)
        software = _software(fingerprint)
        # One entry per hardware and OS: the devices' runtimes are its software versions
        key = machine_key(hardware, software)
        entry = entries.setdefault(key, {
            "format_version": FORMAT_VERSION,
            "reference": {"model_sha256": expected,
                          "input_sha256": record.attr("input_sha256"),
                          "samples": [int(s) for s in record.samples]},
            "machine": hardware, "software": software, "devices": {},
            "_paths": {}})
        if record.attr("input_sha256") != entry["reference"]["input_sha256"] or \
                [int(s) for s in record.samples] != entry["reference"]["samples"]:
            raise AtlasError(f"{record.path}: other inputs (input digest or samples) than "
                             f"{next(iter(entry['_paths'].values()))}")
        if device in entry["devices"]:
            raise AtlasError(f"{record.path}: device {device!r} twice (also "
                             f"{entry['_paths'][device]})")
        if _is_gpu(part["accelerator"]):
            gpus = entry["machine"].setdefault("gpus", [])
            gpu = {k: v for k, v in part["accelerator"].items() if k in GPU_HARDWARE}
            if gpu not in gpus:
                gpus.append(gpu)
        entry["devices"][device] = part
        entry["_paths"][device] = str(record.path)
    found = []
    for entry in entries.values():
        del entry["_paths"]
        entry["software"]["versions"] = _agreed_versions(entry["devices"])
        found.append(entry)
    return found


def _agreed_versions(devices: dict) -> dict:
    """The versions every device that reports a library agrees on; a setting a device
    reports among its versions (torch_deterministic, tensorflow_onednn) that differs
    between devices stays with the device."""
    seen: dict[str, set] = {}
    for part in devices.values():
        for library, version in part["versions"].items():
            seen.setdefault(library, set()).add(json.dumps(version))
    return {library: json.loads(next(iter(values))) for library, values in sorted(seen.items())
            if len(values) == 1}


def merged(old: dict, new: dict, path) -> dict:
    """The entry ``old`` (at ``path``) with the devices of ``new``, an entry of the same
    machine and versions and of the same inputs: a device of both is refused."""
    if old["reference"] != new["reference"]:
        raise AtlasError(f"{path}: an entry of other inputs (input digest or samples); "
                         "not merged")
    both = sorted(old["devices"].keys() & new["devices"].keys())
    if both:
        raise AtlasError(f"{path}: already holds device(s) {', '.join(both)}; not merged "
                         "(--replace replaces the entry)")
    devices = {**old["devices"], **new["devices"]}
    machine = dict(old["machine"])
    gpus = [*old["machine"].get("gpus", []),
            *(gpu for gpu in new["machine"].get("gpus", [])
              if gpu not in old["machine"].get("gpus", []))]
    if gpus:
        machine["gpus"] = gpus
    return {**old, "machine": machine, "devices": devices,
            "software": {**old["software"], "versions": _agreed_versions(devices)}}


def entry_key(entry: dict) -> str:
    """The entry's machine and software versions, as a short digest (its file name ends
    with it)."""
    return machine_key(entry["machine"], entry["software"])


def same_machine_and_versions(a: dict, b: dict) -> bool:
    """Two entries of one machine (hardware and OS) whose libraries are of the same
    versions wherever both name one: the same measurement twice (an entry of fewer devices
    names fewer libraries)."""
    if a["machine"] != b["machine"] or \
            {k: v for k, v in a["software"].items() if k != "versions"} != \
            {k: v for k, v in b["software"].items() if k != "versions"}:
        return False
    ours, theirs = a["software"].get("versions", {}), b["software"].get("versions", {})
    return all(ours[name] == theirs[name] for name in ours.keys() & theirs.keys())


def entry_file_name(entry: dict) -> str:
    return f"{_slug(machine_name(entry['machine']))}-{entry_key(entry)}{SUFFIX}"


def encode(entry: dict) -> bytes:
    # mtime=0: the same entry is the same bytes, whenever it is written
    return gzip.compress(json.dumps(entry, sort_keys=True, separators=(",", ":")).encode(),
                         mtime=0)


def add(paths: list[str | Path], folder: str | Path, replace: bool = False,
        merge: bool = False) -> list[tuple[Path, dict]]:
    """Write this machine's entries (one per machine the records were made on) into the
    atlas ``folder``; an entry of the same machine and versions is never overwritten
    unless ``replace``; ``merge`` adds the records' devices to it (devices it has not)."""
    from bitdrift.atomic import write_bytes

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--atlas {folder}: not a folder")
    entries = entries_from_records(paths)
    existing = []
    if folder.is_dir():
        for path in sorted(folder.glob(f"*{SUFFIX}")):
            try:
                existing.append((path, read_entry(path)))
            except AtlasError:
                continue  # a damaged entry is refused where it is read, not here
    written = []
    for entry in entries:
        target = folder / entry_file_name(entry)
        old = [path for path, other in existing if same_machine_and_versions(entry, other)]
        if target.exists() and target not in old:
            old.append(target)
        if old and merge:
            entry = merged(read_entry(old[0]), entry, old[0])
            target = folder / entry_file_name(entry)  # its versions may name more libraries
        elif old and not replace:
            raise AtlasError(f"{old[0]}: the atlas already holds this machine and these "
                             f"versions ({machine_name(entry['machine'])}); not overwritten "
                             "(--replace replaces it)")
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes(target, encode(entry))
        for path in old:
            if path != target:
                path.unlink()
        written.append((target, entry))
    return written


# -- reading --------------------------------------------------------------------------------
def _check(entry, path: Path, expected_model: str | None) -> dict:
    def wrong(what: str) -> AtlasError:
        return AtlasError(f"{path}: not an atlas entry ({what})")

    if not isinstance(entry, dict):
        raise wrong("not a JSON object")
    version = entry.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise wrong("no integer 'format_version'")
    if version > FORMAT_VERSION:
        raise AtlasError(f"{path}: atlas entry of format {version}, newer than this "
                         f"bitdrift reads ({FORMAT_VERSION}); update bitdrift")
    for key, kind in (("reference", dict), ("machine", dict), ("software", dict),
                      ("devices", dict)):
        if not isinstance(entry.get(key), kind):
            raise wrong(f"'{key}' is missing or not an object")
    model = entry["reference"].get("model_sha256")
    if expected_model is not None and model != expected_model:
        raise AtlasError(f"{path}: an entry of model digest {str(model)[:12]}..., not the "
                         f"reference model's {expected_model[:12]}...; its bits are not "
                         "comparable")
    if not isinstance(entry["machine"].get("cpu"), dict):
        raise wrong("'machine' has no 'cpu' object")
    if not isinstance(entry["software"].get("versions", {}), dict):
        raise wrong("'software/versions' is not an object")
    samples = [str(s) for s in entry["reference"].get("samples", [])]
    for name, part in entry["devices"].items():
        if not isinstance(part, dict) or not isinstance(part.get("layers"), list) or \
                not all(isinstance(part.get(key), dict)
                        for key in ("digests", "outputs", "config", "versions")):
            raise wrong(f"device {name!r} lacks layers, digests, outputs, config or versions")
        for sample in samples:
            digests = part["digests"].get(sample)
            if not isinstance(digests, list) or len(digests) != len(part["layers"]) or \
                    not all(isinstance(d, str) for d in digests):
                raise wrong(f"device {name!r}: sample {sample}'s digests are not one per "
                            "layer")
            if sample not in part["outputs"]:
                continue  # recorded as digests only: no remaining precision there
            output = part["outputs"][sample]
            if not isinstance(output, dict) or not isinstance(output.get("bits"), str) or \
                    output.get("format") not in ("float16", "bfloat16", "float32", "float64"):
                raise wrong(f"device {name!r}: sample {sample}'s output is not "
                            "{format, shape, bits}")
            try:
                size = len(bytes.fromhex(output["bits"]))
            except ValueError:
                size = -1
            width = 8 if output["format"] == "float64" else \
                4 if output["format"] == "float32" else 2
            shape = output.get("shape")
            if not isinstance(shape, list) or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape) \
                    or size != width * int(np.prod(shape)):
                raise wrong(f"device {name!r}: sample {sample}'s output bits are not hex of "
                            "its shape and format")
    return entry


def read_entry(path: str | Path, expected_model: str | None = None) -> dict:
    """One entry, checked; refused with one line (AtlasError) when it cannot be read."""
    path = Path(path)
    try:
        text = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error) as error:
        raise AtlasError(f"{path}: not a readable atlas entry (damaged or truncated gzip: "
                         f"{error})") from error
    try:
        entry = json.loads(text)
    except ValueError as error:
        raise AtlasError(f"{path}: not a readable atlas entry (not JSON: {error})") from error
    return _check(entry, path, expected_model)


@dataclass
class Atlas:
    """The entries of an atlas folder that could be read, and a line for each that could
    not (the comparison goes on without it)."""

    entries: dict[str, dict] = field(default_factory=dict)  # file name -> entry
    refused: list[str] = field(default_factory=list)


def read_atlas(folder: str | Path, expected_model: str | None = None) -> Atlas:
    """Every entry of ``folder`` of the reference model; one line per entry refused: a
    newer format, a damaged or truncated file, another model digest, a second entry of
    one machine and versions (the later by name)."""
    from bitdrift.inputs import reference_set

    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"--atlas {folder}: no such folder")
    if expected_model is None:
        expected_model = reference_set.manifest()["model"]["model_sha256"]
    atlas = Atlas()
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        try:
            entry = read_entry(path, expected_model)
        except AtlasError as error:
            atlas.refused.append(str(error))
            continue
        twin = next((name for name, other in atlas.entries.items()
                     if same_machine_and_versions(entry, other)), None)
        if twin is not None:
            atlas.refused.append(f"{path}: a second entry of one machine and versions (also "
                                 f"{folder / twin}); left out")
            continue
        atlas.entries[path.name] = entry
    return atlas


# -- comparing ------------------------------------------------------------------------------
THIS_MACHINE = "this machine"


def output_values(output: dict) -> tuple[np.ndarray, str]:
    """An entry's final output as raw bits (unsigned integers) and its float format."""
    from bitdrift.analysis.remaining_precision import INTEGER_VIEW

    kind = np.dtype(INTEGER_VIEW[output["format"]]).newbyteorder("<")
    return np.frombuffer(bytes.fromhex(output["bits"]), kind).astype(kind.newbyteorder("=")), \
        output["format"]


def _dropped(a: dict, b: dict) -> int | None:
    """Low bits of the final outputs two devices disagree in, over the shared samples."""
    from bitdrift.analysis.remaining_precision import bit_length

    worst, shared = 0, a["outputs"].keys() & b["outputs"].keys()
    if not shared:
        return None
    for sample in shared:
        (x, fx), (y, fy) = output_values(a["outputs"][sample]), output_values(b["outputs"][sample])
        if fx != fy or x.shape != y.shape:
            return None
        if x.size:
            worst = max(worst, int(bit_length(np.bitwise_xor(x, y)).max()))
    return worst


def version_differences(a: dict, b: dict) -> dict[str, tuple]:
    """The versions (and runtime settings) two devices' machines differ in, of those that
    can change arithmetic (bitdrift.atlas.machines.arithmetic): {name: (a's, b's)}."""
    from bitdrift.atlas.machines import arithmetic

    ours, theirs = arithmetic(a["versions"]), arithmetic(b["versions"])
    return {name: (ours.get(name), theirs.get(name))
            for name in sorted(ours.keys() | theirs.keys())
            if ours.get(name) != theirs.get(name)}


@dataclass
class Row:
    device: str
    machine: str  # entry file name (an identifier, never shown as a name), or THIS_MACHINE
    name: str  # what the device ran on, in words: the GPU, else the (host) CPU
    cls: int  # class of this device across machines, numbered by first appearance
    same_as_this: bool | None  # None: this machine did not run the device
    first_difference: str  # first layer (model order) whose digest differs from this one
    difference: str  # hardware / software (versions named) / hardware and software
    remaining_precision: float | None  # final outputs against this machine's, in bits
    label: str = ""  # the machine in words (bitdrift.atlas.machines.machine_label)
    # the versions of the machine that can change arithmetic and differ from this
    # machine's, named once per machine ("torch 2.11.0+cu130 (here 2.13.0+cpu)")
    differs: str = ""


# Config keys of a device that say where it runs, not what it computes: an emulated CPU is
# the entry's machine, and scheduling is the cluster's
NOT_SETTINGS = ("emulate", "external", "resources")


def settings(part: dict) -> dict:
    """A device's configuration as compared across machines."""
    return {key: value for key, value in part["config"].items() if key not in NOT_SETTINGS}


def _first_difference(a: dict, b: dict) -> str:
    if a["layers"] != b["layers"]:
        return "layers differ"
    for position, layer in enumerate(a["layers"]):
        for sample in sorted(a["digests"].keys() & b["digests"].keys(), key=int):
            if a["digests"][sample][position] != b["digests"][sample][position]:
                return layer
    return ""


def _software_differences(a_entry: dict, a: dict, b_entry: dict, b: dict) -> dict:
    """{name: (a's, b's)}: the versions of two machines' runs of a device that can change
    arithmetic: the runtime's, the driver's, the C library (arithmetic_os), and QEMU's
    where both were emulated."""
    versions = version_differences(a, b)
    ours, theirs = (arithmetic_os(entry["software"].get("os")) for entry in (a_entry, b_entry))
    for name in dict.fromkeys([*ours, *theirs]):
        if ours.get(name) != theirs.get(name):
            versions[name] = (ours.get(name), theirs.get(name))
    qemu = [str(entry["software"].get("qemu") or "").split(" ")[0] for entry in (a_entry, b_entry)]
    if all(qemu) and qemu[0] != qemu[1]:
        versions["qemu"] = tuple(qemu)
    return versions


def _entry_software(entry: dict) -> dict:
    """An entry's software that can change arithmetic: the versions every device agrees
    on, the C library, QEMU."""
    from bitdrift.atlas.machines import arithmetic

    software = entry["software"]
    return {**arithmetic(software.get("versions", {})), **arithmetic_os(software.get("os")),
            **({"qemu": str(software["qemu"]).split(" ")[0]} if software.get("qemu") else {})}


def _labels(machines: list[tuple[str, dict]]) -> dict[str, str]:
    """{machine: label}; entries of one hardware (other versions) told apart by the
    versions they differ in, else numbered."""
    from bitdrift.atlas.machines import brand_words, machine_label

    labels = {name: machine_label(entry["machine"]) for name, entry in machines
              if name != THIS_MACHINE}
    entries = dict(machines)
    for label in {label for label in labels.values() if list(labels.values()).count(label) > 1}:
        group = [name for name in labels if labels[name] == label]
        # one CPU emulated on hosts of other brands: told apart by the host
        hosts = {name: (entries[name]["machine"].get("emulated") or {}).get("host")
                 for name in group}
        if None not in hosts.values() and len(set(hosts.values())) == len(group):
            for name in group:
                labels[name] = f"{label} on {brand_words({'brand': hosts[name]})}"
            continue
        software = {name: _entry_software(entries[name]) for name in group}
        keys = sorted({key for found in software.values() for key in found
                       if len({json.dumps(s.get(key)) for s in software.values()}) > 1})
        for number, name in enumerate(group, 1):
            apart = ", ".join(f"{key} {software[name].get(key)}" for key in keys)
            labels[name] = f"{label}, {apart}" if apart else f"{label} ({number})"
    this = next((entry for name, entry in machines if name == THIS_MACHINE), None)
    if this is not None:
        labels[THIS_MACHINE] = machine_label(this["machine"])
    return labels


def compare(this: list[dict] | None, atlas: Atlas) -> list[Row]:
    """Per device (name and configuration), the class of every machine across the
    machines: this machine's entries first, on the devices it ran (``this`` None: the
    atlas's entries among themselves, on every device)."""
    from bitdrift.analysis.remaining_precision import MANTISSA_BITS
    from bitdrift.atlas.machines import processor

    machines = [(THIS_MACHINE, entry) for entry in this or []] + list(atlas.entries.items())
    labels = _labels(machines)
    devices: dict[str, None] = {}
    for _, entry in machines[:len(this)] if this else machines:
        devices.update(dict.fromkeys(entry["devices"]))
    rows = []
    differs: dict[str, dict] = {}  # machine -> {name: (this machine's, its)}
    for device in devices:
        runs = [(label, entry, entry["devices"][device]) for label, entry in machines
                if device in entry["devices"]]
        own = next((run for run in runs if run[0] == THIS_MACHINE), None)
        classes: dict[str, int] = {}
        for label, entry, part in runs:
            # configured otherwise: another device under the same name, its own class
            signature = json.dumps([settings(part), part["layers"], part["digests"]],
                                   sort_keys=True)
            cls = classes.setdefault(signature, len(classes) + 1)
            if own is None:
                same, first, difference, remaining = None, "", "", None
            else:
                _, own_entry, own_part = own
                configured = settings(own_part) == settings(part)
                same = configured and own_part["layers"] == part["layers"] and \
                    _first_difference(own_part, part) == ""
                first = "" if same else (
                    _first_difference(own_part, part) if configured
                    else "configured otherwise")
                versions = _software_differences(own_entry, own_part, entry, part)
                difference = _kind_of_difference(
                    own_entry["machine"] != entry["machine"], versions)
                if label != THIS_MACHINE:
                    differs.setdefault(label, {}).update(versions)
                dropped = _dropped(own_part, part)
                remaining = None if dropped is None else float(max(
                    MANTISSA_BITS[next(iter(part["outputs"].values()))["format"]] - dropped,
                    0))
            rows.append(Row(device, label, processor(entry["machine"], part), cls, same, first,
                            difference, remaining, label=labels[label]))
    for row in rows:
        row.differs = ", ".join(_versus(name, ours, theirs)
                                for name, (ours, theirs) in differs.get(row.machine, {}).items())
    return rows


def _versus(name: str, ours, theirs) -> str:
    """A version of another machine against this machine's: "torch 2.11.0 (here 2.13.0)";
    the C library's value names it ("glibc 2.39 (here 2.36)")."""
    if name == "libc" and ours and theirs and str(ours).split()[0] == str(theirs).split()[0]:
        return f"{theirs} (here {str(ours).split(maxsplit=1)[-1]})"
    return f"{name} {theirs} (here {'none' if ours is None else ours})"


def arithmetic_os(platform: str | None) -> dict[str, str]:
    """What of the OS (the fingerprint's ``platform``, Python's platform.platform()) can
    change a result: the system, and on Linux the C library (its libm computes the
    transcendental functions some runtimes call), not the kernel release or its build
    string (``Linux-6.18.44-fc-v657-x86_64-with-glibc2.36``: a kernel does no arithmetic for
    a process, and a machine's kernel build changes with every host update); elsewhere
    the OS release, whose system libraries hold the math library (macOS's libm and
    Accelerate, Windows' UCRT). The architecture is the hardware's."""
    if not platform:
        return {}
    system, _, rest = str(platform).partition("-")
    if system != "Linux":
        return {"os": system + (f" {rest.split('-')[0]}" if rest else "")}
    libc = re.search(r"-with-([a-z]+?)(\d[\d.]*)$", platform)
    return {"os": system, **({"libc": f"{libc[1]} {libc[2]}"} if libc else {})}


def _kind_of_difference(hardware: bool, versions: dict[str, tuple]) -> str:
    """What differs between two machines' runs of a device: the hardware (``hardware``:
    the machines differ), and the software versions named (_software_differences)."""
    named = ", ".join(f"{name} {old} vs {new}" for name, (old, new) in versions.items())
    if hardware and versions:
        return f"other hardware and software ({named})"
    if hardware:
        return "other hardware"
    if versions:
        return f"software only, same hardware ({named})"
    return "none"


# atlas.csv: the readable columns first (the report shows the table as it is), the entry's
# file name (an identifier) last
ROW_COLUMNS = ("device", "label", "name", "same_bits_as_this_machine", "first_differing_layer",
               "remaining_precision", "differs", "class", "difference", "machine")


def rows_table(rows: list[Row]):
    import pandas as pd

    return pd.DataFrame([(r.device, r.label, r.name, r.same_as_this, r.first_difference,
                          r.remaining_precision, r.differs, r.cls, r.difference, r.machine)
                         for r in rows], columns=list(ROW_COLUMNS))


# What a cell of the machines x devices table says (cell_text); NOT_RUN where a machine did
# not run the device
SAME_BITS = "same bits"
NOT_RUN = "not run"
CONFIGURED_OTHERWISE = "configured otherwise"


def cell_text(row: Row) -> str:
    """A machine's run of a device against this machine's, in a few words: "same bits",
    or where it parts and the mantissa bits the final outputs still share ("parts at
    `conv2d`, 15 bits left")."""
    if row.same_as_this or row.machine == THIS_MACHINE:
        return SAME_BITS
    if row.first_difference == CONFIGURED_OTHERWISE:
        return CONFIGURED_OTHERWISE
    where = "other layers" if row.first_difference == "layers differ" else \
        f"parts at `{row.first_difference}`"
    left = "final outputs not comparable" if row.remaining_precision is None else \
        f"{row.remaining_precision:g} bits left"
    return f"{where}, {left}"


def machine_order(rows: list[Row]) -> list[str]:
    """The machines of ``rows``: this machine first, then the real machines, then the
    emulated ones, each by label."""
    from bitdrift.atlas.machines import EMULATED

    labels = {row.machine: row.label for row in rows}
    return sorted(labels, key=lambda machine: (
        machine != THIS_MACHINE, labels[machine].startswith(EMULATED), labels[machine]))


def machines_by_devices(rows: list[Row]):
    """The other machines (rows, by label) by this machine's devices (columns): each
    cell's text (cell_text; NOT_RUN where the machine did not run the device), and the
    column "versions that differ" (Row.differs)."""
    import pandas as pd

    devices = list(dict.fromkeys(row.device for row in rows if row.machine == THIS_MACHINE))
    cells = {(row.machine, row.device): cell_text(row) for row in rows}
    found = []
    for machine in machine_order(rows):
        if machine == THIS_MACHINE:
            continue
        row = next(r for r in rows if r.machine == machine)
        found.append([row.label, *(cells.get((machine, device), NOT_RUN) for device in devices),
                      row.differs or "none"])
    return pd.DataFrame(found, columns=[MACHINE_COLUMN, *devices, DIFFERS_COLUMN])


MACHINE_COLUMN = "machine"
DIFFERS_COLUMN = "versions that differ from this machine's"


def agreeing(rows: list[Row]) -> list[str]:
    """The labels of the other machines that give this machine's bits on every device
    both ran."""
    return [next(r.label for r in rows if r.machine == machine)
            for machine in machine_order(rows) if machine != THIS_MACHINE
            and all(r.same_as_this for r in rows if r.machine == machine)]


def rows_from_table(table) -> list[Row]:
    """The rows of an atlas table (``rows_table``), as written to CSV and read back."""
    def optional(value):
        return None if value is None or (isinstance(value, float) and np.isnan(value)) \
            else value

    def text(value) -> str:
        return "" if optional(value) is None else str(value)

    return [Row(str(row["device"]), str(row["machine"]), str(row["name"]), int(row["class"]),
                None if optional(row["same_bits_as_this_machine"]) is None
                else str(row["same_bits_as_this_machine"]).lower() == "true",
                text(row["first_differing_layer"]), text(row["difference"]),
                None if optional(row["remaining_precision"]) is None
                else float(row["remaining_precision"]),
                # a table of an earlier bitdrift has no label: the device's processor
                label=text(row.get("label", row["name"])), differs=text(row.get("differs")))
            for _, row in table.iterrows()]


REFUSED_COLUMNS = ("entry", "reason")


def compare_records(paths: list[str | Path], atlas: Atlas, table=None, refused_table=None,
                    ) -> pd.DataFrame:
    """This machine (its records of the reference model) among the atlas's machines: the
    table (rows_table; empty where no device ran the reference model here) and the refused
    entries, written where asked; the table returned (bitdrift.report.findings.atlas says it
    in words, bitdrift.report.figures.machines draws it)."""
    import pandas as pd

    from bitdrift.atomic import write_csv

    this = entries_from_records(paths)
    # no device ran the reference model here (every record a failure record): no rows
    found = rows_table(compare(this, atlas) if this else [])
    if table:
        write_csv(found, table)
    if refused_table:
        write_csv(pd.DataFrame([(line.split(": ", 1)[0], line.split(": ", 1)[-1])
                                  for line in atlas.refused], columns=list(REFUSED_COLUMNS)),
                    refused_table)
    return found


@dataclass
class Identified:
    matched: bool
    machines: dict[str, list[str]]  # "machine name [entry]" -> devices
    remaining_precision: float


def identify(path: str | Path, atlas: Atlas) -> Identified:
    """The atlas's machines and devices whose every layer and sample gives the record's
    bits; else those nearest by the remaining precision of the final output."""
    from bitdrift.analysis.remaining_precision import MANTISSA_BITS

    (entry,) = entries_from_records([path])
    (part,) = entry["devices"].values()
    exact, nearest, best = {}, {}, None
    for name, other in atlas.entries.items():
        label = f"{machine_name(other['machine'])} [{name}]"
        for device, candidate in other["devices"].items():
            if candidate["layers"] == part["layers"] and \
                    candidate["digests"] == part["digests"]:
                exact.setdefault(label, []).append(device)
                continue
            dropped = _dropped(part, candidate)
            if dropped is None or not candidate["outputs"].keys() & part["outputs"].keys():
                continue
            if best is None or dropped < best:
                best, nearest = dropped, {}
            if dropped == best:
                nearest.setdefault(label, []).append(device)
    if exact:  # bitwise equal: the whole mantissa of the record's format remains
        form = next(iter(part["outputs"].values()), {"format": part["precision"]})["format"]
        return Identified(True, exact, float(MANTISSA_BITS.get(form, 0)))
    if best is None:
        raise AtlasError(f"{path}: no entry of the atlas holds a final output of its format "
                         "and samples")
    mantissa = MANTISSA_BITS[next(iter(part["outputs"].values()))["format"]]
    return Identified(False, nearest, float(max(mantissa - best, 0)))

