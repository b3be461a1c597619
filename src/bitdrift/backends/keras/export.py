"""Exported models: the trained ``.keras`` model in the formats of the exported runtimes,
and the TensorFlow reference they are checked against.

TensorFlow processes write ``results/exports/<model>/`` (one job per file):

- ``model.onnx`` (Keras' ``export(format="onnx")``, tf2onnx): ONNX Runtime and OpenVINO
  read it, so their differences are the runtimes', not two converters';
- ``model.tflite`` (Keras' ``export(format="litert")``, TensorFlow's LiteRT converter);
- ``deployed.onnx`` and ``deployed.tflite``: the model itself, its final output alone, as
  a user deploys it (the observer check, bitdrift.analysis.observer: each runtime also runs it);
- ``reference.npz``: the recorded layers, what the effective-precision check needs, every
  layer's TensorFlow float32 output on the first test images (the layer-mapping check; of
  a large layer a regular sample of its values, see write_reference) and TensorFlow's
  class for the first test images (the argmax check).

What is exported is the layer probe (:func:`bitdrift.inputs.models.layer_probe`): a model with one
output per recorded layer, in the probe's order, so a runtime's outputs map to Keras layers
by position. Each runtime then checks the mapping against the reference outputs: a layer
whose values do not match (a converter that reordered or fused outputs) is listed as
unmapped and left out, never given another layer's values.
"""

from __future__ import annotations

import contextlib
import gc
import json
import re
from pathlib import Path

import numpy as np

from bitdrift.atomic import atomic_output
from bitdrift.backends.exported.expected import FORMATS, Reference, format_of
from bitdrift.errors import InferenceError, RecordError
from bitdrift.inputs.datasets import count_test_images, read_test_images

CHECK_IMAGES = 8  # test images on which every layer's mapping is checked
ARGMAX_IMAGES = 1000  # test images (at most) on which each runtime's class is compared
ARGMAX_AGREEMENT = 0.99  # the least share of those a float32/float64 device must agree on
ARGMAX_AGREEMENT_REDUCED = 0.9  # for a device that computes in a narrower format (bf16)
class ExportError(InferenceError):
    """A model that a runtime's converter cannot export."""


def inference_inputs(model: str, backend: str) -> dict:
    """{input name: path} a device of ``backend`` needs beside the model: TensorFlow's
    reference (every runtime but TensorFlow itself) and the exported file."""
    from bitdrift import backends, paths

    inputs = {} if backend == "tensorflow" else {"reference": paths.export_reference_file(model)}
    if backend in backends.EXPORTED_RUNTIMES:
        inputs["export"] = paths.export_file(model, format_of(backend))
        inputs["deployed_export"] = paths.deployed_export_file(model, format_of(backend))
    return inputs


def command_inputs(model: str, backend: str) -> dict:
    """inference_inputs for a command run by hand: a Keras runtime runs without the
    reference when there is none (only its argmax check is left out, as in `bitdrift
    infer`); an exported runtime keeps both, and fails on a missing one."""
    inputs = inference_inputs(model, backend)
    if "export" not in inputs and not Path(inputs.get("reference", ".")).is_file():
        inputs.pop("reference", None)
    return inputs


def load_model(model_path):
    """(keras, the model at ``model_path``, uncompiled); ExportError in one line for a file
    Keras cannot load."""
    from bitdrift import backends
    from bitdrift.inputs.models import register_layers

    keras = backends.get("tensorflow").import_keras()
    register_layers(keras)
    try:
        model = keras.saving.load_model(str(model_path), compile=False)
    except Exception as error:  # Keras raises ValueError, OSError, zipfile errors, ...
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ExportError(f"{model_path}: cannot load the model ({first})") from error
    return keras, model


def _probe(model_path):
    from bitdrift.inputs.models import layer_probe

    keras, model = load_model(model_path)
    probe, layers = layer_probe(keras, model)
    return keras, model, probe, layers


def export_model(model_path: str | Path, format: str, out: str | Path,
                 deployed: str | Path | None = None) -> None:
    """The model's layer probe in ``format`` (a key of FORMATS), written atomically; and
    the model itself, its final output alone, at ``deployed`` (the observer check)."""
    keras, model, probe, layers = _probe(model_path)
    # Keras exports called models; an open axis (a sequence length) is called at 1
    zeros = np.zeros((1, *(size or 1 for size in model.inputs[0].shape[1:])), np.float32)
    probe(zeros)
    model(zeros)
    for exported, path in ((probe, out), (model, deployed)):
        if path is not None:
            write_export(exported, format, path, model_path, [layer for layer, _ in layers])


