"""A minimal reproduction of one split between two devices, for the upstream bug report
(PyTorch #155423 and #155552 were reduced by hand): the first layer where two records
differ, its input and weights as ``.npy`` files, and one short script per device that runs
that single layer on the device's runtime with the device's settings and prints the
SHA-256 of its output. The scripts need numpy and the runtime only, not bitdrift.

The device ran the layer on whole batches (the recorded samples, then filler test images:
bitdrift.run.selection.batch_indices). The filler's activations are not recorded, so their
rows are zeros here: each row of a Dense or convolution layer is computed on its own, and
the batches keep the device's size, which is what a kernel's choice and order depend on.
The samples are in the order the device ran them (a kernel may sum each row of a batch in
its own order).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bitdrift import backends
from bitdrift.backends.exported.common import onnx_layer
from bitdrift.backends.keras.common import minimal_config
from bitdrift.errors import BitdriftError, ConfigError, InferenceError, RecordError
from bitdrift.record.reader import Record

EXPECTED = "expected.json"


def scripted_runtime(backend: str):
    """The runtime module (bitdrift.backends) that writes a script for ``backend``'s
    devices (its ``script_code``), or None: a name bitdrift has no runtime of, or a runtime
    with no script."""
    if backend not in backends.RUNTIMES:
        return None
    runtime = backends.get(backend)
    return runtime if runtime.script_code is not None else None


def scripted_runtimes() -> tuple:
    """The runtimes a script is written for: Keras', the exported ones, and a .pt2
    program's node on torch eager."""
    return tuple(name for name in backends.RUNTIMES if scripted_runtime(name) is not None)


class NotReproducible(BitdriftError):
    exit_code = 1


@dataclass
class Split:
    """Where two records first differ."""

    layer: str
    class_name: str
    inbound: str | None  # the recorded layer feeding it; None: the model input
    config: dict
    weights: list[np.ndarray]
    format: str = "keras"  # the model file's (bitdrift.formats): an ONNX node runs as it is


def layer_bits(record: Record, layer: str, order: list[int] | None = None) -> np.ndarray:
    """The layer's output for every recorded sample (repeat 0, in ``order``, else the
    record's), as stored: what a script's output must equal bit for bit."""
    return np.stack([record.tensor(sample, layer).values[0]
                     for sample in order or record.samples])


def run_order(record: Record, dataset_path) -> list[int]:
    """The samples in the order the device ran them (rows of its batches; a kernel may sum
    each row in its own order): the record's ``samples_order``; for a record written
    before it, the order whose images give the record's ``input_sha256`` (with the
    dataset, up to 6 samples), else the record's (sorted) order."""
    if record.has_attr("samples_order"):
        order = record.json_attr("samples_order", list)
        if sorted(sample for sample in order if type(sample) is int) != record.samples:
            raise RecordError(f"{record.path}: attribute 'samples_order' is not the record's "
                              f"samples in some order ({record.samples})")
        return order
    if dataset_path is None or len(record.samples) > 6:
        return list(record.samples)
    from itertools import permutations

    from bitdrift.inputs.datasets import input_sha256, read_test_images

    images = read_test_images(dataset_path, record.samples)  # rows of one or several arrays
    row = {sample: index for index, sample in enumerate(record.samples)}
    return next((list(order) for order in permutations(record.samples)
                 if input_sha256(images[[row[s] for s in order]])
                 == record.attr("input_sha256")), list(record.samples))


def device_config(record: Record) -> dict:
    """The device's settings the record was run with, as a script needs them."""
    if not record.has_attr("device_config"):
        raise RecordError(f"{record.path}: no attribute 'device_config' (a record of "
                          "`bitdrift infer` holds the device's settings)")
    device = record.json_attr("device_config")
    wrong = [key for key, kinds in (("backend", str), ("precision", str),
                                    ("batch_size", int), ("accelerator", str))
             if not isinstance(device.get(key), kinds) or isinstance(device.get(key), bool)]
    if wrong or not isinstance(device.get("threads"), int | None):
        raise RecordError(f"{record.path}: attribute 'device_config' lacks a valid "
                          f"{', '.join(map(repr, wrong or ['threads']))}")
    return device


def digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()


