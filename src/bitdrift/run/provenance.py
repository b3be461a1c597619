"""What a record claims it was produced from, checked against the workflow's own files.

Records measured elsewhere (external devices, `bitdrift infer` on a laptop) are merged by
copying their files in. A record produced with another model, or other inputs, would
silently add classes: the reference study's local results came from a different model
and inflated its class counts. So every record's `model_sha256` and `input_sha256` are
compared with the digests of the model and dataset files the workflow itself uses.
"""

from __future__ import annotations

from bitdrift.inputs.datasets import input_sha256, read_test_images
from bitdrift.inputs.models import model_digest
from bitdrift.record.hdf5 import RecordError
from bitdrift.record.reader import Record


def infer_command(model: str, device: str, model_path, dataset_path, out,
                  config: str = "config.yaml") -> str:
    """The full `bitdrift infer` command that (re)makes one record."""
    return (f"bitdrift infer --config {config} --model {model} --device {device} "
            f"--model-file {model_path} --dataset-file {dataset_path} --out {out}")


def check_layout(records: list[Record], models: list[str]) -> None:
    """Records the workflow merges must be what their place says: a record of another
    model would otherwise skip the provenance check, and a renamed record would enter the
    tables under another device's name. The workflow lays them out as MODEL/DEVICE.h5."""
    for record in records:
        if record.model not in models:
            raise RecordError(f"{record.path}: model {record.model!r} is not one of the "
                              f"expected models {models}; refusing a record that no "
                              "provenance check covers")
        if record.path.stem != record.device or record.path.parent.name != record.model:
            raise RecordError(
                f"{record.path}: holds device {record.device!r} of model {record.model!r}, "
                f"but sits at {record.path.parent.name}/{record.path.name} (the workflow "
                f"expects {record.model}/{record.device}.h5)")


def _model_digest(model_path) -> str:
    """The model file's digest, or one line saying why there is none."""
    import zipfile
    from pathlib import Path

    from bitdrift.formats import detect

    if not Path(model_path).is_file():
        raise RecordError(f"{model_path}: model file does not exist")
    detect(model_path)  # a file of no format bitdrift reads, or a damaged one: one line
    try:
        return model_digest(model_path)
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as error:
        raise RecordError(f"{model_path}: not a model file bitdrift reads ({error})") \
            from error


def check_provenance(records: list[Record], model: str, model_path, dataset_path) -> int:
    """Refuse any record of `model` whose hashes differ from those of the workflow's model
    file and dataset; returns how many records were checked.

    A record's ``input_sha256`` is the digest of its samples' images in the order the
    device ran them, the config's order (its ``samples_order``; bitdrift.run.repro.run_order
    for a record older than that attribute): the check takes the same order, so samples
    listed in any order pass (it once took them sorted, and refused every record of a
    config that listed them otherwise, after the inference)."""
    from bitdrift.run.repro import run_order

    expected_model = _model_digest(model_path)
    images: dict[tuple, object] = {}  # a record's samples (sorted) -> their images
    expected_inputs: dict[tuple, str] = {}  # the samples in run order -> their digest
    checked = 0
    for record in records:
        if record.model != model:
            continue
        rerun = infer_command(model, record.device, model_path, dataset_path, record.path)
        if record.attr("model_sha256") != expected_model:
            raise RecordError(
                f"{record.path}: device {record.device!r} was run on another model than "
                f"{model_path} (model_sha256 {record.attr('model_sha256')[:12]}... != "
                f"{expected_model[:12]}...); re-run it with `{rerun}`"
            )
        samples = tuple(record.samples)
        order = tuple(run_order(record, dataset_path))
        if order not in expected_inputs:
            if samples not in images:
                images[samples] = read_test_images(dataset_path, list(samples))
            row = {sample: index for index, sample in enumerate(samples)}
            expected_inputs[order] = input_sha256(
                images[samples][[row[sample] for sample in order]])
        if record.attr("input_sha256") != expected_inputs[order]:
            raise RecordError(
                f"{record.path}: device {record.device!r} was run on other inputs than "
                f"samples {list(order)} of {dataset_path} (input_sha256 differs); re-run it "
                f"with `{rerun}`"
            )
        checked += 1
    return checked
