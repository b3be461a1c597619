"""The published records of the study bitdrift follows (Schlögl, Hofer & Böhme 2023), as
bitdrift records, so that ``eqc``, ``precision`` and ``identify`` run on them.

The study published its per-platform results in the public repository
uibk-iNNference/unaNNticipated (MIT licence) under
``experiments/results/equivalence_classes/CLOUD/{cpu,gpu}/HOST-DEVICE-MODEL-iSAMPLE.json``:
one JSON file per (platform, model, sample) written by their
``experiments/equivalence_classes/common.py``. Each holds the final output only (no
layers) as ``prediction`` = {bytes: base64 of the raw array, dtype, shape}, the machine's
``cpu_info`` (py-cpuinfo), ``memory``, ``hostname`` and TensorFlow's ``device``; a GPU
file also holds every run's output (``all_predictions``, 10 or 20 runs) and how often the
most frequent one occurred (``count``). A CPU ran once per sample.

:func:`import_published` writes one record per (platform, model) at ``OUT/MODEL/DEVICE.h5``
(the workflow's layout), the samples under their test-set indices (0, 1, 6) and the runs
as the repeats. What the digests mean (docs/published-records.md):

- ``model_sha256`` is the SHA-256 of the model file they published, read from its Git
  LFS pointer (an LFS object is named by its content's SHA-256). It is what
  bitdrift.inputs.models.model_digest gives for that ``.h5`` file, so a record a user makes from
  the file with ``bitdrift infer`` is comparable with the imported ones.
- ``input_sha256`` is bitdrift's digest of the sample images (bitdrift.run.provenance) where
  the user gives their ``samples.npy`` (``--datasets``, checked against the published
  file's SHA-256); without it, a stand-in digest of the published file's SHA-256 and the
  sample indices, which only the imported records share.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np

from bitdrift.errors import DatasetError, RecordError

REPOSITORY = "uibk-iNNference/unaNNticipated"
COMMIT = "4de518fa8f942a0d1fefd0083bd33435a945ae33"  # the repository's one public commit
RESULTS = "experiments/results/equivalence_classes"
STUDY = ("Schlögl, Hofer & Böhme (2023): Causes and Effects of Unanticipated Numerical "
         "Deviations in Neural Network Inference Frameworks")
# Their Dockerfile: FROM tensorflow/tensorflow:2.5.0-gpu (Python 3.6.9 in every file)
TENSORFLOW = "2.5.0"
# The SHA-256 of each published file, from its Git LFS pointer at COMMIT
MODEL_FILES = {
    "cifar10_small": ("experiments/data/models/cifar10_small.h5",
                      "d6fb45617c1d857c9f6dd81241c5f62031d1a99aca65f31f16cc032cc22cbcf2"),
    "cifar10_medium": ("experiments/data/models/cifar10_medium.h5",
                       "2fabb5d7bfda269b9922f777ba75496990e1336cb4ecbbb2a05bbc78702a5208"),
    "cifar10_large": ("experiments/data/models/cifar10_large.h5",
                      "c1672f5ee281ce8a9ecd0a1b63fc61b813f912d4c6435aea2cd69be50b88ebbd"),
    "deep_weeds": ("experiments/data/models/deep_weeds.h5",
                   "97d9eb38144910f60d89f4bbc19dffd9d4e141c52eebc1502693d8d0390d20bd"),
}
SAMPLE_FILES = {
    "cifar10": ("experiments/data/datasets/cifar10/samples.npy",
                "254ea3bf40bb5fb9f2dfaf71ffb514b7f8db35586a2b87eeb1f6c1570992ca12"),
    "deep_weeds": ("experiments/data/datasets/deep_weeds/samples.npy",
                   "d38d73d5da85c17acd2523e96e1b12618b9f326e77bc2eb5dec106a68a918d9d"),
}
MODEL_SAMPLES = {"cifar10_small": "cifar10", "cifar10_medium": "cifar10",
                 "cifar10_large": "cifar10", "deep_weeds": "deep_weeds"}
KINDS = ("cpu", "gpu")
# HOST-DEVICE-MODEL-iSAMPLE.json: their save_result replaces "-" in the host name by "_";
# a GPU's name may hold "-" (Tesla_P100-PCIE-16GB), a model's never does
FILE_NAME = re.compile(r"(?P<host>[^-]+)-(?P<device>.+)-(?P<model>[^-]+)"
                       r"-i(?P<sample>0|[1-9][0-9]*)\.json")
PRECISION = "float32"


def _refuse(path: Path, what: str) -> RecordError:
    return RecordError(f"{path}: not a published record of {REPOSITORY} ({what})")


def _array(path: Path, found, key: str) -> np.ndarray:
    """Their convert_json_to_np: {bytes: base64, dtype, shape}, checked."""
    if not isinstance(found, dict) or not {"bytes", "dtype", "shape"} <= set(found):
        raise _refuse(path, f"{key!r} is not {{bytes, dtype, shape}}")
    if found["dtype"] != PRECISION:
        raise _refuse(path, f"{key!r} has dtype {found['dtype']!r}, not {PRECISION}")
    shape = found["shape"]
    if not isinstance(shape, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape):
        raise _refuse(path, f"{key!r} has shape {shape!r}")
    try:
        raw = base64.b64decode(str(found["bytes"]), validate=True)
    except (binascii.Error, ValueError) as error:
        raise _refuse(path, f"{key!r} is not base64 ({error})") from error
    if len(raw) != 4 * int(np.prod(shape)):
        raise _refuse(path, f"{key!r} holds {len(raw)} bytes, not the {4 * int(np.prod(shape))}"
                      f" of shape {shape}")
    return np.frombuffer(raw, dtype=np.float32).reshape(shape)


def read_published(path: Path) -> dict:
    """One published file: its platform, model, sample, runs (repeats, outputs) and the
    machine it describes. Anything else is one RecordError naming the file."""
    name = FILE_NAME.fullmatch(path.name)
    if name is None:
        raise _refuse(path, "the name is not HOST-DEVICE-MODEL-iSAMPLE.json")
    kind, cloud = path.parent.name, path.parent.parent.name
    if kind not in KINDS:
        raise _refuse(path, f"it is in {kind!r}, not in a folder cpu or gpu")
    if name["model"] not in MODEL_FILES:
        raise _refuse(path, f"unknown model {name['model']!r} (known: "
                      f"{', '.join(MODEL_FILES)})")
    try:
        found = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError
        raise _refuse(path, f"not readable JSON: {error}") from error
    if not isinstance(found, dict):
        raise _refuse(path, "not a JSON object")
    if found.get("model_type") != name["model"]:
        raise _refuse(path, f"model_type {found.get('model_type')!r} is not the name's "
                      f"{name['model']!r}")
    for key in ("cpu_info", "device"):
        if not isinstance(found.get(key), dict):
            raise _refuse(path, f"{key!r} is missing or not an object")
    if not isinstance(found["cpu_info"].get("flags", []), list):
        raise _refuse(path, "'cpu_info.flags' is not a list")
    if not isinstance(found["device"].get("physical_description", {}), dict):
        raise _refuse(path, "'device.physical_description' is not an object")
    prediction = _array(path, found.get("prediction"), "prediction").reshape(1, -1)
    runs = prediction
    if "all_predictions" in found:
        runs = _array(path, found["all_predictions"], "all_predictions")
        runs = runs.reshape(runs.shape[0], -1)
        # Their majority must be among the runs, as often as they say
        rows = Counter(row.tobytes() for row in runs)
        if runs.shape[1] != prediction.shape[1] or \
                rows.get(prediction.tobytes()) != found.get("count"):
            raise _refuse(path, f"'prediction' occurs {rows.get(prediction.tobytes(), 0)} "
                          f"times in 'all_predictions', the file says {found.get('count')!r}")
    return {"path": path, "cloud": cloud, "kind": kind, "host": name["host"],
            "device_name": name["device"], "model": name["model"],
            "sample": int(name["sample"]), "runs": runs, "json": found}


def device_name(cloud: str, kind: str, host: str, device: str) -> str:
    """The platform as a bitdrift device: CLOUD-KIND-HOST-DEVICE, runs of "_" made one
    (their cleaned CPU names end in "__")."""
    device = re.sub(r"_+", "_", device).strip("_")
    return f"{cloud}-{kind}-{host}-{device}"


def fingerprint(first: dict, paths: list[str]) -> dict:
    """What the published file says about its machine, in bitdrift's fingerprint layout;
    ``published`` names where it comes from."""
    found = first["json"]
    cpu = found["cpu_info"]
    device = found["device"]
    physical = device.get("physical_description") or {}
    accelerator = {} if first["kind"] == "cpu" else {
        "name": physical.get("name"), "compute_capability": physical.get("compute capability"),
        "memory_limit": device.get("memory_limit")}
    python = str(cpu.get("python_version", "")).split(".final")[0] or None
    memory = found.get("memory") if isinstance(found.get("memory"), dict) else {}
    return {
        "hostname": found.get("hostname"),
        "platform": f"{first['cloud']} {first['host']}",
        "cpu": {"brand": cpu.get("brand_raw"), "vendor": cpu.get("vendor_id_raw"),
                "family": cpu.get("family"), "model": cpu.get("model"),
                "stepping": cpu.get("stepping"), "arch": cpu.get("arch"),
                "count": cpu.get("count"), "flags": sorted(cpu.get("flags") or [])},
        "accelerator": accelerator,
        "versions": {"python": python, "tensorflow": TENSORFLOW},
        "threads": None,
        "environment": {},
        "published": {"study": STUDY, "repository": REPOSITORY, "commit": COMMIT,
                      "files": paths, "cloud": first["cloud"], "instance": first["host"],
                      "memory_total": memory.get("total"),
                      "software": "Docker image tensorflow/tensorflow:2.5.0-gpu "
                                  "(their Dockerfile)"},
    }


def input_digest(datasets: str | Path | None, model: str, indices: list[int]) -> str:
    """input_sha256 of ``model``'s samples ``indices``: bitdrift's digest of the sample
    images where ``datasets`` (their experiments/data/datasets) holds the published
    samples.npy, else the stand-in (see the module's docstring)."""
    where, published = SAMPLE_FILES[MODEL_SAMPLES[model]]
    if datasets is None:
        return hashlib.sha256(f"{REPOSITORY}@{COMMIT}:{where} sha256 {published} samples "
                              f"{sorted(indices)}".encode()).hexdigest()
    from bitdrift.inputs.datasets import file_digest, input_sha256

    path = Path(datasets) / Path(where).relative_to("experiments/data/datasets")
    if not path.is_file():
        raise DatasetError(f"{path}: missing (the samples of {model}; --datasets is their "
                           "experiments/data/datasets with the Git LFS files pulled)")
    if file_digest(path) != published:
        raise DatasetError(f"{path}: not the published {where} (its SHA-256 is not "
                           f"{published[:12]}...; a Git LFS pointer, not pulled?)")
    return input_sha256(np.load(path)[sorted(indices)])


def import_published(folder: str | Path, out: str | Path,
                     datasets: str | Path | None = None) -> list[Path]:
    """Write one record per (platform, model) of ``folder`` (laid out as their
    experiments/results/equivalence_classes) at ``out/MODEL/DEVICE.h5``; returns them.
    Every file is read and checked before any record is written."""
    from bitdrift.record.writer import write_record

    folder = Path(folder)
    if not folder.is_dir():
        raise RecordError(f"{folder}: not a folder (give their {RESULTS})")
    if (folder / RESULTS).is_dir():  # the clone itself
        raise RecordError(f"{folder}: the repository; give its {folder / RESULTS}")
    paths = sorted(folder.glob("**/*.json"))
    if not paths:
        raise RecordError(f"{folder}: no published record (*.json) in it; give their {RESULTS}")
    platforms: dict[tuple, dict[int, dict]] = {}
    for path in paths:
        if path.parent.parent.parent != folder:
            raise _refuse(path, f"not at CLOUD/{{cpu,gpu}}/FILE under {folder}")
        found = read_published(path)
        key = (found["model"], device_name(found["cloud"], found["kind"], found["host"],
                                           found["device_name"]))
        other = next(iter(platforms.get(key, {}).values()), None)
        if other is not None and other["path"].name.rpartition("-i")[0] != \
                path.name.rpartition("-i")[0]:
            raise _refuse(path, f"its platform is named {key[1]!r} as that of "
                          f"{other['path']}; two platforms would become one")
        platforms.setdefault(key, {})[found["sample"]] = found
    for model, device in platforms:
        target = Path(out) / model / f"{device}.h5"
        if target.exists():
            raise RecordError(f"{target}: exists; refusing to overwrite it (give another "
                              "--out or remove it)")
    digests: dict[tuple, str] = {}  # (model, samples) -> input_sha256
    for (model, _), by_sample in platforms.items():
        key = (model, tuple(sorted(by_sample)))
        if key not in digests:
            digests[key] = input_digest(datasets, model, list(key[1]))
    written = []
    for (model, device), by_sample in sorted(platforms.items()):
        first = by_sample[min(by_sample)]
        files = [found["path"].relative_to(folder).as_posix()
                 for _, found in sorted(by_sample.items())]
        target = Path(out) / model / f"{device}.h5"
        attrs = {
            "model": model, "device": device, "backend": "tensorflow",
            "precision": PRECISION, "fingerprint": fingerprint(first, files),
            "model_sha256": MODEL_FILES[model][1],
            "input_sha256": digests[(model, tuple(sorted(by_sample)))],
            "accelerator": first["kind"], "batch_size": 1,
            "repeats": max(found["runs"].shape[0] for found in by_sample.values()),
            "published_source": json.dumps({"repository": REPOSITORY, "commit": COMMIT,
                                            "folder": RESULTS, "files": files}),
        }
        write_record(target, attrs, {sample: {"output": found["runs"]}
                                     for sample, found in by_sample.items()})
        written.append(target)
    return written
