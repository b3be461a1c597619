import csv
import gzip
import hashlib
import io
import json
import pickle
import tarfile

import numpy as np
import pytest
from PIL import Image

from bitdrift.inputs.datasets import (
    SHUFFLE_SEED,
    DatasetError,
    dataset_classes,
    load_source,
    prepare_dataset,
    read_dataset,
    read_test_images,
)
from tests.utils import make_celeba


def add_pickle(archive, member, obj):
    """A pickled member, as the CIFAR python tarballs hold them."""
    data = pickle.dumps(obj)
    info = tarfile.TarInfo(member)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def make_cifar10_tarball(path, n_per_batch=4, n_test=5, seed=0):
    """A tiny tarball in the official CIFAR-10 python format."""
    rng = np.random.default_rng(seed)
    batches = {}
    with tarfile.open(path, "w:gz") as archive:
        def add(name, obj):
            add_pickle(archive, f"cifar-10-batches-py/{name}", obj)

        for name, n in [(f"data_batch_{i}", n_per_batch) for i in range(1, 6)] + [
                ("test_batch", n_test)]:
            batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                     b"labels": rng.integers(0, 10, n).tolist()}
            batches[name] = batch
            add(name, batch)
        add("batches.meta", {b"label_names": [f"class{i}".encode() for i in range(10)]})
    return batches


def md5(path):
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_cifar10_loader_reads_the_real_format(tmp_path):
    tarball = tmp_path / "cifar-10-python.tar.gz"
    batches = make_cifar10_tarball(tarball)
    out = tmp_path / "cifar10.h5"
    prepare_dataset("cifar10", {"source": "cifar10", "path": str(tarball), "md5": md5(tarball),
                                "url": "unused"}, out)
    data = read_dataset(out)
    assert data["x_train"].shape == (20, 32, 32, 3) and data["x_test"].shape == (5, 32, 32, 3)
    assert data["x_train"].dtype == np.float32
    assert 0.0 <= data["x_train"].min() and data["x_train"].max() <= 1.0
    # pixel (row 0, col 1) of test image 2, green channel = byte 1024 + 1 of its row
    raw = batches["test_batch"][b"data"][2]
    assert data["x_test"][2, 0, 1, 1] == np.float32(raw[1024 + 1] / 255.0)
    assert data["y_test"].tolist() == batches["test_batch"][b"labels"]
    assert data["attrs"]["shuffle_seed"] == SHUFFLE_SEED
    assert data["attrs"]["source_sha256"] == hashlib.sha256(tarball.read_bytes()).hexdigest()
    assert sorted(data["train_order"].tolist()) == list(range(20))
    assert np.array_equal(read_test_images(out, [2]), data["x_test"][[2]])


def test_cifar10_checksum_mismatch_names_the_file(tmp_path):
    tarball = tmp_path / "cifar.tar.gz"
    make_cifar10_tarball(tarball)
    with pytest.raises(DatasetError, match=r"cifar\.tar\.gz: MD5 .* does not match"):
        load_source({"source": "cifar10", "path": str(tarball), "md5": "0" * 32, "url": "x"})


def test_cifar10_missing_and_not_downloadable(tmp_path):
    with pytest.raises(DatasetError, match="download from .* failed"):
        load_source({"source": "cifar10", "path": str(tmp_path / "none.tar.gz"),
                     "md5": "0" * 32, "url": "file:///nonexistent/cifar.tar.gz"})
    assert not (tmp_path / "none.tar.gz").exists()


