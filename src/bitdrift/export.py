"""Exported models: the trained ``.keras`` model in the formats of the exported runtimes,
and the TensorFlow reference they are checked against.

TensorFlow processes write ``results/exports/<model>/`` (one job per file):

- ``model.onnx`` (Keras' ``export(format="onnx")``, tf2onnx): ONNX Runtime and OpenVINO
  read it, so their differences are the runtimes', not two converters';
- ``model.tflite`` (Keras' ``export(format="litert")``, TensorFlow's LiteRT converter);
- ``reference.npz``: the recorded layers, what the effective-precision check needs, every
  layer's TensorFlow float32 output on the first test images (the layer-mapping check) and
  TensorFlow's class for the first test images (the argmax check).

What is exported is the layer probe (:func:`bitdrift.models.layer_probe`): a model with one
output per recorded layer, in the probe's order, so a runtime's outputs map to Keras layers
by position. Each runtime then checks the mapping against the reference outputs: a layer
whose values do not match (a converter that reordered or fused outputs) is listed as
unmapped and left out, never given another layer's values.
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bitdrift.atomic import atomic_output
from bitdrift.datasets import count_test_images, read_test_images
from bitdrift.errors import InferenceError, RecordError

# Format -> (Keras' export format, the runtimes that read it).
FORMATS = {"onnx": ("onnx", ("onnxruntime", "openvino")),  # suffix: (Keras format, readers)
           "tflite": ("litert", ("litert",))}
CHECK_IMAGES = 8  # test images on which every layer's mapping is checked
ARGMAX_IMAGES = 1000  # test images (at most) on which each runtime's class is compared
ARGMAX_AGREEMENT = 0.99  # the least share of those a float32/float64 device must agree on
ARGMAX_AGREEMENT_REDUCED = 0.9  # for a device that computes in a narrower format (bf16)
# A runtime's layer output matches the reference within this share of the layer's largest
# magnitude: float32 runtimes differ by ~1e-6 of it, another layer's values by ~1.
MAPPING_TOLERANCE = 1e-3
# A runtime computing in a narrower format (OpenVINO's bfloat16 default on a CPU with
# native bf16: 2e-3 to 6e-3 on cifar10_small) still maps within 16 units of bfloat16's
# rounding (2**-8) of the layer's largest magnitude; a wrong export's values are ~1 off.
REDUCED_MAPPING_TOLERANCE = 16 * 2.0**-8


class ExportError(InferenceError):
    """A model that a runtime's converter cannot export."""


@dataclass
class Reference:
    layers: list[tuple[str, str]]
    checked: dict  # {layer: (spec, weights)}
    check_indices: list[int]
    check_outputs: list[np.ndarray]  # per recorded layer, on the check images
    argmax_indices: list[int]
    argmax: np.ndarray
    model_sha256: str


REBUILD = "make it again with `snakemake --forcerun"
# A LiteRT (TFLite) FlatBuffer carries its file identifier at bytes 4-8.
TFLITE_IDENTIFIER = b"TFL3"


def check_export_file(path: str | Path, runtime: str) -> None:
    """The exported file a runtime is about to read: missing, empty, or the other format
    (an ONNX file given to LiteRT, a .tflite to ONNX Runtime) is one line naming the file,
    what it should be and how to make it again. (A damaged file of the right kind is
    caught where the runtime parses it: bitdrift.backends.exported.)"""
    path = Path(path)
    expected = format_of(runtime)
    what = {"onnx": "an ONNX model (Keras' ONNX export)",
            "tflite": "a LiteRT FlatBuffer (.tflite)"}[expected]
    rebuild = f"{REBUILD} export_model` (or `bitdrift export`)"
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as error:
        raise InferenceError(f"{path}: cannot be read ({error.strerror}); {runtime} needs "
                             f"{what}; {rebuild}") from error
    is_tflite = head[4:8] == TFLITE_IDENTIFIER
    if not head or is_tflite != (expected == "tflite"):
        found = "empty" if not head else "a LiteRT FlatBuffer" if is_tflite else \
            "not a LiteRT FlatBuffer"
        raise InferenceError(f"{path}: {found}, but {runtime} needs {what}; {rebuild}")


