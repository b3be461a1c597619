"""What a record claims it was produced from, checked against the workflow's own files.

Records measured elsewhere (external devices, `bitdrift infer` on a laptop) are merged by
copying their files in. A record produced with another model, or other inputs, would
silently add classes: the reference study's local results came from a different model
and inflated its class counts. So every record's `model_sha256` and `input_sha256` are
compared with the digests of the model and dataset files the workflow itself uses.
"""

from __future__ import annotations

import hashlib

import numpy as np

from bitdrift.datasets import read_test_images
from bitdrift.models import model_digest
from bitdrift.record import Record, RecordError


def input_sha256(images: np.ndarray) -> str:
    """Digest of the recorded samples' input images (as float32, NHWC)."""
    return hashlib.sha256(np.ascontiguousarray(images, dtype=np.float32).tobytes()).hexdigest()


def check_provenance(records: list[Record], model: str, model_path, dataset_path) -> int:
    """Refuse any record of `model` whose hashes differ from those of the workflow's model
    file and dataset; returns how many records were checked."""
    expected_model = model_digest(model_path)
    expected_inputs: dict[tuple, str] = {}
    checked = 0
    for record in records:
        if record.model != model:
            continue
        if record.attr("model_sha256") != expected_model:
            raise RecordError(
                f"{record.path}: device {record.device!r} was run on another model than "
                f"{model_path} (model_sha256 {record.attr('model_sha256')[:12]}... != "
                f"{expected_model[:12]}...); re-run it with `bitdrift infer --model-file "
                f"{model_path}`"
            )
        samples = tuple(record.samples)
        if samples not in expected_inputs:
            expected_inputs[samples] = input_sha256(read_test_images(dataset_path, list(samples)))
        if record.attr("input_sha256") != expected_inputs[samples]:
            raise RecordError(
                f"{record.path}: device {record.device!r} was run on other inputs than "
                f"samples {list(samples)} of {dataset_path} (input_sha256 differs)"
            )
        checked += 1
    return checked
