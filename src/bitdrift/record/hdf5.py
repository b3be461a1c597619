"""The inference record: one HDF5 file per (model, device). This is a public format.

Layout (documented in docs/record-format.md):

    /                       attrs: model, device, backend, precision, fingerprint (JSON),
                                   model_sha256, input_sha256, format_version,
                                   optional effective_precision (JSON, format 2)
    /kernels                optional (format 3): JSON text, the traced repeat's kernel
                            calls per layer (bitdrift.analysis.kernels)
    /samples/<index>/output dataset (repeats, *output_shape): the instrumented run's
    /samples/<index>/deployed
                            optional: dataset (repeats, *output_shape), the final output
                            of the model as deployed (the observer check,
                            bitdrift.analysis.observer);
                            where present, it is the final output the analyses read
    /samples/<index>/layers/<layer>
                            dataset (repeats, *layer_shape), attr position (int), attr name

Values are stored with the dtype they were computed in (float16/32/64; a quantized
model's integer layers as uint8/int8 codes and int32 accumulators, with attributes
``scale`` and ``zero_point``, or the zero points of a MatMulInteger's operands, where the
graph gives them, ``scale_layer`` naming the layer holding a per-batch scale). bfloat16 has no
numpy dtype, so its raw bits are stored as uint16 with the attribute ``bfloat16_raw_bits``.

Format 4: each tensor's dataset holds its distinct repeats once (in order of first
appearance), attribute ``sha256`` their digests (distinct, 32) and ``repeat_digest`` the
row of each repeat; a tensor kept as digests only (a sample outside
``analysis.full_samples``) has 0 rows. Byte shuffle and gzip. Read back as
(repeats, *shape) as before.

Here: the format's names and constants, and a tensor's encoding (output_digest,
as_storable) and decoding (tensor_of); writing a record is bitdrift.record.writer's,
reading records bitdrift.record.reader's.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import h5py
import numpy as np

from bitdrift.errors import RecordError

# 2: the effective-precision check (root attribute effective_precision); version-1
# records are read as before, the check reported as unchecked.
# 3: the kernels dataset (kernel provenance); records without it are read as before.
# 4: each distinct repeat stored once, its digest per repeat (DIGESTS, REPEAT_DIGEST);
# tensors of digests only; shuffle + gzip. Records 1-3 are read as before.
FORMAT_VERSION = 4
KERNELS = "kernels"
REQUIRED_ATTRS = ("model", "device", "backend", "precision", "fingerprint", "model_sha256",
                  "input_sha256")
BFLOAT16_ATTR = "bfloat16_raw_bits"
# HDF5's Fletcher-32 filter: one flipped bit in a stored value is refused on reading
# instead of adding a class silently. Records written without it are still read.
CHECKSUM = {"fletcher32": True}
# Lossless compression of floats: HDF5's byte shuffle puts the bytes of equal significance
# together (exponents, then mantissa bytes), which gzip then finds (docs/record-format.md
# has the ratios measured). Built into every HDF5: another tool reads it without a plugin.
COMPRESSION = {"shuffle": True, "compression": "gzip", "compression_opts": 1}
# Format 4, per tensor: the SHA-256 (output_digest) of each distinct repeat, (distinct, 32)
# uint8, and per repeat its row there, which is also its row of the dataset where the
# values are stored (a dataset of 0 rows holds the digests only).
DIGESTS = "sha256"
# HDF5 1.10's object headers and chunk indexes (readable by HDF5 >= 1.10, 2016): a record of
# many small layers took 44 % less room than with the 1.8 layout (docs/record-format.md).
LIBVER = ("v110", "latest")
REPEAT_DIGEST = "repeat_digest"
OUTPUT = "output"
# The observer check (bitdrift.analysis.observer): the final output of the model as deployed (final
# output only, the runtime's own graph optimisations) beside the instrumented run's
DEPLOYED = "deployed"
OBSERVER_ATTR = "observer_check"
# A quantized layer's integer outputs, kept with their own dtype (issue 65)
INTEGER_DTYPES = ("uint8", "int8", "int32")
SAMPLE_NAME = re.compile(r"0|[1-9][0-9]*")


@dataclass
class Tensor:
    """One recorded tensor: all repeats of one layer (or the output) for one sample."""

    values: np.ndarray  # (repeats, *shape); bfloat16 as uint16 raw bits
    bfloat16: bool = False

    @property
    def float_format(self) -> str:
        return "bfloat16" if self.bfloat16 else self.values.dtype.name


class DigestOnly(RecordError):
    """A tensor recorded as digests only (format 4, outside analysis.full_samples)."""


def output_digest(values: np.ndarray, float_format: str) -> bytes:
    """SHA-256 of one output's float format, shape and bytes: equal digests, bit-identical
    outputs (the identity eqc's classes use; bitdrift.atlas.digest_index indexes it)."""
    values = np.ascontiguousarray(values)
    digest = hashlib.sha256(f"{float_format}:{values.shape}:".encode())
    digest.update(memoryview(values.reshape(-1).view(np.uint8)))
    return digest.digest()


def _sanitize(name: str) -> str:
    # HDF5 uses "/" as the path separator; Keras names may contain it in nested models.
    return name.replace("/", "__")


def as_storable(values: np.ndarray) -> tuple[np.ndarray, bool]:
    if values.dtype.name == "bfloat16":
        return values.view(np.uint16), True
    return values, False


# A failure record: the root attribute ``failed`` holds why the device did not run, with
# model, device and backend; it has no samples. The job that makes it succeeds, so the
# other devices' tables are built; the analysis leaves it out and names it, and the run
# ends non-zero naming it (bitdrift.record.failures).
FAILED = "failed"
FAILURE_ATTRS = ("model", "device", "backend", "log")


class FailedDevice(RecordError):
    """A failure record where a record was expected."""


# What h5py raises for an object whose header it cannot read (a damaged file)
UNREADABLE = (KeyError, OSError, RuntimeError, ValueError)


def member(group, name: str, path):
    """The object ``name`` (a name or a path below ``group``); None where there is no such
    name. A name that is there but whose object cannot be opened (its header damaged) is a
    RecordError naming the file and the object: h5py's ``get`` says None for both, and the
    reader would call a damaged dataset missing."""
    try:
        return group[name]
    except UNREADABLE as error:
        try:
            listed = name in group
        except UNREADABLE:
            listed = True  # the name's own group is damaged
        if not listed:
            return None
        where = f"{group.name.rstrip('/')}/{name}".lstrip("/")
        raise RecordError(f"{path}: {where} cannot be read: its object header is damaged "
                          f"({_first_line(error)})") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().strip("'\"")
    return (text.splitlines() or [type(error).__name__])[0][:200]


def has_attr(dataset, name: str) -> bool:
    return h5py.h5a.exists(dataset.id, name.encode())


def digest_attrs(dataset, path) -> tuple[list[bytes], np.ndarray]:
    """(distinct digests, row per repeat) of a format-4 tensor, checked."""
    distinct = np.asarray(dataset.attrs[DIGESTS]) if has_attr(dataset, DIGESTS) else None
    rows = np.asarray(dataset.attrs[REPEAT_DIGEST])
    if distinct is None or distinct.ndim != 2 or distinct.shape[1] != 32 or \
            distinct.dtype != np.uint8 or rows.ndim != 1 or rows.size < 1 or \
            rows.dtype.kind not in "iu" or rows.min() < 0 or rows.max() >= len(distinct) \
            or dataset.shape[0] not in (0, len(distinct)):
        raise RecordError(f"{path}: {dataset.name}: attributes {DIGESTS!r} and "
                          f"{REPEAT_DIGEST!r} do not describe its {dataset.shape[0]} rows")
    return [row.tobytes() for row in distinct], rows


def tensor_of(dataset, path) -> Tensor:
    """A dataset's tensor, (repeats, *shape): a format-4 tensor's distinct rows spread to
    its repeats; a tensor of digests only is DigestOnly."""
    is_bf16 = _is_bfloat16(dataset)
    rows = None
    if has_attr(dataset, REPEAT_DIGEST):
        distinct, rows = digest_attrs(dataset, path)
        if dataset.shape[0] == 0:
            raise DigestOnly(f"{path}: {dataset.name} holds the digests of its values only "
                             "(a sample outside analysis.full_samples)")
    try:
        values = dataset[()]
    except OSError as error:  # Fletcher-32 mismatch, or a truncated file
        raise RecordError(f"{path}: {dataset.name} cannot be read: corrupt ({error})") from error
    if is_bf16 and values.dtype != np.uint16:
        raise RecordError(f"{path}: {dataset.name} is marked bfloat16 but is stored as "
                          f"{values.dtype}")
    # a quantized layer's integers are kept as they are (uint8/int8 codes, int32
    # accumulators); anything else is no tensor of a model
    if not is_bf16 and values.dtype.kind != "f" and values.dtype.name not in INTEGER_DTYPES:
        raise RecordError(f"{path}: {dataset.name} has dtype {values.dtype}, neither float "
                          f"nor a quantized layer's ({', '.join(INTEGER_DTYPES)})")
    if rows is not None and not (len(rows) == len(values) and
                                 np.array_equal(rows, np.arange(len(rows)))):
        values = values[rows]  # each distinct repeat was stored once
    return Tensor(values, bfloat16=is_bf16)


def _is_bfloat16(dataset) -> bool:
    # Asking whether the attribute exists costs ~1 us, reading the attribute set ~7 us,
    # and the analysis asks once per dataset of every file.
    return h5py.h5a.exists(dataset.id, BFLOAT16_ATTR.encode()) and \
        bool(dataset.attrs[BFLOAT16_ATTR])