def unreadable_export(path, runtime: str, error: Exception) -> InferenceError:
    """A runtime's own parse error of an exported file, as one line."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0]
    what = "an ONNX model" if format_of(runtime) == "onnx" else "a LiteRT FlatBuffer"
    return InferenceError(f"{path}: {runtime} cannot read it as {what}, damaged or "
                          f"truncated ({first[:200]}); {REBUILD} export_model`")


def format_of(runtime: str) -> str:
    """The exported format runtime ``runtime`` reads."""
    return next(name for name, (_, runtimes) in FORMATS.items() if runtime in runtimes)


def inference_inputs(model: str, backend: str) -> dict:
    """{input name: path} a device of ``backend`` needs beside the model: TensorFlow's
    reference (every runtime but TensorFlow itself) and the exported file."""
    from bitdrift import backends, paths

    inputs = {} if backend == "tensorflow" else {"reference": paths.export_reference_file(model)}
    if backend in backends.EXPORTED_RUNTIMES:
        inputs["export"] = paths.export_file(model, format_of(backend))
    return inputs


def command_inputs(model: str, backend: str) -> dict:
    """inference_inputs for a command run by hand: a Keras runtime runs without the
    reference when there is none (only its argmax check is left out, as in `bitdrift
    infer`); an exported runtime keeps both, and fails on a missing one."""
    inputs = inference_inputs(model, backend)
    if "export" not in inputs and not Path(inputs.get("reference", ".")).is_file():
        inputs.pop("reference", None)
    return inputs


def _probe(model_path):
    from bitdrift import backends
    from bitdrift.models import layer_probe, register_layers

    keras = backends.get("tensorflow").import_keras()
    register_layers(keras)
    try:
        model = keras.saving.load_model(str(model_path), compile=False)
    except Exception as error:  # Keras raises ValueError, OSError, zipfile errors, ...
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ExportError(f"{model_path}: cannot load the model ({first})") from error
    probe, layers = layer_probe(keras, model)
    return keras, model, probe, layers


def export_model(model_path: str | Path, format: str, out: str | Path) -> None:
    """The model's layer probe in ``format`` (a key of FORMATS), written atomically."""
    keras, model, probe, layers = _probe(model_path)
    keras_format, runtimes = FORMATS[format]
    # Keras exports called models; an open axis (a sequence length) is called at 1
    probe(np.zeros((1, *(size or 1 for size in model.inputs[0].shape[1:])), np.float32))
    with atomic_output(out) as tmp:
        try:
            probe.export(str(tmp), format=keras_format, verbose=False)
        except Exception as error:  # a converter's own error types vary by version
            raise ExportError(_export_failure(error, [layer for layer, _ in layers],
                                              " and ".join(runtimes), model_path)) from error


def write_reference(model_path: str | Path, dataset_path: str | Path,
                    out: str | Path) -> None:
    """TensorFlow's float32 reference of the model (see the module's docstring)."""
    from bitdrift.backends.keras_common import checked_layers
    from bitdrift.models import model_digest

    keras, model, probe, layers = _probe(model_path)
    n_test = count_test_images(dataset_path)
    check_indices = list(range(min(CHECK_IMAGES, n_test)))
    argmax_indices = list(range(min(ARGMAX_IMAGES, n_test)))
    check_images = read_test_images(dataset_path, check_indices).astype(np.float32)
    check_outputs = [keras.ops.convert_to_numpy(value)
                     for value in probe(check_images, training=False)]
    images = read_test_images(dataset_path, argmax_indices).astype(np.float32)
    argmax = np.concatenate([
        np.argmax(keras.ops.convert_to_numpy(model(images[start:start + 64], training=False)),
                  axis=-1) for start in range(0, len(images), 64)])
    checked = checked_layers(keras, model, [layer for layer, _ in layers])
    meta = {"layers": layers, "checked": {layer: spec for layer, (spec, _) in checked.items()},
            "check_indices": check_indices, "argmax_indices": argmax_indices,
            "model_sha256": model_digest(model_path)}
    arrays = {f"check/{position}": value for position, value in enumerate(check_outputs)}
    arrays.update({f"weights/{layer}/{index}": np.asarray(value)
                   for layer, (_, values) in checked.items()
                   for index, value in enumerate(values)})
    with atomic_output(out) as tmp:
        with open(tmp, "wb") as handle:
            np.savez(handle, meta=json.dumps(meta), argmax=argmax, **arrays)