def first_split(record_a: Record, record_b: Record, model_path) -> Split:
    """The first layer (in model order) whose output differs between the records in any
    sample, with its Keras config and weights from the model file (read without Keras),
    or an ONNX model's node (bitdrift.formats.onnx.file_layers)."""
    from bitdrift import formats

    for what in ("model", "precision"):
        if record_a.attr(what) != record_b.attr(what):
            raise ConfigError(f"{record_a.path} and {record_b.path}: other {what}s "
                              f"({record_a.attr(what)}, {record_b.attr(what)}); a repro "
                              "compares two devices on one model in one format")
    if record_a.samples != record_b.samples:
        raise RecordError(f"{record_a.path} and {record_b.path} hold other samples")
    if record_a.attr("model_sha256") != record_b.attr("model_sha256"):
        raise RecordError(f"{record_a.path} and {record_b.path} ran other model files")
    sample = record_a.value_samples[0]  # a sample whose layers hold values
    layers = [info for info in record_a.layers(sample) if not info.final]
    if not layers:
        raise RecordError(f"{record_a.path}: no layers recorded (analysis.layers off); "
                          "a repro needs the layer where the devices part")
    in_b = record_b.layer_labels(sample)
    parted = next((info for info in layers if info.label in in_b and not np.array_equal(
        layer_bits(record_a, info.name).view(np.uint8),
        layer_bits(record_b, info.name).view(np.uint8))), None)
    if parted is None:
        raise NotReproducible(f"{record_a.path} and {record_b.path} agree bit for bit in "
                              "every recorded layer: nothing to reproduce")
    from bitdrift.inputs.models import model_digest

    if model_digest(model_path) != record_a.attr("model_sha256"):
        raise RecordError(f"{model_path}: not the model the records ran (another digest)")
    format = formats.detect(model_path)
    readable = formats.get(format).file_layers
    if readable is None:
        raise NotReproducible(f"{model_path}: {formats.get(format).WHAT}, whose layers "
                              "bitdrift cannot read alone yet")
    found = {layer["name"]: layer for layer in readable(model_path)}
    layer = found.get(parted.name)
    if layer is None:
        raise RecordError(f"{model_path} has no layer {parted.name!r}")
    if len(layer["inbound"]) != 1:
        raise NotReproducible(f"layer {parted.name!r} ({layer['class_name']}) has "
                              f"{len(layer['inbound'])} inputs; a repro runs one-input layers")
    source = layer["inbound"][0]
    inbound = None if found[source]["class_name"] == "InputLayer" else source
    if inbound is None and sum(entry["class_name"] == "InputLayer"
                               for entry in found.values()) > 1:
        raise NotReproducible(f"layer {parted.name!r} reads the model input {source!r}, one "
                              "of several; a repro runs a layer fed by a recorded layer or "
                              "by a model's one input")
    if inbound is not None:
        if inbound not in {info.name for info in layers}:
            raise NotReproducible(f"the input of {parted.name!r} ({inbound}) is not recorded")
    return Split(layer=parted.name, class_name=layer.get("op_type", layer["class_name"])
                 if format == "onnx" else layer["class_name"], inbound=inbound,
                 config=layer["config"], weights=layer["weights"], format=format)


def layer_input(record: Record, split: Split, dataset_path, order: list[int]) -> np.ndarray:
    """The layer's input for the recorded samples, in the record's format (bfloat16 as its
    raw bits); each script pads it to whole batches of its device's size."""
    from bitdrift.inputs.models import numpy_dtype

    if split.inbound is None:
        if dataset_path is None:
            raise ConfigError(f"layer {split.layer!r} reads the model input: give "
                              "--dataset-file (the dataset the records ran on)")
        from bitdrift.inputs.datasets import read_test_images

        values = read_test_images(dataset_path, order).astype(
            numpy_dtype(record.precision))
        if record.precision == "bfloat16":
            values = values.view(np.uint16)
        return values
    return layer_bits(record, split.inbound, order)


# -- the scripts ----------------------------------------------------------------------------
def script_environment(device: dict) -> dict:
    """The variables the device's process had set by bitdrift (not the user's shell)."""
    from bitdrift.run.devices import EMULATED, device_environment

    env = device_environment(device, base={})
    env.pop(EMULATED, None)
    return dict(sorted(env.items()))


HEADER = '''"""{title}

Run: {command}
Prints the SHA-256 of the layer's output for the recorded samples; {record} holds
{expected}.
"""
import hashlib
import os
from pathlib import Path

os.environ.update({env!r})
import numpy as np

HERE = Path(__file__).resolve().parent
BATCH, SAMPLES = {batch}, {samples}
'''