def write_export(exported, format: str, path, model_path, layers: list[str],
                 **converter) -> None:
    """The called Keras model ``exported`` in ``format`` (a key of FORMATS) at ``path``,
    written atomically; ``converter``: the converter's own settings, passed on by Keras'
    export (LiteRT's: optimizations, representative_dataset, target_spec, ...;
    bitdrift.backends.exported.litert_quantization). A converter's failure is one line
    naming the layer among ``layers`` it names, and the runtimes."""
    keras_format, runtimes = FORMATS[format]
    with atomic_output(path) as tmp, _collecting_often():
        try:
            exported.export(str(tmp), format=keras_format, verbose=False, **converter)
        except Exception as error:  # a converter's own error types vary by version
            raise ExportError(_export_failure(error, layers, " and ".join(runtimes),
                                              model_path)) from error


@contextlib.contextmanager
def _collecting_often():
    """Python's full garbage collection about every 15,000 allocations (thresholds
    700, 10, 1 instead of 700, 10, 10) while a converter runs.

    tf2onnx deep-copies the whole graph, its weights included, before each optimiser pass
    (tf2onnx.optimizer.optimize_graph) and drops the old copy as reference cycles: few
    objects but a model's worth of bytes each, which the collector's object counts seldom
    reach (a ResNet-50 at 224 piled up 5 GiB of copies, 6.2 GiB in all). The objects
    alive before the conversion (the frameworks', the model's) are frozen out of the
    collections meanwhile, so each full one walks the converter's objects only. What is
    converted is unchanged: only when unreachable objects are freed."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], 1)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        gc.collect()


def write_reference(model_path: str | Path, dataset_path: str | Path,
                    out: str | Path) -> None:
    """TensorFlow's float32 reference of the model (see the module's docstring).

    Memory stays about REFERENCE_BATCH_BYTES whatever the model: the images are run in
    batches whose every layer's outputs fit in it (Keras' eager call keeps each layer's
    output until the call ends: 64 images of a ResNet-50 at 224 held 10 GB), and of a
    layer larger than its share of CHECK_BYTES the reference keeps every
    ``stride``-th value per image and the layer's largest magnitude (reference.mapped_
    positions compares those), about CHECK_BYTES in all: a ResNet-50 at 224's reference
    held every layer in full (1.28 GB) and 12 GB while writing it. A small model (the
    default's) runs in one batch and keeps every value, as before."""
    from bitdrift.backends.keras.common import checked_layers
    from bitdrift.inputs.models import model_digest

    keras, model, probe, layers = _probe(model_path)
    n_test = count_test_images(dataset_path)
    check_indices = list(range(min(CHECK_IMAGES, n_test)))
    argmax_indices = list(range(min(ARGMAX_IMAGES, n_test)))
    batch = _batch_for(keras, probe, dataset_path)
    sampled = _SampledOutputs(len(layers), len(check_indices),
                              max(CHECK_FLOOR, CHECK_BYTES // 4 // max(len(layers), 1)))
    for start in range(0, len(check_indices), batch):
        images = read_test_images(dataset_path, check_indices[start:start + batch])
        sampled.add([keras.ops.convert_to_numpy(value) for value in
                     probe(images.astype(np.float32), training=False)])
    argmax = np.concatenate([
        np.argmax(keras.ops.convert_to_numpy(model(read_test_images(
            dataset_path, argmax_indices[start:start + batch]).astype(np.float32),
            training=False)), axis=-1) for start in range(0, len(argmax_indices), batch)])
    checked = checked_layers(keras, model, [layer for layer, _ in layers])
    meta = {"layers": layers, "checked": {layer: spec for layer, (spec, _) in checked.items()},
            "check_indices": check_indices, "argmax_indices": argmax_indices,
            "model_sha256": model_digest(model_path), **sampled.meta()}
    arrays = {f"check/{position}": value for position, value in enumerate(sampled.values())}
    arrays.update({f"weights/{layer}/{index}": np.asarray(value)
                   for layer, (_, values) in checked.items()
                   for index, value in enumerate(values)})
    with atomic_output(out) as tmp:
        with open(tmp, "wb") as handle:
            np.savez(handle, meta=json.dumps(meta), argmax=argmax, **arrays)


# The reference's memory, whatever the model (write_reference): the images of one batch
# with every layer's outputs; the check values kept over all layers (a layer keeps at
# least CHECK_FLOOR values over the check images, in full where it has no more)
REFERENCE_BATCH_BYTES = 512 * 2**20
ARGMAX_BATCH = 64  # images per call at most (the batch of a small model, as before)
CHECK_BYTES = 64 * 2**20
CHECK_FLOOR = 2**16


def _batch_for(keras, probe, dataset_path) -> int:
    """Images per call such that every layer's outputs of a batch fit in
    REFERENCE_BATCH_BYTES (at least one; ARGMAX_BATCH at most)."""
    shapes = [tuple(output.shape[1:]) for output in probe.outputs]
    if any(size is None for shape in shapes for size in shape):  # an open axis: measure
        one = read_test_images(dataset_path, [0]).astype(np.float32)
        shapes = [tuple(value.shape[1:]) for value in probe(one, training=False)]
    per_image = sum(int(np.prod(shape)) * 4 for shape in shapes) or 1
    return max(1, min(ARGMAX_BATCH, REFERENCE_BATCH_BYTES // per_image))


class _SampledOutputs:
    """The check values of each layer, batch by batch: in full where the layer holds at
    most ``cap`` values over the check images, else every ``stride``-th value of each
    image's (its largest magnitude kept over all of them)."""

    def __init__(self, layers: int, images: int, cap: int):
        self.images, self.cap = images, cap
        self.parts: list[list[np.ndarray]] = [[] for _ in range(layers)]
        self.shapes: list[list[int] | None] = [None] * layers
        self.strides = [1] * layers
        self.scales = [0.0] * layers

    def add(self, outputs: list[np.ndarray]) -> None:
        for position, value in enumerate(outputs):
            if self.shapes[position] is None:
                per_image = int(np.prod(value.shape[1:]))
                self.shapes[position] = [self.images, *map(int, value.shape[1:])]
                self.strides[position] = max(1, -(-per_image * self.images // self.cap))
            stride = self.strides[position]
            if stride > 1:
                self.scales[position] = max(self.scales[position], float(np.max(np.abs(
                    value.astype(np.float64)))) if value.size else 0.0)
                value = np.ascontiguousarray(value.reshape(len(value), -1)[:, ::stride])
            self.parts[position].append(value)

    def values(self) -> list[np.ndarray]:
        return [parts[0] if len(parts) == 1 else np.concatenate(parts)
                for parts in self.parts]

    def meta(self) -> dict:
        """What reference.read_reference needs of sampled layers (nothing where none is)."""
        if all(stride == 1 for stride in self.strides):
            return {}
        return {"check_shapes": self.shapes, "check_strides": self.strides,
                "check_scales": self.scales}


def _export_failure(error: Exception, layers: list[str], runtimes: str, model_path) -> str:
    """One line naming the layer (the converters name TensorFlow ops, whose scopes are the
    Keras layers' names) and the runtime."""
    text = str(error).strip().splitlines()
    first = text[0] if text else type(error).__name__
    named = [layer for layer in layers if re.search(rf"(^|[^\w]){re.escape(layer)}([^\w]|$)",
                                                    str(error))]
    where = f"layer {max(named, key=len)!r}" if named else "the model"
    return f"{model_path}: {where} cannot be exported for {runtimes} ({first})"


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
            agreement = record.json_attr("argmax_agreement")
            lacking = [key for key in ("images", "agreeing", "share")
                       if isinstance(agreement.get(key), bool)
                       or not isinstance(agreement.get(key), int | float)]
            if lacking:
                raise RecordError(f"{record.path}: attribute 'argmax_agreement' has no number "
                                  f"{', '.join(map(repr, lacking))}")
            row.update({key: agreement[key] for key in ("images", "agreeing", "share")})
        elif record.attr("backend") == "tensorflow":
            row["share"] = "reference"
        else:
            row["share"] = "unchecked"
        if record.has_attr("unmapped_layers"):
            row["unmapped_layers"] = " ".join(
                map(str, record.json_attr("unmapped_layers", list)))
        if record.has_attr("export_sha256"):
            row["export_sha256"] = record.attr("export_sha256")
        rows.append({column: row.get(column) for column in AGREEMENT_COLUMNS})
    return rows
