"""The TensorFlow reference of an exported model and the checks an exported runtime makes
against it: the formats and who reads them, the reference file (``reference.npz``, which
bitdrift.backends.keras.export writes), the mapping of a runtime's outputs to the Keras layers, and
the
one-line errors of a damaged or wrong-format exported file. Below both
bitdrift.backends.keras.export
(which writes the files) and bitdrift.backends (whose exported runtimes read them).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bitdrift.errors import InferenceError, RecordError

# Format -> (Keras' export format, the runtimes that read it).
FORMATS = {"onnx": ("onnx", ("onnxruntime", "openvino")),  # suffix: (Keras format, readers)
           "tflite": ("litert", ("litert",))}
# A runtime's layer output matches the reference within this share of the layer's largest
# magnitude: float32 runtimes differ by ~1e-6 of it, another layer's values by ~1.
MAPPING_TOLERANCE = 1e-3
# A runtime computing in a narrower format (OpenVINO's bfloat16 default on a CPU with
# native bf16: 2e-3 to 6e-3 on cifar10_small) still maps within 16 units of bfloat16's
# rounding (2**-8) of the layer's largest magnitude; a wrong export's values are ~1 off.
REDUCED_MAPPING_TOLERANCE = 16 * 2.0**-8



@dataclass
class Reference:
    layers: list[tuple[str, str]]
    checked: dict  # {layer: (spec, weights)}
    check_indices: list[int]
    # per recorded layer, on the check images: its outputs, or of a large layer every
    # check_strides[position]-th value of each image's
    # (bitdrift.backends.keras.export.write_reference)
    check_outputs: list[np.ndarray]
    argmax_indices: list[int]
    argmax: np.ndarray
    model_sha256: str
    # Where some layer is sampled: each layer's full shape, stride (1: every value) and
    # largest magnitude; None for a reference that keeps every value (older ones too)
    check_shapes: list[list[int]] | None = None
    check_strides: list[int] | None = None
    check_scales: list[float] | None = None

    def check_shape(self, position: int) -> tuple:
        """The full shape of a layer's outputs on the check images."""
        if self.check_shapes is None:
            return tuple(self.check_outputs[position].shape)
        return tuple(self.check_shapes[position])

    def stride(self, position: int) -> int:
        return 1 if self.check_strides is None else int(self.check_strides[position])


REBUILD = "make it again with `snakemake --forcerun"
# A LiteRT (TFLite) FlatBuffer carries its file identifier at bytes 4-8.
TFLITE_IDENTIFIER = b"TFL3"


def check_export_file(path: str | Path, runtime: str) -> None:
    """The exported file a runtime is about to read: missing, empty, or the other format
    (an ONNX file given to LiteRT, a .tflite to ONNX Runtime) is one line naming the file,
    what it should be and how to make it again. (A damaged file of the right kind is
    caught where the runtime parses it: bitdrift.backends.exported.common.)"""
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


# The reference's meta as export_model writes it, read below
META_TYPES = {"layers": list, "checked": dict, "check_indices": list, "argmax_indices": list,
              "model_sha256": str}


def read_reference(path: str | Path) -> Reference:
    """The reference ``export_model`` wrote; RecordError naming the file if it is not one."""
    try:
        with np.load(path) as data:
            meta = json.loads(str(data["meta"]))
            if not isinstance(meta, dict) or not all(
                    isinstance(meta.get(key), kind) for key, kind in META_TYPES.items()):
                raise ValueError(f"its meta is not {{{', '.join(META_TYPES)}}} of JSON types "
                                 f"{', '.join(kind.__name__ for kind in META_TYPES.values())}")
            sampled = _sampled_meta(meta, len(meta["layers"]))
            check = [data[f"check/{position}"] for position in range(len(meta["layers"]))]
            weights = {key: data[key] for key in data.files if key.startswith("weights/")}
            argmax = data["argmax"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise RecordError(f"{path}: not a bitdrift export reference, damaged or of another "
                          f"kind ({type(error).__name__}: {error}); {REBUILD} "
                          "export_reference`") from error
    checked = {layer: (spec, [weights[f"weights/{layer}/{index}"]
                              for index in range(_count(weights, layer))])
               for layer, spec in meta["checked"].items()}
    return Reference(layers=[tuple(layer) for layer in meta["layers"]], checked=checked,
                     check_indices=meta["check_indices"], check_outputs=check,
                     argmax_indices=meta["argmax_indices"], argmax=argmax,
                     model_sha256=meta["model_sha256"], **sampled)


def _sampled_meta(meta: dict, layers: int) -> dict:
    """The meta of a reference whose large layers are sampled (check_shapes, _strides,
    _scales: a list per layer each, all or none); {} for one without (older ones)."""
    keys = ("check_shapes", "check_strides", "check_scales")
    if not any(key in meta for key in keys):
        return {}
    if not all(isinstance(meta.get(key), list) and len(meta[key]) == layers for key in keys):
        raise ValueError(f"its meta's {', '.join(keys)} are not a list per layer each")
    if not all(isinstance(stride, int) and stride >= 1 for stride in meta["check_strides"]):
        raise ValueError("its meta's check_strides are not counts")
    return {key: meta[key] for key in keys}


def _count(weights: dict, layer: str) -> int:
    return sum(1 for key in weights if key.rsplit("/", 1)[0] == f"weights/{layer}")


def mapped_positions(outputs: list[np.ndarray], reference: Reference) -> list[str | None]:
    """Per recorded layer: whether the runtime's output at that position is the layer's
    (same shape): ``float32`` within MAPPING_TOLERANCE of the layer's largest magnitude,
    ``reduced`` only within REDUCED_MAPPING_TOLERANCE (a runtime computing in a narrower
    format: the effective-precision check names which), None for values unrelated to the
    layer (a wrong export). Of a layer the reference samples, the values it kept are
    compared, against the layer's largest magnitude."""
    mapped = []
    for position, (value, expected) in enumerate(zip(outputs, reference.check_outputs,
                                                     strict=True)):
        stride = reference.stride(position)
        if np.shape(value) != reference.check_shape(position):
            mapped.append(None)
            continue
        if stride > 1:  # a large layer: the values the reference kept, at its scale
            value = np.asarray(value).reshape(len(value), -1)[:, ::stride]
        value = np.asarray(value, dtype=np.float64)
        expected = np.asarray(expected, dtype=np.float64)
        scale = max(reference.check_scales[position] if stride > 1 else
                    float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-30)
        error = float(np.max(np.abs(value - expected))) / scale if value.size else 0.0
        mapped.append("float32" if error <= MAPPING_TOLERANCE else
                      "reduced" if error <= REDUCED_MAPPING_TOLERANCE else None)
    return mapped