LOAD = '''
x = np.load(HERE / "input.npy")
weights = [np.load(HERE / f"weight_{{index}}.npy") for index in range({weights})]
'''
# bfloat16 is stored as its raw bits (numpy has no bfloat16 of its own)
LOAD_BFLOAT16 = '''import ml_dtypes

x = np.load(HERE / "input.npy").view(ml_dtypes.bfloat16)
weights = [np.load(HERE / f"weight_{{index}}.npy").view(ml_dtypes.bfloat16)
           for index in range({weights})]
'''
# A runtime whose script reads the layer from a file of its own (layer.onnx,
# layer.tflite: the runtime's SCRIPT_LAYER) has the weights in it
LOAD_LAYER_FILE = '''
x = np.load(HERE / "input.npy")
'''

# Whole batches of the device's size, as it ran: the filler rows are zero (each row is
# computed on its own; the batch's size is what picks the kernel)
PAD = '''x = np.concatenate([x, np.zeros((-len(x) % BATCH, *x.shape[1:]), x.dtype)])
'''

FOOTER = '''print(hashlib.sha256(np.ascontiguousarray(out[:SAMPLES]).tobytes()).hexdigest())
'''


def _runtime_code(device: dict, split: Split) -> str:
    """The device's runtime running the split's layer alone (the runtime's script_code)."""
    runtime = scripted_runtime(device["backend"])
    if runtime is None:
        raise NotReproducible(f"backend {device['backend']!r}: no repro script (bitdrift "
                              f"writes them for {', '.join(scripted_runtimes())})")
    return runtime.script_code(device, split)


def refusal(device: dict, split: Split) -> str | None:
    """Why no script can be written for this device, or None."""
    from bitdrift.emulation.cpus import architecture

    if device.get("emulate") and architecture(device["emulate"]) == "aarch64":
        # its command would hold this machine's QEMU, root and site paths, and its python
        # finds the aarch64 site only through the worker's environment
        return (f"emulated Arm CPU {device['emulate']}: no repro script (it would run only "
                "in this machine's aarch64 userland)")
    backend = device["backend"]
    runtime = scripted_runtime(backend)
    if runtime is None:
        return f"backend {backend!r}: no repro script"
    why = runtime.script_refusal(device, split)
    if why:
        return why
    if split.format == "pt2" and backend not in backends.PROGRAM_RUNTIMES:
        return (f"{backend}: runs the .pt2 program converted; a repro script runs the "
                "program's node on torch_export only")
    return None


def command_line(device: dict, script: str, python: str) -> list[str]:
    """How to run a device's script: under QEMU for an emulated CPU, as its run was."""
    from bitdrift.emulation.cpus import python_command

    return [*python_command(device, python), script]


def write_script(path: Path, name: str, device: dict, record: Record, split: Split,
                 expected: str) -> None:
    shown = " ".join(command_line(device, path.name, "python"))
    header = HEADER.format(
        title=f"{record.model}: layer {split.layer} ({split.class_name}) as device {name} "
              f"ran it ({device['backend']}, {device['precision']}, batch "
              f"{device['batch_size']}, threads {device.get('threads') or 'default'})",
        command=shown, record=record.path.name, expected=expected,
        env=script_environment(device), batch=int(device["batch_size"]),
        samples=len(record.samples))
    load = LOAD_LAYER_FILE if backends.get(device["backend"]).SCRIPT_LAYER else \
        (LOAD_BFLOAT16 if device["precision"] == "bfloat16" else LOAD).format(
            weights=len(split.weights))
    path.write_text(header + load + PAD + _runtime_code(device, split) + FOOTER)


# -- the one-layer LiteRT file ----------------------------------------------------------------
def tflite_layer(split: Split, input_shape: tuple, weights: list, out: Path) -> None:
    """The layer alone as a .tflite, converted as bitdrift.backends.keras.export converts the
    model."""
    from bitdrift.backends.exported.litert import convert_layers
    from bitdrift.inputs.models import rewrite_dtypes

    try:
        convert_layers([{"shape": list(input_shape), "class_name": split.class_name,
                         "config": rewrite_dtypes(minimal_config(split.config), "float32"),
                         "weights": weights, "out": str(out)}])
    except InferenceError as error:
        raise NotReproducible(f"layer {split.layer!r}: {error}") from error