def _export_failure(error: Exception, layers: list[str], runtimes: str, model_path) -> str:
    """One line naming the layer (the converters name TensorFlow ops, whose scopes are the
    Keras layers' names) and the runtime."""
    text = str(error).strip().splitlines()
    first = text[0] if text else type(error).__name__
    named = [layer for layer in layers if re.search(rf"(^|[^\w]){re.escape(layer)}([^\w]|$)",
                                                    str(error))]
    where = f"layer {max(named, key=len)!r}" if named else "the model"
    return f"{model_path}: {where} cannot be exported for {runtimes} ({first})"


def read_reference(path: str | Path) -> Reference:
    """The reference ``export_model`` wrote; RecordError naming the file if it is not one."""
    try:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            check = [data[f"check/{position}"] for position in range(len(meta["layers"]))]
            weights = {key: data[key] for key in data.files if key.startswith("weights/")}
            argmax = data["argmax"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise RecordError(f"{path}: not a bitdrift export reference, damaged or of another "
                          f"kind ({type(error).__name__}: {error}); {REBUILD} "
                          "export_reference") from error
    checked = {layer: (spec, [weights[f"weights/{layer}/{index}"]
                              for index in range(_count(weights, layer))])
               for layer, spec in meta["checked"].items()}
    return Reference(layers=[tuple(layer) for layer in meta["layers"]], checked=checked,
                     check_indices=meta["check_indices"], check_outputs=check,
                     argmax_indices=meta["argmax_indices"], argmax=argmax,
                     model_sha256=meta["model_sha256"])


def _count(weights: dict, layer: str) -> int:
    return sum(1 for key in weights if key.rsplit("/", 1)[0] == f"weights/{layer}")


def mapped_positions(outputs: list[np.ndarray], reference: Reference) -> list[str | None]:
    """Per recorded layer: whether the runtime's output at that position is the layer's
    (same shape): ``float32`` within MAPPING_TOLERANCE of the layer's largest magnitude,
    ``reduced`` only within REDUCED_MAPPING_TOLERANCE (a runtime computing in a narrower
    format: the effective-precision check names which), None for values unrelated to the
    layer (a wrong export)."""
    mapped = []
    for value, expected in zip(outputs, reference.check_outputs, strict=True):
        value = np.asarray(value, dtype=np.float64)
        expected = np.asarray(expected, dtype=np.float64)
        if value.shape != expected.shape:
            mapped.append(None)
            continue
        scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-30)
        error = float(np.max(np.abs(value - expected))) / scale if value.size else 0.0
        mapped.append("float32" if error <= MAPPING_TOLERANCE else
                      "reduced" if error <= REDUCED_MAPPING_TOLERANCE else None)
    return mapped


def argmax_agreement(classes: np.ndarray, reference: Reference) -> dict:
    """The share of the reference's test images a device classes as TensorFlow does."""
    agreeing = int(np.sum(np.asarray(classes) == reference.argmax))
    return {"reference": "tensorflow float32", "images": int(len(reference.argmax)),
            "agreeing": agreeing, "share": agreeing / max(len(reference.argmax), 1)}



AGREEMENT_COLUMNS = ["model", "device", "backend", "precision", "images", "agreeing", "share",
                     "unmapped_layers", "export_sha256"]


def agreement_table(records) -> list[dict]:
    """``argmax_agreement.csv``: per record, how many of the reference's test images it
    classes as TensorFlow does, and the layers its runtime could not expose. TensorFlow's
    own records are the reference (no row of agreement); a record written without the
    check says so."""
    rows = []
    for record in records:
        row = {"model": record.model, "device": record.device, "backend": record.attr("backend"),
               "precision": record.precision}
        if record.has_attr("argmax_agreement"):
            agreement = json.loads(record.attr("argmax_agreement"))
            row.update({key: agreement[key] for key in ("images", "agreeing", "share")})
        elif record.attr("backend") == "tensorflow":
            row["share"] = "reference"
        else:
            row["share"] = "unchecked"
        if record.has_attr("unmapped_layers"):
            row["unmapped_layers"] = " ".join(json.loads(record.attr("unmapped_layers")))
        if record.has_attr("export_sha256"):
            row["export_sha256"] = record.attr("export_sha256")
        rows.append({column: row.get(column) for column in AGREEMENT_COLUMNS})
    return rows