def test_deepweeds_split_85_15(tmp_path):
    (tmp_path / "images").mkdir()
    rows = []
    rng = np.random.default_rng(0)
    for i in range(20):
        name = f"img{i:02d}.jpg"
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(
            tmp_path / "images" / name)
        rows.append({"Filename": name, "Label": i % 3, "Species": f"sp{i % 3}"})
    with open(tmp_path / "labels.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["Filename", "Label", "Species"])
        writer.writeheader()
        writer.writerows(rows)
    data = load_source({"source": "deepweeds", "path": str(tmp_path), "image_size": 16})
    assert data["x_train"].shape == (17, 16, 16, 3) and data["x_test"].shape == (3, 16, 16, 3)
    assert data["y_test"].tolist() == [17 % 3, 18 % 3, 19 % 3]
    assert data["class_names"] == ["sp0", "sp1", "sp2"]


def test_embedded_digits_need_no_download(tmp_path):
    data = load_source({"source": "digits", "limit_test": 10})
    assert data["x_train"].shape[1:] == (32, 32, 3)
    assert data["x_test"].shape == (10, 32, 32, 3)
    assert data["x_train"].max() <= 1.0 and data["x_train"].max() > 0.9
    assert len(data["source_sha256"]) == 64


def write_idx(path, array):
    """LeCun's IDX format: magic 0x00000803/0x00000801, big-endian dims, bytes; gzipped."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(n).to_bytes(4, "big") for n in array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_mnist_loader_reads_generated_idx_files(tmp_path):
    rng = np.random.default_rng(0)
    images = {split: rng.integers(0, 256, (n, 28, 28)) for split, n in (("train", 5), ("t10k", 3))}
    labels = {"train": np.array([5, 0, 4, 1, 9]), "t10k": np.array([7, 2, 1])}
    for split in ("train", "t10k"):
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", images[split])
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", labels[split])
    data = load_source({"source": "mnist", "path": str(tmp_path)})
    assert data["x_train"].shape == (5, 32, 32, 1) and data["x_test"].shape == (3, 32, 32, 1)
    assert data["y_test"].tolist() == [7, 2, 1]
    # padded by 2 on each side, [0, 1] scaled, pixel order kept
    expected = images["train"][1].astype(np.float32) / np.float32(255)
    assert np.array_equal(data["x_train"][1, 2:30, 2:30, 0], expected)
    assert data["x_train"][:, :2].max() == 0.0


def test_mnist_corrupt_idx_names_the_file(tmp_path):
    for split in ("train", "t10k"):
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", np.zeros((2, 28, 28)))
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", np.zeros(2))
    broken = tmp_path / "t10k-labels-idx1-ubyte.gz"
    broken.write_bytes(gzip.compress(bytes([0, 0, 8, 1]) + (5).to_bytes(4, "big") + b"ab"))
    with pytest.raises(DatasetError, match=r"t10k-labels-idx1-ubyte\.gz: IDX header says"):
        load_source({"source": "mnist", "path": str(tmp_path)})


def make_cifar100_tarball(path, n_train=6, n_test=4, seed=0):
    """A tiny tarball in the official CIFAR-100 python format, using only labels 0..4."""
    rng = np.random.default_rng(seed)
    parts = {}
    with tarfile.open(path, "w:gz") as archive:
        def add(name, obj):
            add_pickle(archive, f"cifar-100-python/{name}", obj)

        for name, n in (("train", n_train), ("test", n_test)):
            parts[name] = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                           b"fine_labels": rng.integers(0, 5, n).tolist(),
                           b"coarse_labels": rng.integers(0, 3, n).tolist()}
            add(name, parts[name])
        add("meta", {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
                     b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]})
    return parts


def test_cifar100_keeps_all_100_classes(tmp_path):
    tarball = tmp_path / "cifar-100-python.tar.gz"
    parts = make_cifar100_tarball(tarball)
    out = tmp_path / "cifar100.h5"
    prepare_dataset("cifar100", {"source": "cifar100", "path": str(tarball),
                                 "md5": md5(tarball)}, out)
    data = read_dataset(out)
    assert data["y_test"].tolist() == parts["test"][b"fine_labels"]
    assert data["x_train"].shape == (6, 32, 32, 3)
    # only labels 0..4 occur, yet the head must have 100 outputs (the reference's defect)
    assert dataset_classes(data) == 100
    coarse = tmp_path / "coarse.h5"
    prepare_dataset("c", {"source": "cifar100", "path": str(tarball), "md5": md5(tarball),
                          "labels": "coarse"}, coarse)
    assert dataset_classes(read_dataset(coarse)) == 20
    with pytest.raises(DatasetError, match="MD5"):
        load_source({"source": "cifar100", "path": str(tarball)})  # official MD5 by default


def test_celeba_binary_target_with_subgroup_attributes(tmp_path):
    rows = [("000001.jpg", 0, 1, -1, 1), ("000002.jpg", 0, -1, 1, 1),
            ("000003.jpg", 1, 1, 1, -1), ("000004.jpg", 2, 1, 1, -1),
            ("000005.jpg", 2, -1, -1, 1), ("000006.jpg", 2, -1, 1, 1)]
    make_celeba(tmp_path / "celeba", rows)
    out = tmp_path / "celeba.h5"
    prepare_dataset("celeba", {"source": "celeba", "path": str(tmp_path / "celeba"),
                               "image_size": 16}, out)
    data = read_dataset(out)
    assert data["x_train"].shape == (2, 16, 16, 3)  # partition 1 (validation) left out
    assert data["y_test"].tolist() == [1, 0, 0] and dataset_classes(data) == 2
    assert json.loads(data["attrs"]["attribute_names"]) == ["Male", "Young"]
    assert data["a_test"].tolist() == [[1, 0], [0, 1], [1, 1]]
    with pytest.raises(DatasetError, match="no attribute column 'Bald'"):
        load_source({"source": "celeba", "path": str(tmp_path / "celeba"), "target": "Bald"})
    (tmp_path / "celeba" / "img_align_celeba" / "000005.jpg").unlink()
    with pytest.raises(DatasetError, match="000005.jpg"):
        load_source({"source": "celeba", "path": str(tmp_path / "celeba")})
