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

Values are stored with the dtype they were computed in (float16/32/64). bfloat16 has no
numpy dtype, so its raw bits are stored as uint16 with the attribute ``bfloat16_raw_bits``.

Format 4: each tensor's dataset holds its distinct repeats once (in order of first
appearance), attribute ``sha256`` their digests (distinct, 32) and ``repeat_digest`` the
row of each repeat; a tensor kept as digests only (a sample outside
``analysis.full_samples``) has 0 rows. Byte shuffle and gzip. Read back as
(repeats, *shape) as before.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from bitdrift.atomic import atomic_output
from bitdrift.errors import OutputError, RecordError, json_kind

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
SAMPLE_NAME = re.compile(r"0|[1-9][0-9]*")
# HDF5 keeps ~25 KB per dataset read until its file is closed. The analysis reads every
# layer of every record, so a record renews its handle after this many reads: memory
# stays bounded by one layer over all devices instead of growing with the layers, for
# ~2 % of the read time (64 records of 256 KB layers).
READS_PER_HANDLE = 16


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


def _as_storable(values: np.ndarray) -> tuple[np.ndarray, bool]:
    if values.dtype.name == "bfloat16":
        return values.view(np.uint16), True
    return values, False


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
        values, is_bf16 = _as_storable(np.ascontiguousarray(values))
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
        return _tensor_of(self.file[where], self.path)

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


# A failure record: the root attribute ``failed`` holds why the device did not run, with
# model, device and backend; it has no samples. The job that makes it succeeds, so the
# other devices' tables are built; the analysis leaves it out and names it, and the run
# ends non-zero naming it (bitdrift.record.failures).
FAILED = "failed"
FAILURE_ATTRS = ("model", "device", "backend", "log")


class FailedDevice(RecordError):
    """A failure record where a record was expected."""


def write_failure(path: str | Path, attrs: dict, reason: str) -> None:
    """A failure record at ``path`` (atomically): the device did not produce a result."""
    with atomic_output(path) as tmp, h5py.File(tmp, "w") as handle:
        for key in FAILURE_ATTRS:
            handle.attrs[key] = str(attrs.get(key, ""))
        handle.attrs[FAILED] = reason
        handle.attrs["format_version"] = FORMAT_VERSION


def read_failure(path: str | Path) -> dict | None:
    """{model, device, backend, log, reason, path} of a failure record; None for anything
    else (a record, a missing or unreadable file)."""
    try:
        with h5py.File(path, "r") as handle:
            if FAILED not in handle.attrs:
                return None
            found = {key: _text(handle.attrs.get(key, "")) for key in FAILURE_ATTRS}
            return {**found, "reason": _text(handle.attrs[FAILED]), "path": str(path)}
    except OSError:
        return None


@dataclass
class LayerInfo:
    name: str  # dataset name inside the file
    position: int
    class_name: str = ""  # optional attribute: the Keras layer class
    final: bool = False  # the final output (samples/<i>/output), not a layer

    @property
    def label(self) -> str:
        """The name in the tables: the final output is `output`; a layer that is itself
        named `output` (bring-your-own models) is `layers/output`, so the two never mix."""
        if self.final:
            return OUTPUT
        return f"layers/{self.name}" if self.name == OUTPUT else self.name


