"""The reference set: committed files that match their manifest, refused when changed."""

import hashlib
import shutil

import h5py
import pytest

from bitdrift.errors import BitdriftError
from bitdrift.inputs import reference_set


def test_files_match_the_manifest_digests():
    found = reference_set.manifest()
    for part in ("model", "inputs"):
        path = reference_set.FOLDER / found[part]["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == found[part]["file_sha256"]
    assert reference_set.model_file().suffix == ".keras"
    with h5py.File(reference_set.inputs_file(), "r") as handle:
        assert max(reference_set.samples()) < handle["x_test"].shape[0]
        assert handle["x_test"].shape[1:] == (32, 32, 3)


def test_a_changed_file_is_refused_naming_it(tmp_path, monkeypatch):
    for path in reference_set.FOLDER.iterdir():
        if path.is_file() and path.suffix != ".py":
            shutil.copy(path, tmp_path / path.name)
    (tmp_path / "digits_test.h5").chmod(0o644)
    with open(tmp_path / "digits_test.h5", "ab") as handle:
        handle.write(b"\0")
    monkeypatch.setattr(reference_set, "FOLDER", tmp_path)
    monkeypatch.setattr(reference_set, "MANIFEST", tmp_path / "manifest.json")
    assert reference_set.model_file() == tmp_path / "cifar10_small.keras"
    with pytest.raises(BitdriftError, match="digits_test.h5: sha256 .* not the reference set"):
        reference_set.inputs_file()
