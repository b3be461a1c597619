"""Model formats, each a loader module of this package, told apart by the file's content
(an extension is only a name): the one list is FORMATS, as bitdrift.runtimes.RUNTIMES is
the one list of runtimes. Adding a format is adding its module and one entry here, and
its runtimes in bitdrift.runtimes.FORMAT_RUNTIMES. A format says what the file is; how a
runtime runs it (a conversion, then the runtime's runner) is the runtime's
(bitdrift.backends.open_session), so nothing here imports a runtime or an analysis.

Every loader module has:

- ``NAME`` and ``WHAT``: the format's name and a few words saying what such a file is;
- ``recognise(path, head) -> bool``: whether the file's first bytes (``head``) and, where
  needed, its table of contents are this format's (cheap: no framework is imported);
- ``check(path)``: the file read as the format's own library reads it; a damaged file
  raises ModelFormatError naming the file and what is wrong;
- ``signature(path) -> list[Input]``: the model's inputs (None for a dimension the model
  leaves free), read without running it;
- ``file_layers(path)``: its layers as bitdrift.inputs.models.keras_file_layers gives a Keras
  model's (the analyses that recompute a layer from its weights), or None where the
  format has no such reading yet;
- ``INPUTS_CHECKED_BEFORE_SESSION`` (True unless the loader says otherwise: Keras, whose
  runtimes cast a dataset): whether a session is opened only after the model's inputs
  are checked against what the runtime feeds and the device's batch size.

The runtimes that run each format, and those that feed a model of several inputs each by
its name, are data of the runtimes (bitdrift.runtimes: FORMAT_RUNTIMES, SEVERAL_INPUTS).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

from bitdrift.errors import ModelFormatError
from bitdrift.runtimes import FORMAT_RUNTIMES, SEVERAL_INPUTS

# The one list of model formats, in the order they are tried: each name is a module here
FORMATS = ("keras", "onnx", "pt2", "tflite")
HEAD_BYTES = 64


@dataclass(frozen=True)
class Input:
    """One input of a model: its name, its shape with the sample (batch) axis first (None
    where the model leaves a dimension free) and its numpy dtype's name."""

    name: str
    shape: tuple
    dtype: str

    def describe(self) -> str:
        dims = ", ".join("?" if dim is None else str(dim) for dim in self.shape)
        return f"{self.name!r} ({dims}) {self.dtype}"


def get(name: str):
    """The loader module of format ``name``."""
    if name not in FORMATS:
        raise ModelFormatError(f"unknown model format {name!r} (bitdrift reads "
                               f"{', '.join(FORMATS)})")
    return importlib.import_module(f"bitdrift.formats.{name}")


def what_formats() -> str:
    return ", ".join(get(name).WHAT for name in FORMATS)


def detect(path) -> str:
    """The format of the model file at ``path``, by its content; ModelFormatError (one
    line naming the file) for a missing file, a file of no format bitdrift reads, or a
    damaged one."""
    path = Path(path)
    if not path.is_file():
        raise ModelFormatError(f"{path}: model file does not exist")
    with open(path, "rb") as handle:
        head = handle.read(HEAD_BYTES)
    for name in FORMATS:
        loader = get(name)
        if loader.recognise(path, head):
            loader.check(path)
            return name
    raise ModelFormatError(f"{path}: not a model bitdrift reads (it is none of: "
                           f"{what_formats()})")


def signature(path, format: str | None = None) -> list[Input]:
    return get(format or detect(path)).signature(path)


def runtimes(format: str) -> tuple:
    """The runtimes that run a model of ``format`` (bitdrift.runtimes.FORMAT_RUNTIMES)."""
    return FORMAT_RUNTIMES[get(format).NAME]


# The extension a model file made later is planned by (its job then checks its content)
PLANNED_SUFFIXES = {".onnx": "onnx", ".pt2": "pt2", ".tflite": "tflite"}


def planned_format(path) -> str:
    """The format of a model file for planning the workflow's jobs: by content where the
    file exists; a file a rule makes later (a trained model, an example) by its extension
    (keras unless .onnx, .pt2 or .tflite), and its job checks its content."""
    if Path(path).is_file():
        return detect(path)
    return PLANNED_SUFFIXES.get(Path(path).suffix.lower(), "keras")


