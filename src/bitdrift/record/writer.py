"""Writing an inference record (the format: bitdrift.record.hdf5): RecordWriter, tensor by
tensor in bounded memory and atomically; write_record, a whole record at once; and
write_failure, the record of a device that did not run.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

import h5py
import numpy as np

from bitdrift.atomic import atomic_output
from bitdrift.errors import OutputError, RecordError
from bitdrift.record.hdf5 import (
    BFLOAT16_ATTR,
    CHECKSUM,
    COMPRESSION,
    DEPLOYED,
    DIGESTS,
    FAILED,
    FAILURE_ATTRS,
    FORMAT_VERSION,
    KERNELS,
    LIBVER,
    OUTPUT,
    REPEAT_DIGEST,
    REQUIRED_ATTRS,
    Tensor,
    _sanitize,
    as_storable,
    output_digest,
    tensor_of,
)


def write_record(path: str | Path, attrs: dict, samples: dict[int, dict],
                 kernels: dict | None = None, full_samples=None) -> None:
    """Write a record atomically (format 4, through :class:`RecordWriter`).

    ``samples`` maps test-set index -> {"output": array (repeats, ...),
    "layers": [(name, array (repeats, ...)), ...] in model order, optional "deployed":
    array (repeats, ...) of the model as deployed, optional "layer_classes": [Keras class
    name per layer], optional "bfloat16": True when the arrays are already raw bfloat16
    bits (uint16)}. ``kernels``: the traced repeat's
    kernels (bitdrift.analysis.kernels), stored as JSON text in the dataset ``kernels``.
    ``full_samples``: the samples whose layers keep their values (None: all); the others'
    layers keep their digests only, their final outputs in full.
    """
    with RecordWriter(path) as writer:
        writer.set_attrs(attrs)
        if full_samples is not None and set(map(int, samples)) - set(full_samples):
            writer.set_attrs({"full_samples": json.dumps(sorted(map(int, full_samples)))})
        if kernels is not None:
            writer.set_kernels(kernels)
        for index, content in samples.items():
            raw_bf16 = bool(content.get("bfloat16", False))
            keep = full_samples is None or int(index) in full_samples
            tensors = [(OUTPUT, content[OUTPUT], {"final": True})]
            if DEPLOYED in content:
                tensors.append((DEPLOYED, content[DEPLOYED], {"final": True}))
            classes = content.get("layer_classes") or [""] * len(content.get("layers", []))
            for position, ((name, values), layer_class) in enumerate(
                    zip(content.get("layers", []), classes, strict=True)):
                tensors.append((name, values, {"position": position,
                                               "class_name": layer_class, "values": keep}))
            for name, values, options in tensors:
                values = np.asarray(values)
                tensor = writer.tensor(index, name, bfloat16=raw_bf16 or
                                       values.dtype.name == "bfloat16", **options)
                for repeat in values:
                    tensor.add(repeat)
                tensor.close()
        if not samples:
            writer.file.require_group("samples")


class _DiskGuard:
    """The file object h5py writes the record through (its ``fileobj`` driver). A write
    the disk refuses (full, quota) is remembered and the rest dropped, not handed back to
    HDF5: HDF5 cannot recover from a failed write (h5py crashed tearing the file down,
    exit 139). The writer checks :attr:`error` after each tensor and at the end, and the
    temporary file is removed."""

    def __init__(self, path: Path):
        self._raw = open(path, "w+b", buffering=0)
        self.error: OSError | None = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        if self.error is None:
            try:
                while len(view):
                    view = view[self._raw.write(view):]
            except OSError as error:
                self.error = error
        return size

    def truncate(self, size=None):
        try:
            return self._raw.truncate(size)
        except OSError as error:
            self.error = self.error or error
            return size

    def readinto(self, buffer):
        return self._raw.readinto(buffer)

    def read(self, size=-1):
        return self._raw.read(size)

    def seek(self, *args):
        return self._raw.seek(*args)

    def tell(self):
        return self._raw.tell()

    def flush(self):
        pass

    def close(self):
        if self.error is None:
            try:
                os.fsync(self._raw.fileno())
            except OSError as error:
                self.error = error
        self._raw.close()


class TensorWriter:
    """One tensor of a record (a sample's layer or final output), written a repeat at a
    time: a repeat bit-identical to one already written adds its digest's row only."""

    def __init__(self, writer: RecordWriter, group: h5py.Group, name: str, attrs: dict,
                 values: bool, bfloat16: bool):
        self._writer, self._group, self._name, self._attrs = writer, group, name, attrs
        self.values, self.bfloat16 = values, bfloat16
        self._dataset = None
        self._rows: dict[bytes, int] = {}
        self.repeat_digest: list[int] = []

    @property
    def digests(self) -> list[bytes]:
        """Per repeat written, its SHA-256 (output_digest)."""
        distinct = list(self._rows)
        return [distinct[row] for row in self.repeat_digest]

    def add(self, values: np.ndarray) -> bytes:
        """One repeat's values (the tensor's shape, without the repeats axis); returns its
        digest."""
        values, is_bf16 = as_storable(np.ascontiguousarray(values))
        self.bfloat16 = self.bfloat16 or is_bf16
        digest = output_digest(values, "bfloat16" if self.bfloat16 else values.dtype.name)
        if self._dataset is None:
            self._dataset = self._group.create_dataset(
                self._name, shape=(0, *values.shape), maxshape=(None, *values.shape),
                dtype=values.dtype, chunks=(1, *values.shape) if values.size else None,
                **(CHECKSUM | COMPRESSION if values.size else {}))
        elif values.shape != self._dataset.shape[1:] or values.dtype != self._dataset.dtype:
            raise RecordError(f"{self._writer.path}: {self._dataset.name}: a repeat of "
                              f"{values.dtype} {values.shape}, the first was "
                              f"{self._dataset.dtype} {self._dataset.shape[1:]}")
        row = self._rows.get(digest)
        if row is None:
            row = self._rows[digest] = len(self._rows)
            if self.values:
                self._dataset.resize(row + 1, axis=0)
                self._dataset[row] = values
        self.repeat_digest.append(row)
        return digest

    def add_digest(self, digest: bytes, shape, dtype) -> None:
        """One repeat known by its digest alone (its values computed and hashed elsewhere),
        for a tensor of digests only: ``shape`` and ``dtype`` those of its values."""
        if self.values:
            raise RecordError(f"{self._writer.path}: {self._group.name}/{self._name}: a "
                              "digest without values for a tensor that keeps its values")
        if self._dataset is None:
            shape = tuple(shape)
            self._dataset = self._group.create_dataset(
                self._name, shape=(0, *shape), maxshape=(None, *shape), dtype=np.dtype(dtype),
                chunks=(1, *shape) if all(shape) else None,
                **(CHECKSUM | COMPRESSION if all(shape) else {}))
        self.repeat_digest.append(self._rows.setdefault(bytes(digest), len(self._rows)))

    def close(self) -> None:
        if self._dataset is None:
            raise RecordError(f"{self._writer.path}: {self._group.name}/{self._name}: no "
                              "repeat written")
        attrs = self._dataset.attrs
        for key, value in self._attrs.items():
            attrs[key] = value
        if self.bfloat16:
            attrs[BFLOAT16_ATTR] = True
        attrs[DIGESTS] = np.frombuffer(b"".join(self._rows), np.uint8).reshape(-1, 32)
        attrs[REPEAT_DIGEST] = np.asarray(self.repeat_digest, np.int32)
        self._writer.check_disk()


class RecordWriter:
    """A record written tensor by tensor, in bounded memory, atomically: a temporary file
    beside ``path``, renamed into place when the block ends without error (a job stopped
    midway, or a full disk, leaves no file that looks complete; the disk is one line,
    OutputError)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._stack = contextlib.ExitStack()
        self._attrs: dict = {}

    def __enter__(self) -> RecordWriter:
        try:
            tmp = self._stack.enter_context(atomic_output(self.path))
            self._guard = _DiskGuard(tmp)
            self.file = h5py.File(self._guard, "w", libver=LIBVER)
            self._samples = self.file.create_group("samples")
        except BaseException:
            self._stack.close()
            raise
        return self

    def set_attrs(self, attrs: dict) -> None:
        """Root attributes (written as they come; the required ones checked at the end)."""
        for key, value in attrs.items():
            self.file.attrs[key] = json.dumps(value, sort_keys=True) \
                if key == "fingerprint" else value
            self._attrs[key] = value

    def set_kernels(self, kernels: dict) -> None:
        # A dataset, not an attribute: HDF5 keeps attributes under 64 KiB.
        self.file.create_dataset(KERNELS, data=json.dumps(kernels, sort_keys=True))

    def tensor(self, sample: int, name: str, *, final: bool = False, position: int = 0,
               class_name: str = "", values: bool = True,
               bfloat16: bool = False) -> TensorWriter:
        """The writer of one tensor: ``final`` the sample's ``output`` or ``deployed``,
        else its layer ``name`` at ``position``; ``values=False`` keeps its digests only
        (a final output is always kept in full)."""
        group = self._samples.require_group(str(int(sample)))
        if final:
            return TensorWriter(self, group, name, {}, True, bfloat16)
        attrs = {"position": position, "name": name}
        if class_name:
            attrs["class_name"] = class_name
        return TensorWriter(self, group.require_group("layers"), _sanitize(name), attrs,
                            values, bfloat16)

    def read(self, sample: int, name: str, final: bool = False) -> Tensor:
        """A tensor written so far (the inference's checks read back what it wrote)."""
        where = f"samples/{int(sample)}" + (f"/{name}" if final else
                                            f"/layers/{_sanitize(name)}")
        return tensor_of(self.file[where], self.path)

    def set_quantization(self, quantization: dict, samples) -> None:
        """A quantized model's integer layers' scales and zero points as their datasets'
        attributes, per sample ({layer: {key: [numbers] or {"layer": name}}},
        bitdrift.backends.exported.onnx_file.quantization_params): a constant as it is; a
        per-batch value (a DynamicQuantizeLinear's scale) as the name of the layer that
        holds it (``<key>_layer``) and, where that layer keeps its values, the sample's
        value in its first repeat."""
        for sample in samples:
            layers = self._samples.get(f"{int(sample)}/layers")
            if layers is None:
                continue
            for layer, params in quantization.items():
                dataset = layers.get(_sanitize(layer))
                if dataset is None:
                    continue
                for key, value in params.items():
                    if isinstance(value, dict):
                        dataset.attrs[f"{key}_layer"] = value["layer"]
                        holder = layers.get(_sanitize(value["layer"]))
                        if holder is not None and holder.shape[0]:
                            dataset.attrs[key] = np.asarray(holder[0])
                    else:
                        dataset.attrs[key] = np.asarray(value)

    def check_disk(self) -> None:
        """OutputError if the disk has refused a write (see _DiskGuard)."""
        if self._guard.error is not None:
            error = self._guard.error
            raise OutputError(f"{self.path}: cannot be written ("
                              f"{os.strerror(error.errno or errno.EIO)}); no record was left")

    def __exit__(self, kind, error, traceback):
        if kind is not None:  # the temporary file goes, whatever HDF5 makes of the close
            with contextlib.suppress(Exception):
                self.file.close()
            self._guard.close()
            return self._stack.__exit__(kind, error, traceback)
        with self._stack:  # an error raised here removes the temporary file too
            missing = [key for key in REQUIRED_ATTRS if key not in self._attrs]
            if not missing:
                self.file.attrs["format_version"] = FORMAT_VERSION
            self.file.close()
            self._guard.close()
            if missing:
                raise RecordError(f"{self.path}: cannot write record, missing attributes "
                                  f"{missing}")
            self.check_disk()
        return None


def write_failure(path: str | Path, attrs: dict, reason: str) -> None:
    """A failure record at ``path`` (atomically): the device did not produce a result."""
    with atomic_output(path) as tmp, h5py.File(tmp, "w") as handle:
        for key in FAILURE_ATTRS:
            handle.attrs[key] = str(attrs.get(key, ""))
        handle.attrs[FAILED] = reason
        handle.attrs["format_version"] = FORMAT_VERSION
