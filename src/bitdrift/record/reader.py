"""Reading inference records (the format: bitdrift.record.hdf5): Record, one record
validated on open and read a tensor at a time; open_records and group_by_model, the
records an analysis compares; read_failure, a failure record's reason; read_fingerprint, a
record's device and fingerprint alone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from bitdrift.errors import RecordError, json_kind
from bitdrift.record.hdf5 import (
    DEPLOYED,
    FAILED,
    FAILURE_ATTRS,
    KERNELS,
    OBSERVER_ATTR,
    OUTPUT,
    REPEAT_DIGEST,
    REQUIRED_ATTRS,
    SAMPLE_NAME,
    UNREADABLE,
    FailedDevice,
    Tensor,
    digest_attrs,
    has_attr,
    member,
    output_digest,
    tensor_of,
)

# HDF5 keeps ~25 KB per dataset read until its file is closed. The analysis reads every
# layer of every record, so a record renews its handle after this many reads: memory
# stays bounded by one layer over all devices instead of growing with the layers, for
# ~2 % of the read time (64 records of 256 KB layers).
READS_PER_HANDLE = 16


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


def read_fingerprint(path: str | Path) -> tuple[str, dict] | None:
    """(device, fingerprint) of a record that ran, from its root attributes alone (a
    Record would validate the samples too, which naming the machine does not need); the
    fingerprint checked as checked_fingerprint does, RecordError naming ``path`` when a
    part is of the wrong type. None for a failure record, a record without a fingerprint
    or a device, a fingerprint that is not JSON, and a missing or unreadable file."""
    try:
        with h5py.File(path, "r") as handle:
            if FAILED in handle.attrs or "fingerprint" not in handle.attrs:
                return None
            found, device = handle.attrs["fingerprint"], _text(handle.attrs["device"])
            found = json.loads(found.decode() if isinstance(found, bytes) else found)
    except (OSError, ValueError, KeyError):
        return None
    return device, checked_fingerprint(found, path)


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
        try:
            attrs = {key: value for key, value in self._file.attrs.items()}
        except UNREADABLE as error:
            raise self._fail(f"its root attributes cannot be read ({error})") from None
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
        samples = member(self._file, "samples", self.path)
        if not isinstance(samples, h5py.Group):
            raise self._fail("missing group 'samples'")
        self.samples: list[int] = []
        for key in samples:
            # A test-set index in ASCII digits without a leading zero: `01` would be a
            # second name for sample 1, and str.isdigit accepts `٦` and `²`.
            if not SAMPLE_NAME.fullmatch(key):
                raise self._fail(f"sample group name {key!r} is not a test-set index")
            group = member(samples, key, self.path)
            output = member(group, OUTPUT, self.path) if isinstance(group, h5py.Group) \
                else None
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
            kernels = member(self._file, KERNELS, self.path)
            if kernels is None:
                self._kernels = None
            else:
                try:
                    found = json.loads(_text(kernels[()]))
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

    @property
    def deployed_samples(self) -> frozenset[int]:
        """The samples that hold the deployed model's final output."""
        if "_deployed" not in self.__dict__:
            self._deployed = frozenset(sample for sample in self.samples
                                       if self.has_deployed(sample))
        return self._deployed

    def _final_is_deployed(self, sample: int) -> bool:
        """Whether :meth:`tensor` gives the sample's deployed output as its final output:
        where it holds one, unless the records it is compared with do not
        (:func:`group_by_model`)."""
        return sample in self.deployed_samples and sample not in self.compared_instrumented

    # The samples whose final output is read as the instrumented run's although the record
    # holds the deployed one: another record of its model lacks it (group_by_model)
    compared_instrumented: frozenset[int] = frozenset()

    def deployed_output(self, sample: int) -> Tensor:
        """The deployed model's final output (the dataset ``deployed``), whatever
        :meth:`tensor` compares."""
        return self._read(sample, True, DEPLOYED)

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
        layers = member(self._sample_group(sample, True), "layers", self.path)
        names = layers.keys() if layers is not None else []
        return {LayerInfo(name, 0).label for name in names} | {OUTPUT}

    def _read_layers(self, sample: int) -> list[LayerInfo]:
        layers = member(self._sample_group(sample, True), "layers", self.path)
        infos = []
        if layers is not None and not isinstance(layers, h5py.Group):
            raise self._fail(f"samples/{sample}/layers is not a group")
        for name in layers if layers is not None else []:
            dataset = member(layers, name, self.path)
            where = f"samples/{sample}/layers/{name}"
            try:
                # Names listed once: an HDF5 attribute read costs ~10 us.
                names = set(dataset.attrs)
                if "position" not in names:
                    raise self._fail(f"{where} has no attribute 'position'")
                class_name = _text(dataset.attrs["class_name"]) if "class_name" in names \
                    else ""
                position = int(dataset.attrs["position"])
            except (*UNREADABLE, TypeError) as error:
                if isinstance(error, RecordError):
                    raise
                raise self._fail(f"{where}: its attributes cannot be read ({error})") \
                    from None
            infos.append(LayerInfo(name, position, class_name))
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
        if final and self._final_is_deployed(sample):
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
        dataset = member(self._sample_group(sample, final), layer, self.path)
        if not isinstance(dataset, h5py.Dataset):
            raise self._fail(f"sample {sample} has no layer {layer!r}")
        return tensor_of(dataset, self.path)

    def digests(self, sample: int, layer: str | LayerInfo) -> list[bytes]:
        """Per repeat, the SHA-256 of the tensor's float format, shape and bytes
        (:func:`output_digest`): read from its attributes in a record of format 4 without
        reading any value; computed from the values in an older one."""
        dataset = self._dataset(sample, layer)
        if has_attr(dataset, REPEAT_DIGEST):
            distinct, rows = digest_attrs(dataset, self.path)
            return [distinct[row] for row in rows]
        tensor = tensor_of(dataset, self.path)
        return [output_digest(repeat, tensor.float_format) for repeat in tensor.values]

    def has_values(self, sample: int, layer: str | LayerInfo) -> bool:
        """Whether the tensor's values are recorded (False: its digests only, a sample
        outside analysis.full_samples)."""
        dataset = self._dataset(sample, layer)
        return not (has_attr(dataset, REPEAT_DIGEST) and dataset.shape[0] == 0)

    def quantization(self, sample: int, layer: str | LayerInfo) -> dict:
        """A quantized model's integer layer's scale and zero point as the record keeps
        them ({"scale": array, "zero_point": array, "scale_layer": name, ...}; the zero
        points of a MatMulInteger's operands as "input_zero_point" and
        "weight_zero_point"); {} for a float layer or where the graph gives none."""
        dataset = self._dataset(sample, layer)
        keys = ("scale", "zero_point", "input_zero_point", "weight_zero_point")
        found = {}
        for key in set(dataset.attrs):
            if key in keys:
                found[key] = np.asarray(dataset.attrs[key])
            elif key.endswith("_layer") and key.removesuffix("_layer") in keys:
                found[key] = _text(dataset.attrs[key])
        return found

    def _dataset(self, sample: int, layer: str | LayerInfo) -> h5py.Dataset:
        """The dataset :meth:`tensor` reads, unread."""
        if sample not in self.samples:
            raise self._fail(f"has no sample {sample} (it has {self.samples})")
        self._reads += 1
        if self._reads > READS_PER_HANDLE:
            self.suspend()
        final = layer.final if isinstance(layer, LayerInfo) else layer == OUTPUT
        name = layer.name if isinstance(layer, LayerInfo) else layer
        if final and self._final_is_deployed(sample):
            name = DEPLOYED
        dataset = member(self._sample_group(sample, final), name, self.path)
        if not isinstance(dataset, h5py.Dataset):
            raise self._fail(f"sample {sample} has no layer {name!r}")
        return dataset

    def _sample_group(self, sample: int, final: bool):
        """samples/<sample> (final output) or its layers group, looked up once."""
        key = (sample, final)
        if key not in self._groups:
            where = f"samples/{sample}" if final else f"samples/{sample}/layers"
            group = member(self._handle(), where, self.path)
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
        compare_final_outputs(model, group)
        yield model, group