def check_inputs(inputs_path, model_path, format: str | None = None,
                 samples: list[int] | None = None) -> list[Input]:
    """A user's inputs file (``inputs:``) against the model's signature, each mismatch one
    line naming both: the number of inputs (a model of several takes a .npz of one array
    per input, by the input's name: a missing or extra array is named), the dtype, and
    every dimension but the sample axis (a dimension the model leaves free takes the
    input's own size; the sample axis is the batch, which each device sets). Inputs
    holding NaN or Inf are refused: a non-finite input propagates through every layer,
    and the classes would compare how runtimes treat NaN, not how they round. Returns the
    signature. A prepared dataset file in place of the inputs file (a model quantized from
    a Keras model reads its float model's dataset) is checked by its test images' shape,
    float32 (bitdrift prepared them, finite)."""
    from bitdrift.inputs.datasets import (
        NamedInputs,
        is_inputs_file,
        read_inputs,
        sample_count,
        sample_shape,
    )

    if not is_inputs_file(inputs_path):
        return _check_test_set(inputs_path, model_path, format, samples)
    inputs = read_inputs(inputs_path)
    if samples is not None:
        from bitdrift.inputs.datasets import _check_indices

        _check_indices(inputs_path, samples, sample_count(inputs), "; config key samples")
    expected = signature(model_path, format)
    takes = "; ".join(i.describe() for i in expected) or "none read"
    if not isinstance(inputs, NamedInputs):
        found = f"{inputs_path}: inputs of shape {sample_shape(inputs)}"
        if len(expected) != 1:
            raise ModelFormatError(f"{found}, but model {model_path} takes {len(expected)} "
                                   f"inputs ({takes}): give a .npz of one array per input, "
                                   "named as the input")
        _check_array(inputs_path, inputs, expected[0], f"{found}, but model {model_path} "
                                                       f"takes input {expected[0].describe()}")
        return expected
    names = [wanted.name for wanted in expected]
    missing = [name for name in names if name not in inputs]
    extra = [name for name in inputs if name not in names]
    if missing or extra:
        said = [f"no array for input {', '.join(map(repr, missing))}"] if missing else []
        said += [f"{'arrays' if len(extra) > 1 else 'array'} {', '.join(map(repr, extra))} "
                 f"{'are' if len(extra) > 1 else 'is'} no input's"] if extra else []
        raise ModelFormatError(f"{inputs_path}: {'; '.join(said)} (model {model_path} takes "
                               f"{takes}; the file holds {inputs.describe()})")
    for wanted in expected:
        array = inputs[wanted.name]
        _check_array(inputs_path, array, wanted, f"{inputs_path}: array {wanted.name!r} of "
                     f"shape {sample_shape(array)}, but model {model_path} takes input "
                     f"{wanted.describe()}")
    return expected


def _check_test_set(dataset_path, model_path, format, samples) -> list[Input]:
    """A prepared dataset's test images (float32, NHWC) against the model's one input."""
    from bitdrift.inputs.datasets import _check_indices, count_test_images, test_image_shape

    shape = test_image_shape(dataset_path)
    if samples is not None:
        _check_indices(dataset_path, samples, count_test_images(dataset_path),
                       "; config key samples")
    expected = signature(model_path, format)
    found = f"{dataset_path}: test images of shape ({', '.join(['samples', *map(str, shape)])})" \
            " float32"
    takes = "; ".join(i.describe() for i in expected) or "none read"
    if len(expected) != 1:
        raise ModelFormatError(f"{found}, but model {model_path} takes {len(expected)} "
                               f"inputs ({takes}): give its own `inputs` (.npz)")
    wanted = expected[0]
    if len(wanted.shape) != len(shape) + 1 or wanted.dtype != "float32" or any(
            dim is not None and dim != size
            for dim, size in zip(wanted.shape[1:], shape, strict=True)):
        raise ModelFormatError(f"{found}, but model {model_path} takes input {takes}")
    return expected


def _check_array(inputs_path, inputs, wanted: Input, mismatch: str) -> None:
    """One array of inputs against one input of the signature: ``mismatch`` where its
    rank, a fixed dimension or its dtype differ; NaN and Inf refused."""
    import numpy as np

    fits = len(wanted.shape) == inputs.ndim and all(
        dim is None or dim == size for dim, size in zip(wanted.shape[1:], inputs.shape[1:],
                                                         strict=False))
    if not fits or wanted.dtype != inputs.dtype.name:
        raise ModelFormatError(mismatch)
    if np.issubdtype(inputs.dtype, np.floating):
        bad = ~np.isfinite(np.asarray(inputs, dtype=np.float64).reshape(inputs.shape[0], -1))
        rows = np.flatnonzero(bad.any(axis=1))
        if rows.size:
            raise ModelFormatError(f"{inputs_path}: {int(bad.sum())} NaN or Inf values in "
                                   f"{rows.size} samples (the first: sample {int(rows[0])}); "
                                   "refused, since every output would compare how runtimes "
                                   "propagate NaN, not how they round")


def check_runtime_inputs(format: str, backend: str, inputs: list[Input], model_path) -> None:
    """A model of several inputs runs on the runtimes that feed each by its name
    (bitdrift.runtimes.SEVERAL_INPUTS); another refuses it in one line naming them."""
    several = SEVERAL_INPUTS.get(get(format).NAME, ())  # Keras: inputs come from a dataset
    if len(inputs) > 1 and backend not in several:
        raise ModelFormatError(f"backend {backend!r} feeds models of one input; {model_path} "
                               f"takes {len(inputs)} ({', '.join(i.name for i in inputs)}): "
                               f"runtimes that feed several: {', '.join(several) or 'none yet'}")


def file_layers(path) -> list[dict] | None:
    """The model's layers with their weights (bitdrift.inputs.models.keras_file_layers' shape),
    whatever its format; None where its loader has no such reading."""
    loader = get(detect(path))
    return loader.file_layers(path) if loader.file_layers is not None else None