# -- the folder -----------------------------------------------------------------------------
def write_repro(path_a, path_b, model_path, out, dataset_path=None) -> dict:
    """Write the repro folder ``out`` for the records at ``path_a`` and ``path_b``;
    returns {"layer", "devices": {name: {"script", "expected"} or {"refused"}}}. The folder
    is written whole or not at all."""
    from bitdrift.atomic import atomic_folder, check_output

    out = Path(out)
    if not Path(model_path).is_file():
        raise RecordError(f"{model_path}: model file does not exist (--model-file)")
    check_output("--out", out, folder=True, whole=True)
    if out.exists() and any(out.iterdir()) and not (out / EXPECTED).is_file():
        raise ConfigError(f"--out {out}: a folder with other files; give a new or empty one")
    with Record(path_a) as record_a, Record(path_b) as record_b:
        split = first_split(record_a, record_b, model_path)
        order = run_order(record_a, dataset_path)
        if run_order(record_b, dataset_path) != order:
            raise NotReproducible(f"{record_a.path} and {record_b.path} ran the samples in "
                                  "other orders (one script input serves both)")
        x = layer_input(record_a, split, dataset_path, order)
        if split.inbound is not None and not np.array_equal(
                x.view(np.uint8), layer_input(record_b, split, dataset_path, order).view(
                    np.uint8)):
            raise NotReproducible(f"the input of {split.layer!r} ({split.inbound}) differs "
                                  "between the records")
        from bitdrift.inputs.models import numpy_dtype

        dtype = numpy_dtype(record_a.precision)
        weights = [np.asarray(value).astype(dtype) for value in split.weights]
        if record_a.precision == "bfloat16":
            weights = [value.view(np.uint16) for value in weights]
        summary = {"model": record_a.model, "layer": split.layer,
                   "class_name": split.class_name, "inbound": split.inbound or "model input",
                   "samples": order, "devices": {}}
        with atomic_folder(out) as staging:
            np.save(staging / "input.npy", x)
            for index, value in enumerate(weights):
                np.save(staging / f"weight_{index}.npy", value)
            for record in (record_a, record_b):
                device = device_config(record)
                name = record.device
                expected = digest(layer_bits(record, split.layer, order))
                why = refusal(device, split)
                if why:
                    summary["devices"][name] = {"refused": why, "expected": expected}
                    continue
                layer_file = backends.get(device["backend"]).SCRIPT_LAYER
                if layer_file == "onnx" and not (staging / "layer.onnx").exists():
                    import onnx

                    try:
                        if split.format == "onnx":  # the node itself, as the file has it
                            from bitdrift.backends.exported.onnx_file import node_model

                            layer_onnx = node_model(model_path, split.layer, x.shape[1:])
                        else:
                            layer_onnx = onnx_layer(split.class_name, split.config,
                                                    split.weights, x.shape[1:], split.layer)
                    except InferenceError as error:
                        raise NotReproducible(str(error)) from error
                    onnx.save(layer_onnx, staging / "layer.onnx")
                if layer_file == "tflite" and not (staging / "layer.tflite").exists():
                    tflite_layer(split, x.shape[1:], weights, staging / "layer.tflite")
                # not NAME.py: a device called torch would shadow the torch module
                script = f"run_{name}.py"
                write_script(staging / script, name, device, record, split, expected)
                summary["devices"][name] = {
                    "script": script, "expected": expected, "record": str(record.path),
                    "command": command_line(device, script, "python")}
            (staging / EXPECTED).write_text(json.dumps(summary, indent=1, sort_keys=True))
            (staging / "README.md").write_text(readme(summary))
    return summary


def readme(summary: dict) -> str:
    lines = [f"# {summary['model']}: where the devices part", "",
             f"Layer `{summary['layer']}` ({summary['class_name']}), fed by "
             f"{summary['inbound']}: its input is `input.npy` (the recorded samples in the "
             "record's order; each script pads it with zero rows to whole batches of its "
             "device's size: each row is computed on its own), its weights "
             "`weight_*.npy`. Each script runs that one layer on its device's runtime with "
             "the device's settings and prints the SHA-256 of the samples' output.", "",
             "| device | run | SHA-256 the record holds |", "|---|---|---|"]
    for name, entry in summary["devices"].items():
        run = f"`{' '.join(entry['command'])}`" if "command" in entry else entry["refused"]
        lines.append(f"| {name} | {run} | `{entry['expected'][:16]}...` |")
    return "\n".join(lines) + "\n"


def check_repro(folder, python: str = sys.executable, timeout: int = 600) -> dict:
    """Run each script of a repro folder; {device: {"printed", "expected", "reproduced"}}."""
    folder = Path(folder)
    summary = json.loads((folder / EXPECTED).read_text())
    results = {}
    for name, entry in summary["devices"].items():
        if "script" not in entry:
            results[name] = {"expected": entry["expected"], "printed": "",
                             "reproduced": False, "why": entry["refused"]}
            continue
        command = [python if part == "python" else part for part in entry["command"]]
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True,
                              timeout=timeout)
        printed = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        results[name] = {"expected": entry["expected"], "printed": printed,
                         "reproduced": done.returncode == 0 and printed == entry["expected"],
                         "why": "" if done.returncode == 0 else
                         (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return results