def compare_final_outputs(model: str, group: list[Record]) -> None:
    """The one rule for the final output of records of which some hold the deployed
    model's (``samples/<i>/deployed``, the observer check) and some do not (older records,
    another tool's): a sample's final output is the deployed one where every record of the
    model holds it, else the instrumented run's on every record, the output each holds,
    so that the classes never compare one program's outputs with another's. Said once on
    stderr, naming the records and samples that lack it."""
    import sys

    lacking: dict[Path, list[int]] = {}
    mixed: set[int] = set()
    holding = {record.path: record.deployed_samples for record in group}
    if any(holding.values()):
        for record in group:
            missing = [sample for sample in record.samples
                       if sample not in holding[record.path]]
            if missing:
                lacking[record.path] = missing
                mixed.update(missing)
    changed = False
    for record in group:
        settled = frozenset(mixed & record.deployed_samples)
        changed |= settled != record.compared_instrumented
        record.compared_instrumented = settled
    if changed and mixed:
        said = "; ".join(f"{path} (sample{'s' * (len(samples) > 1)} "
                         f"{', '.join(map(str, samples))})"
                         for path, samples in lacking.items())
        print(f"bitdrift: warning: model {model!r}: records without the deployed model's "
              f"final output: {said}; the final output of sample"
              f"{'s' * (len(mixed) > 1)} {', '.join(map(str, sorted(mixed)))} is compared "
              "as the instrumented run's on every device", file=sys.stderr)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