class Record:
    """Read access to one inference record, validated on open.

    Tensors are read lazily one at a time so analyses can stream layer by layer.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._layers: dict[int, list[LayerInfo]] = {}
        self._groups: dict[tuple[int, bool], h5py.Group] = {}  # see _sample_group
        self._reads = 0  # tensors read on the current handle (see READS_PER_HANDLE)
        if not self.path.exists():
            raise RecordError(f"{self.path}: inference record does not exist")
        try:
            self._file = _open_for_reading(self.path)
        except OSError as error:
            raise RecordError(f"{self.path}: not a readable HDF5 file ({error})") from error
        try:
            self._validate()
        except Exception:
            self._file.close()
            raise

    def _fail(self, message: str) -> RecordError:
        return RecordError(f"{self.path}: {message}")

    def _validate(self) -> None:
        # Root attributes read once: the analysis asks for model, device and precision
        # per layer, and each HDF5 attribute read costs far more than a dict look-up.
        attrs = {key: value for key, value in self._file.attrs.items()}
        self._attrs = attrs
        if FAILED in attrs:
            raise FailedDevice(f"{self.path}: device {_text(attrs.get('device', '?'))!r} did "
                               f"not run ({_text(attrs[FAILED])}); a failure record, no result")
        missing = [key for key in REQUIRED_ATTRS if key not in attrs]
        if missing:
            raise self._fail(f"missing root attribute(s) {', '.join(missing)}")
        try:
            self.fingerprint = json.loads(_text(attrs["fingerprint"]))
        except (TypeError, ValueError) as error:
            raise self._fail(f"root attribute 'fingerprint' is not JSON ({error})") from error
        self._check_fingerprint()
        if "samples" not in self._file or not isinstance(self._file["samples"], h5py.Group):
            raise self._fail("missing group 'samples'")
        self.samples: list[int] = []
        for key, group in self._file["samples"].items():
            # A test-set index in ASCII digits without a leading zero: `01` would be a
            # second name for sample 1, and str.isdigit accepts `٦` and `²`.
            if not SAMPLE_NAME.fullmatch(key):
                raise self._fail(f"sample group name {key!r} is not a test-set index")
            output = group.get(OUTPUT) if isinstance(group, h5py.Group) else None
            if not isinstance(output, h5py.Dataset):
                raise self._fail(f"samples/{key} has no dataset 'output'")
            if output.ndim < 1 or output.shape[0] < 1:
                raise self._fail(f"samples/{key}/output must have shape (repeats >= 1, ...)")
            self.samples.append(int(key))
        if not self.samples:
            raise self._fail("group 'samples' is empty")
        self.samples.sort()

    def _check_fingerprint(self) -> None:
        self.fingerprint = checked_fingerprint(self.fingerprint, self.path)

    # -- metadata -------------------------------------------------------------------------
    def attr(self, key: str) -> str:
        return _text(self._attrs[key])

    def json_attr(self, key: str, kind: type = dict, default=None):
        """A root attribute that holds JSON of ``kind`` (dict or list), parsed and its type
        checked where it is read: a record from another tool may hold anything there, and
        is refused naming the file and the attribute. ``default`` when it is absent."""
        if not self.has_attr(key):
            return default
        try:
            found = json.loads(self.attr(key))
        except ValueError as error:
            raise self._fail(f"attribute {key!r} is not JSON ({error})") from error
        if not isinstance(found, kind):
            raise self._fail(f"attribute {key!r} is {json_kind(found)}, not {json_kind(kind())}")
        return found

    def has_attr(self, key: str) -> bool:
        return key in self._attrs

    @property
    def model(self) -> str:
        return self.attr("model")

    @property
    def device(self) -> str:
        return self.attr("device")

    @property
    def precision(self) -> str:
        return self.attr("precision")

    @property
    def kernels(self) -> dict | None:
        """The traced repeat's kernels (bitdrift.analysis.kernels), or None for a record without."""
        if "_kernels" not in self.__dict__:
            if KERNELS not in self._file:
                self._kernels = None
            else:
                try:
                    found = json.loads(_text(self._file[KERNELS][()]))
                except (TypeError, ValueError) as error:
                    raise self._fail(f"dataset 'kernels' is not JSON ({error})") from error
                self._kernels = self._checked_kernels(found)
        return self._kernels

    def _checked_kernels(self, found):
        """The kernels dataset's structure (bitdrift.run.traced_repeat): valid JSON of
        another shape is refused here, naming what is wrong, not deep in the analysis."""
        def wrong(what: str) -> RecordError:
            return self._fail(f"dataset 'kernels' is not a kernel record ({what})")

        if not isinstance(found, dict):
            raise wrong(f"a JSON {type(found).__name__}, not an object")
        layers = found.get("layers", {})
        if not isinstance(layers, dict):
            raise wrong("'layers' is not an object")
        for layer, entry in layers.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("signature", ""), str) \
                    or not isinstance(entry.get("calls", []), list) or not all(
                        isinstance(call, dict) for call in entry.get("calls", [])):
                raise wrong(f"layer {layer!r}: not {{signature: text, calls: [objects]}}")
        for key in ("order",):
            if key in found and not isinstance(found[key], list):
                raise wrong(f"{key!r} is not a list")
        unlisted = [str(name) for name in found.get("order") or []
                    if not isinstance(name, str) or name not in layers]
        if unlisted:  # the layers are read in this order (bitdrift.analysis.kernels.kernels_table)
            raise wrong(f"'order' names {', '.join(unlisted)}, which 'layers' lacks")
        for key in ("layer_classes", "header"):
            if key in found and not isinstance(found[key], dict):
                raise wrong(f"{key!r} is not an object")
        return found

    @property
    def observer_check(self) -> dict | None:
        """The observer check the inference wrote (bitdrift.analysis.observer.observer_check), or
        None for a record without the deployed output."""
        found = self.json_attr(OBSERVER_ATTR)
        if found is not None and not isinstance(found.get("program", ""), str):
            raise self._fail(f"attribute {OBSERVER_ATTR!r}: 'program' is not text")
        return found

    @property
    def value_samples(self) -> list[int]:
        """The samples whose layers hold their values (the attribute ``full_samples``, of
        a record written with analysis.full_samples); the others' layers hold digests only
        (:meth:`digests`), their final outputs in full."""
        if "_value_samples" not in self.__dict__:
            found = self.json_attr("full_samples", list)
            self._value_samples = self.samples if found is None else [
                sample for sample in self.samples if sample in set(found)]
        return self._value_samples

    def has_deployed(self, sample: int) -> bool:
        """Whether the sample holds the deployed model's final output (the observer check)."""
        return DEPLOYED in self._sample_group(sample, True)

    def instrumented_output(self, sample: int) -> Tensor:
        """The instrumented run's final output (the dataset ``output``), which
        :meth:`tensor` gives only for a record without the deployed one."""
        return self._read(sample, True, OUTPUT)

    @property
    def accumulation_orders(self) -> dict | None:
        """The order each Dense layer summed in, as revealed through the device's runtime,
        and its replay (bitdrift.analysis.accumulation); None for a record written without it."""
        if "_orders" not in self.__dict__:
            from bitdrift.record.orders import checked_orders

            self._orders = checked_orders(
                self.json_attr("accumulation_orders"), lambda what: self._fail(
                    f"attribute 'accumulation_orders' is not an order record ({what})"))
        return self._orders

    @property
    def effective_precision(self) -> dict | None:
        """The effective-precision check per Dense/Conv layer (see
        bitdrift.analysis.effective_precision), or None for a record written without it. Parsed
        once: the analysis asks for it at every layer."""
        if "_effective" not in self.__dict__:
            found = self.json_attr("effective_precision")
            for layer, result in (found or {}).items():
                # what the tables read of each layer (bitdrift.analysis.effective_precision)
                wrong = None if isinstance(result, dict) else f"is {json_kind(result)}"
                if wrong is None and not isinstance(result.get("reduced", False), bool):
                    wrong = "'reduced' is not true or false"
                if wrong is None and result.get("reduced") and (
                        isinstance(result.get("effective_bits"), bool)
                        or not isinstance(result.get("effective_bits"), int | float)):
                    wrong = "is reduced without a number of 'effective_bits'"
                if wrong is None and not isinstance(result.get("format", ""), str):
                    wrong = "'format' is not a string"
                if wrong:
                    raise self._fail(f"attribute 'effective_precision': layer {layer!r} "
                                     f"{wrong}")
            self._effective = found
        return self._effective

    # -- data -----------------------------------------------------------------------------
    def layers(self, sample: int) -> list[LayerInfo]:
        """Layers of a sample in model order; the final output comes last as 'output'."""
        if sample not in self._layers:  # read once: the analysis asks once per layer
            self._layers[sample] = self._read_layers(sample)
        return self._layers[sample]

    def layer_labels(self, sample: int) -> set[str]:
        """Labels of a sample's tensors (see :attr:`LayerInfo.label`), listed without
        reading any attribute: the analysis needs the full :meth:`layers` of one record
        per model only, and reads the others' tensors by name."""
        if sample in self._layers:
            return {info.label for info in self._layers[sample]}
        group = self._handle()[f"samples/{sample}"]
        names = group["layers"].keys() if "layers" in group else []
        return {LayerInfo(name, 0).label for name in names} | {OUTPUT}

    def _read_layers(self, sample: int) -> list[LayerInfo]:
        group = self._handle()[f"samples/{sample}"]
        infos = []
        if "layers" in group:
            for name, dataset in group["layers"].items():
                # Names listed once: an HDF5 attribute read costs ~10 us.
                names = set(dataset.attrs)
                if "position" not in names:
                    raise self._fail(f"samples/{sample}/layers/{name} has no attribute 'position'")
                class_name = _text(dataset.attrs["class_name"]) if "class_name" in names else ""
                infos.append(LayerInfo(name, int(dataset.attrs["position"]), class_name))
        infos.sort(key=lambda info: info.position)
        last = infos[-1].position + 1 if infos else 0
        infos.append(LayerInfo(OUTPUT, last, final=True))
        return infos

    def tensor(self, sample: int, layer: str | LayerInfo) -> Tensor:
        """One tensor: a LayerInfo from :meth:`layers`, or a layer's dataset name (the
        string `output` means the final output: the model as deployed where the record
        holds it, else the instrumented run's; see bitdrift.analysis.observer)."""
        if sample not in self.samples:
            raise self._fail(f"has no sample {sample} (it has {self.samples})")
        final = layer.final if isinstance(layer, LayerInfo) else layer == OUTPUT
        layer = layer.name if isinstance(layer, LayerInfo) else layer
        if final and self.has_deployed(sample):
            layer = DEPLOYED
        return self._read(sample, final, layer)

    def _read(self, sample: int, final: bool, layer: str) -> Tensor:
        """The dataset ``layer`` of the sample's group (final) or of its layers group."""
        if sample not in self.samples:
            raise self._fail(f"has no sample {sample} (it has {self.samples})")
        self._reads += 1
        if self._reads > READS_PER_HANDLE:
            self.suspend()
        # Opened by name: a worker analysing a few layers need not list every layer's
        # attributes first (:meth:`layers` does that).
        dataset = self._sample_group(sample, final).get(layer)
        if not isinstance(dataset, h5py.Dataset):
            raise self._fail(f"sample {sample} has no layer {layer!r}")
        return _tensor_of(dataset, self.path)

    def digests(self, sample: int, layer: str | LayerInfo) -> list[bytes]:
        """Per repeat, the SHA-256 of the tensor's float format, shape and bytes
        (:func:`output_digest`): read from its attributes in a record of format 4 without
        reading any value; computed from the values in an older one."""
        dataset = self._dataset(sample, layer)
        if _has_attr(dataset, REPEAT_DIGEST):
            distinct, rows = _digest_attrs(dataset, self.path)
            return [distinct[row] for row in rows]
        tensor = _tensor_of(dataset, self.path)
        return [output_digest(repeat, tensor.float_format) for repeat in tensor.values]

    def has_values(self, sample: int, layer: str | LayerInfo) -> bool:
        """Whether the tensor's values are recorded (False: its digests only, a sample
        outside analysis.full_samples)."""
        dataset = self._dataset(sample, layer)
        return not (_has_attr(dataset, REPEAT_DIGEST) and dataset.shape[0] == 0)

    def _dataset(self, sample: int, layer: str | LayerInfo) -> h5py.Dataset:
        """The dataset :meth:`tensor` reads, unread."""
        if sample not in self.samples:
            raise self._fail(f"has no sample {sample} (it has {self.samples})")
        self._reads += 1
        if self._reads > READS_PER_HANDLE:
            self.suspend()
        final = layer.final if isinstance(layer, LayerInfo) else layer == OUTPUT
        name = layer.name if isinstance(layer, LayerInfo) else layer
        if final and self.has_deployed(sample):
            name = DEPLOYED
        dataset = self._sample_group(sample, final).get(name)
        if not isinstance(dataset, h5py.Dataset):
            raise self._fail(f"sample {sample} has no layer {name!r}")
        return dataset

    def _sample_group(self, sample: int, final: bool):
        """samples/<sample> (final output) or its layers group, looked up once."""
        key = (sample, final)
        if key not in self._groups:
            where = f"samples/{sample}" if final else f"samples/{sample}/layers"
            group = self._handle().get(where)
            if not isinstance(group, h5py.Group):
                raise self._fail(f"sample {sample} has no group {where!r}")
            self._groups[key] = group
        return self._groups[key]

    def _handle(self) -> h5py.File:
        """The open HDF5 handle; opened again after :meth:`suspend`."""
        if self._file is None:
            self._file = _open_for_reading(self.path)
            self._reads = 1
        return self._file

    def suspend(self) -> None:
        """Close the HDF5 handle but keep what was validated: the next read opens the file
        again. Frees what HDF5 holds per dataset read; before a fork, it leaves the workers
        no open handle to share (HDF5 would share its file state, and its memory, between
        a worker's own handle and one inherited)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._groups.clear()

    def reopened(self) -> Record:
        """This record on a handle of its own, for a forked worker; the checks made on
        opening need not run again (fork hands the worker the validated attributes)."""
        copy = object.__new__(Record)
        copy.__dict__.update(self.__dict__)
        copy._file, copy._groups = None, {}
        return copy

    def close(self) -> None:
        self.suspend()

    def __enter__(self) -> Record:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _open_for_reading(path: Path) -> h5py.File:
    # No chunk cache: every read takes a whole dataset once, and HDF5's default 1 MiB
    # cache per open dataset kept each read chunk alive (the analysis held every layer of
    # every file in memory, and paid an extra copy per read).
    return h5py.File(path, "r", rdcc_nbytes=0)


def _has_attr(dataset, name: str) -> bool:
    return h5py.h5a.exists(dataset.id, name.encode())


def _digest_attrs(dataset, path) -> tuple[list[bytes], np.ndarray]:
    """(distinct digests, row per repeat) of a format-4 tensor, checked."""
    distinct = np.asarray(dataset.attrs[DIGESTS]) if _has_attr(dataset, DIGESTS) else None
    rows = np.asarray(dataset.attrs[REPEAT_DIGEST])
    if distinct is None or distinct.ndim != 2 or distinct.shape[1] != 32 or \
            distinct.dtype != np.uint8 or rows.ndim != 1 or rows.size < 1 or \
            rows.dtype.kind not in "iu" or rows.min() < 0 or rows.max() >= len(distinct) \
            or dataset.shape[0] not in (0, len(distinct)):
        raise RecordError(f"{path}: {dataset.name}: attributes {DIGESTS!r} and "
                          f"{REPEAT_DIGEST!r} do not describe its {dataset.shape[0]} rows")
    return [row.tobytes() for row in distinct], rows


def _tensor_of(dataset, path) -> Tensor:
    """A dataset's tensor, (repeats, *shape): a format-4 tensor's distinct rows spread to
    its repeats; a tensor of digests only is DigestOnly."""
    is_bf16 = _is_bfloat16(dataset)
    rows = None
    if _has_attr(dataset, REPEAT_DIGEST):
        distinct, rows = _digest_attrs(dataset, path)
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
    if not is_bf16 and values.dtype.kind != "f":
        raise RecordError(f"{path}: {dataset.name} has non-float dtype {values.dtype}")
    if rows is not None and not (len(rows) == len(values) and
                                 np.array_equal(rows, np.arange(len(rows)))):
        values = values[rows]  # each distinct repeat was stored once
    return Tensor(values, bfloat16=is_bf16)


def _is_bfloat16(dataset) -> bool:
    # Asking whether the attribute exists costs ~1 us, reading the attribute set ~7 us,
    # and the analysis asks once per dataset of every file.
    return h5py.h5a.exists(dataset.id, BFLOAT16_ATTR.encode()) and \
        bool(dataset.attrs[BFLOAT16_ATTR])


def checked_fingerprint(found, path) -> dict:
    """A record's fingerprint with the parts the analysis reads (bitdrift.run.devices.
    fingerprint) of the types it reads them as: an object, and in it objects and a list of
    CPU flags; null is an empty one. Else RecordError naming ``path``."""
    def wrong(what: str) -> RecordError:
        return RecordError(f"{path}: root attribute 'fingerprint'{what}")

    if found is None:
        return {}
    if not isinstance(found, dict):
        raise wrong(f" is {json_kind(found)}, not an object")
    for key in ("accelerator", "cpu", "environment", "versions", "emulation"):
        if found.get(key) is not None and not isinstance(found[key], dict):
            raise wrong(f": {key!r} is {json_kind(found[key])}, not an object")
    flags = (found.get("cpu") or {}).get("flags")
    if flags is not None and not isinstance(flags, list):
        raise wrong(f": 'cpu.flags' is {json_kind(flags)}, not a list")
    return found


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_records(paths: list[str | Path], leave_out_failed: bool = True) -> list[Record]:
    """Open and validate all records; on any error close those already open. Failure
    records (a device that did not run) are left out with one line each on stderr, unless
    ``leave_out_failed`` is False (then they are an error like any other file)."""
    import sys

    records: list[Record] = []
    try:
        for path in paths:
            try:
                records.append(Record(path))
            except FailedDevice as failed:
                if not leave_out_failed:
                    raise
                print(f"bitdrift: left out: {failed}", file=sys.stderr)
        if not records and paths:
            raise RecordError(f"no record among the {len(paths)} files: every device failed")
    except Exception:
        for record in records:
            record.close()
        raise
    return records


def group_by_model(records: list[Record]) -> Iterator[tuple[str, list[Record]]]:
    """Group records by model (order of first appearance) and check they are comparable.

    Records of one model must share the model hash and the input hash: a record produced
    with a different model or different inputs would inflate the class counts silently.
    Device names must be unique per model.
    """
    by_model: dict[str, list[Record]] = {}
    for record in records:
        by_model.setdefault(record.model, []).append(record)
    for model, group in by_model.items():
        reference = group[0]
        for key in ("model_sha256", "input_sha256"):
            for record in group[1:]:
                if record.attr(key) != reference.attr(key):
                    raise RecordError(
                        f"{record.path}: {key} {record.attr(key)[:12]}... differs from "
                        f"{reference.path} ({reference.attr(key)[:12]}...) for model {model!r}; "
                        "the records were not produced from the same model and inputs"
                    )
        seen: dict[str, Path] = {}
        for record in group:
            if record.device in seen:
                raise RecordError(
                    f"{record.path}: device {record.device!r} of model {model!r} also in "
                    f"{seen[record.device]}"
                )
            seen[record.device] = record.path
        yield model, group
