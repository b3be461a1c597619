"""Datasets: load a source, scale images to [0, 1] float32 NHWC, write one HDF5 file.

The dataset file holds ``x_train, y_train, x_test, y_test`` and ``train_order`` (the fixed
shuffle of the training set, seed 42 as in the reference study), with provenance
attributes ``source``, ``source_sha256`` and ``shuffle_seed``. The test set keeps the
source's order, so test-set indices are stable and mean the same everywhere.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import pickle
import tarfile
import urllib.request
import zipfile
from pathlib import Path

import h5py
import numpy as np

from bitdrift.atomic import atomic_output
from bitdrift.errors import DatasetError

SHUFFLE_SEED = 42
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck"]


def input_sha256(images) -> str:
    """The input digest, a record's ``input_sha256``: of the recorded samples' input images
    (as float32, NHWC) in the order the device ran them, the config's (the record's
    ``samples_order``; bitdrift.run.provenance checks it in that order); of a model's several
    inputs (bitdrift.inputs.datasets.NamedInputs), of each array by name, in the order of names."""
    if isinstance(images, dict):
        digest = hashlib.sha256()
        for name in sorted(images):
            digest.update(name.encode() + b"\0")
            digest.update(np.ascontiguousarray(images[name], dtype=np.float32).tobytes())
        return digest.hexdigest()
    return hashlib.sha256(np.ascontiguousarray(images, dtype=np.float32).tobytes()).hexdigest()


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _resize(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of float images (N, H, W, C) in [0, 1] via Pillow, per channel."""
    from PIL import Image

    if images.shape[1] == size and images.shape[2] == size:
        return images
    out = np.empty((len(images), size, size, images.shape[3]), dtype=np.float32)
    for i, image in enumerate(images):
        for c in range(images.shape[3]):
            channel = Image.fromarray(image[:, :, c].astype(np.float32), mode="F")
            out[i, :, :, c] = np.asarray(channel.resize((size, size), Image.BILINEAR))
    return np.clip(out, 0.0, 1.0)


# -- embedded default -----------------------------------------------------------------------
def load_digits(image_size: int = 32) -> dict:
    """scikit-learn's handwritten digits (shipped with the package, no download).

    8x8 grey images with values 0..16 are scaled to [0, 1], resized to image_size and
    repeated over 3 channels so that CIFAR-shaped models run on them. First 80 % train,
    last 20 % test, in the file's order.
    """
    import sklearn.datasets

    bunch = sklearn.datasets.load_digits()
    source_file = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"
    images = (bunch.images.astype(np.float32) / 16.0)[..., None]
    images = np.repeat(_resize(images, image_size), 3, axis=3)
    labels = bunch.target.astype(np.int64)
    split = int(round(0.8 * len(images)))
    return {
        "x_train": images[:split], "y_train": labels[:split],
        "x_test": images[split:], "y_test": labels[split:],
        "class_names": [str(d) for d in range(10)],
        "source_sha256": file_digest(source_file),
        "source_description": "scikit-learn load_digits (digits.csv.gz)",
    }


# -- CIFAR-10 and CIFAR-100 -----------------------------------------------------------------
CIFAR_SOURCES = {
    "cifar10": {"url": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                "md5": "c58f30108f718f92721af3b95e74349a"},
    "cifar100": {"url": "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
                 "md5": "eb9058c3a382ffc7106e4002c42a8d85"},
}


def fetch_cifar10(path: str | Path, url: str, md5: str) -> Path:
    """Return the local tarball (CIFAR-10 or CIFAR-100), downloading it first when it is
    missing; verify its MD5."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with atomic_output(path) as tmp:
                urllib.request.urlretrieve(url, tmp)
        except OSError as error:
            raise DatasetError(f"{path}: not found locally and download from {url} failed "
                               f"({error}); place the tarball there by hand") from error
    actual = file_digest(path, "md5")
    if actual != md5:
        raise DatasetError(f"{path}: MD5 {actual} does not match the expected {md5}; the "
                           "file is corrupt or not the CIFAR python tarball")
    return path


def _cifar_member(archive: tarfile.TarFile, member: str, path: Path) -> dict:
    try:
        handle = archive.extractfile(member)
    except KeyError as error:
        raise DatasetError(f"{path}: member {member} missing from the tarball") from error
    return pickle.load(io.BytesIO(handle.read()), encoding="bytes")


def _cifar_batch(archive: tarfile.TarFile, member: str, path: Path, labels_key=b"labels"):
    batch = _cifar_member(archive, member, path)
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    # Rows are 3072 bytes: 1024 red, 1024 green, 1024 blue, each 32x32 row-major.
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).astype(np.float32) / 255.0
    return images, np.asarray(batch[labels_key], dtype=np.int64)


def load_cifar10(path: str | Path) -> dict:
    path = Path(path)
    try:
        archive = tarfile.open(path, "r:gz")
    except (tarfile.TarError, OSError) as error:
        raise DatasetError(f"{path}: not a gzip tar archive ({error})") from error
    with archive:
        base = "cifar-10-batches-py"
        parts = [_cifar_batch(archive, f"{base}/data_batch_{i}", path) for i in range(1, 6)]
        x_test, y_test = _cifar_batch(archive, f"{base}/test_batch", path)
        try:
            meta = pickle.load(archive.extractfile(f"{base}/batches.meta"), encoding="bytes")
            class_names = [name.decode() for name in meta[b"label_names"]]
        except KeyError:
            class_names = CIFAR10_CLASSES
    return {
        "x_train": np.concatenate([p[0] for p in parts]),
        "y_train": np.concatenate([p[1] for p in parts]),
        "x_test": x_test, "y_test": y_test, "class_names": class_names,
        "source_sha256": file_digest(path),
        "source_description": f"CIFAR-10 python tarball {path.name}",
    }


def load_cifar100(path: str | Path, labels: str = "fine") -> dict:
    """CIFAR-100 python tarball: ``train`` and ``test`` pickles, 100 fine (or 20 coarse)
    classes named in ``meta``. The class count comes from ``meta``, never from the labels
    present, so a model always gets a 100-class head (a 10-class head on CIFAR-100 is a
    known defect of the reference code)."""
    path = Path(path)
    try:
        archive = tarfile.open(path, "r:gz")
    except (tarfile.TarError, OSError) as error:
        raise DatasetError(f"{path}: not a gzip tar archive ({error})") from error
    key = labels.encode()
    with archive:
        base = "cifar-100-python"
        x_train, y_train = _cifar_batch(archive, f"{base}/train", path, key + b"_labels")
        x_test, y_test = _cifar_batch(archive, f"{base}/test", path, key + b"_labels")
        meta = _cifar_member(archive, f"{base}/meta", path)
        class_names = [name.decode() for name in meta[key + b"_label_names"]]
    return {
        "x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test,
        "class_names": class_names, "source_sha256": file_digest(path),
        "source_description": f"CIFAR-100 python tarball {path.name} ({labels} labels)",
    }


def _read_image(path: Path, listed_in: Path, size: int, digest) -> np.ndarray:
    """An image file listed in a CSV, as RGB float32 in [0, 1] resized to size x size;
    its bytes enter the dataset's source digest."""
    from PIL import Image

    if not path.exists():
        raise DatasetError(f"{path}: image listed in {listed_in} not found")
    digest.update(path.read_bytes())
    with Image.open(path) as image:
        image = image.convert("RGB").resize((size, size), Image.BILINEAR)
        return np.asarray(image, dtype=np.float32) / 255.0


# -- CelebA ---------------------------------------------------------------------------------
def _read_csv_rows(path: Path, key: str) -> list[dict]:
    if not path.exists():
        raise DatasetError(f"{path}: CelebA file not found")
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or key not in rows[0]:
        raise DatasetError(f"{path}: needs a column {key!r}")
    return rows


def load_celeba(folder: str | Path, target: str = "Blond_Hair",
                attributes: tuple[str, ...] = ("Male", "Young"), image_size: int = 64) -> dict:
    """CelebA in its CSV layout: ``list_attr_celeba.csv`` (image_id and 40 attributes as
    1/-1), ``list_eval_partition.csv`` (image_id, partition 0 train / 1 valid / 2 test)
    and ``img_align_celeba/``.

    The task is binary: ``target`` (label 1 when the attribute is 1). The sub-group
    ``attributes`` of the test images are kept (0/1) for sub-group accuracy, FPR and FNR.
    The validation partition is not used.
    """

    folder = Path(folder)
    attr_csv = folder / "list_attr_celeba.csv"
    partition_csv = folder / "list_eval_partition.csv"
    rows = _read_csv_rows(attr_csv, "image_id")
    for column in (target, *attributes):
        if column not in rows[0]:
            raise DatasetError(f"{attr_csv}: no attribute column {column!r}")
    partition = {r["image_id"]: r["partition"] for r in _read_csv_rows(partition_csv, "image_id")}
    digest = hashlib.sha256(attr_csv.read_bytes() + partition_csv.read_bytes())
    split: dict[str, dict[str, list]] = {"0": {}, "2": {}}
    for row in rows:
        part = partition.get(row["image_id"])
        if part is None:
            raise DatasetError(f"{partition_csv}: no partition for {row['image_id']}")
        if part not in split:
            continue
        pixels = _read_image(folder / "img_align_celeba" / row["image_id"], attr_csv,
                             image_size, digest)
        try:
            values = [int(row[c]) for c in (target, *attributes)]
        except ValueError as error:
            raise DatasetError(f"{attr_csv}: {row['image_id']}: attributes must be 1 or -1 "
                               f"({error})") from error
        if any(v not in (1, -1) for v in values):
            raise DatasetError(f"{attr_csv}: {row['image_id']}: attributes must be 1 or -1")
        for key, value in (("x", pixels), ("y", int(values[0] == 1)),
                           ("a", [int(v == 1) for v in values[1:]])):
            split[part].setdefault(key, []).append(value)
    if not split["0"] or not split["2"]:
        raise DatasetError(f"{partition_csv}: needs images in partition 0 (train) and 2 (test)")
    return {
        "x_train": np.stack(split["0"]["x"]), "y_train": np.asarray(split["0"]["y"], np.int64),
        "x_test": np.stack(split["2"]["x"]), "y_test": np.asarray(split["2"]["y"], np.int64),
        "a_test": np.asarray(split["2"]["a"], dtype=np.int8).reshape(len(split["2"]["y"]), -1),
        "attribute_names": list(attributes),
        "class_names": [f"not {target}", target],
        "source_sha256": digest.hexdigest(),
        "source_description": f"CelebA folder {folder.name}, target {target}",
    }


# -- DeepWeeds ------------------------------------------------------------------------------
def load_deepweeds(folder: str | Path, image_size: int = 224) -> dict:
    """DeepWeeds: ``labels.csv`` (Filename, Label, ...) and ``images/``.

    First 85 % of the CSV's rows train, last 15 % test (the reference study's split).
    The source hash covers the CSV and every image file in CSV order.
    """

    folder = Path(folder)
    labels_csv = folder / "labels.csv"
    if not labels_csv.exists():
        raise DatasetError(f"{labels_csv}: DeepWeeds labels file not found")
    with open(labels_csv, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or not {"Filename", "Label"} <= set(rows[0]):
        raise DatasetError(f"{labels_csv}: needs columns Filename and Label")
    digest = hashlib.sha256()
    digest.update(labels_csv.read_bytes())
    images, labels = [], []
    for row in rows:
        images.append(_read_image(folder / "images" / row["Filename"], labels_csv,
                                  image_size, digest))
        labels.append(int(row["Label"]))
    images_array = np.stack(images)
    labels_array = np.asarray(labels, dtype=np.int64)
    split = int(round(0.85 * len(rows)))
    species = {int(r["Label"]): r.get("Species", r["Label"]) for r in rows}
    return {
        "x_train": images_array[:split], "y_train": labels_array[:split],
        "x_test": images_array[split:], "y_test": labels_array[split:],
        "class_names": [str(species[k]) for k in sorted(species)],
        "source_sha256": digest.hexdigest(),
        "source_description": f"DeepWeeds folder {folder.name}",
    }


# -- generated text (the batch-invariance study's transformer) ------------------------------
# A small English-like grammar with number agreement and relative clauses: a language a
# small transformer learns in minutes, with no download. Token 0 is the padding token.
GRAMMAR_WORDS = {
    "determiner_singular": ["a", "every", "the", "this"],
    "determiner_plural": ["the", "some", "these", "two"],
    "noun_singular": ["cat", "dog", "bird", "child", "teacher", "farmer"],
    "noun_plural": ["cats", "dogs", "birds", "children", "teachers", "farmers"],
    "adjective": ["small", "big", "red", "old", "quiet"],
    "intransitive_singular": ["sleeps", "runs", "sings", "waits"],
    "intransitive_plural": ["sleep", "run", "sing", "wait"],
    "transitive_singular": ["sees", "likes", "chases", "follows"],
    "transitive_plural": ["see", "like", "chase", "follow"],
    "preposition": ["near", "with", "behind"],
}
PAD_TOKEN = "<pad>"
GRAMMAR_VOCABULARY = [PAD_TOKEN, ".", "that", "and"] + sorted(
    {word for words in GRAMMAR_WORDS.values() for word in words})


def _noun_phrase(rng, plural: bool, depth: int) -> list[str]:
    number = "plural" if plural else "singular"
    words = [rng.choice(GRAMMAR_WORDS[f"determiner_{number}"])]
    if rng.random() < 0.4:
        words.append(rng.choice(GRAMMAR_WORDS["adjective"]))
    words.append(rng.choice(GRAMMAR_WORDS[f"noun_{number}"]))
    if depth < 2 and rng.random() < 0.25:
        words += ["that", *_verb_phrase(rng, plural, depth + 1)]
    elif depth < 2 and rng.random() < 0.2:
        words += [rng.choice(GRAMMAR_WORDS["preposition"]),
                  *_noun_phrase(rng, bool(rng.random() < 0.5), depth + 1)]
    return words


def _verb_phrase(rng, plural: bool, depth: int) -> list[str]:
    number = "plural" if plural else "singular"
    if rng.random() < 0.5:
        return [rng.choice(GRAMMAR_WORDS[f"intransitive_{number}"])]
    return [rng.choice(GRAMMAR_WORDS[f"transitive_{number}"]),
            *_noun_phrase(rng, bool(rng.random() < 0.5), depth + 1)]


def grammar_sentence(rng: np.random.Generator) -> list[str]:
    """One sentence: a noun phrase, a verb phrase agreeing with it in number, maybe a
    second clause joined by "and", and a full stop."""
    plural = bool(rng.random() < 0.5)
    words = [*_noun_phrase(rng, plural, 0), *_verb_phrase(rng, plural, 0)]
    if rng.random() < 0.2:
        plural = bool(rng.random() < 0.5)
        words += ["and", *_noun_phrase(rng, plural, 1), *_verb_phrase(rng, plural, 1)]
    return [*words, "."]


def tokenize(text: str, vocabulary: list[str] = GRAMMAR_VOCABULARY) -> list[int]:
    """Token ids of a space-separated text ("." may touch the word before it); a word
    outside the vocabulary is a DatasetError naming it."""
    ids = {word: index for index, word in enumerate(vocabulary)}
    words = text.replace(".", " . ").split()
    unknown = [word for word in words if word not in ids]
    if unknown:
        raise DatasetError(f"words outside the vocabulary: {unknown} (it has "
                           f"{len(vocabulary)} words: {' '.join(vocabulary[1:])})")
    return [ids[word] for word in words]


def detokenize(tokens, vocabulary: list[str] = GRAMMAR_VOCABULARY) -> str:
    return " ".join(vocabulary[int(token)] for token in tokens)


def load_grammar(sequence_length: int = 32, train_sequences: int = 4000,
                 test_sequences: int = 256, seed: int = 0) -> dict:
    """Sequences cut from one stream of generated sentences: x holds sequence_length
    token ids (as float32, the input every runtime takes; the model's embedding casts
    them back to integers, exact below 2**24), y the next token at every position.
    Train and test sequences come from separate parts of the stream."""
    rng = np.random.default_rng(seed)
    needed = (train_sequences + test_sequences) * (sequence_length + 1)
    ids = {word: index for index, word in enumerate(GRAMMAR_VOCABULARY)}
    stream: list[int] = []
    while len(stream) < needed:
        stream += [ids[word] for word in grammar_sentence(rng)]
    windows = np.asarray(stream[:needed], dtype=np.int64).reshape(-1, sequence_length + 1)
    x, y = windows[:, :-1].astype(np.float32), windows[:, 1:]
    return {
        "x_train": x[:train_sequences], "y_train": y[:train_sequences],
        "x_test": x[train_sequences:], "y_test": y[train_sequences:],
        "class_names": list(GRAMMAR_VOCABULARY),
        "source_sha256": hashlib.sha256(windows.tobytes()).hexdigest(),
        "source_description": f"generated grammar (seed {seed}): {train_sequences} + "
                              f"{test_sequences} sequences of {sequence_length} tokens",
    }


# -- common ---------------------------------------------------------------------------------
MNIST_FILES = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
               "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}
MNIST_MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist/"


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX file (LeCun's MNIST format; gzip or plain) as a uint8 array, checked."""
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise DatasetError(f"{path}: not an IDX file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    payload = raw[4 + 4 * ndim:]
    if len(payload) != int(np.prod(shape)):
        raise DatasetError(f"{path}: IDX header says {shape} but holds {len(payload)} bytes")
    return np.frombuffer(payload, dtype=np.uint8).reshape(shape)


def load_mnist(folder: str | Path, mirror: str = MNIST_MIRROR) -> dict:
    """MNIST from the four IDX files in `folder` (downloaded from `mirror` when missing),
    padded from 28x28 to 32x32 as LeNet-5 expects, one channel, [0, 1] float32."""
    folder = Path(folder)
    data = {}
    for key, stem in MNIST_FILES.items():
        candidates = [folder / stem, folder / f"{stem}.gz"]
        path = next((c for c in candidates if c.exists()), None)
        if path is None:
            path = candidates[1]
            folder.mkdir(parents=True, exist_ok=True)
            try:
                with atomic_output(path) as tmp:
                    urllib.request.urlretrieve(f"{mirror}{stem}.gz", tmp)
            except OSError as error:
                raise DatasetError(f"{path}: not found locally and download from {mirror} "
                                   f"failed ({error}); place the IDX files there") from error
        data[key] = read_idx(path)
    for split in ("train", "test"):
        images, labels = data[f"x_{split}"], data[f"y_{split}"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DatasetError(f"{folder}: {split} images {images.shape} and labels "
                               f"{labels.shape} do not match")
        padded = np.pad(images, ((0, 0), (2, 2), (2, 2)))[..., None]
        data[f"x_{split}"] = padded.astype(np.float32) / 255.0
        data[f"y_{split}"] = labels.astype(np.int64)
    return data


def load_source(spec: dict) -> dict:
    source = spec["source"]
    if source == "digits":
        data = load_digits(spec.get("image_size", 32))
    elif source in CIFAR_SOURCES:
        if "path" not in spec:
            raise DatasetError(f"{source} dataset needs 'path' (where the tarball is or goes)")
        defaults = CIFAR_SOURCES[source]
        tarball = fetch_cifar10(spec["path"], spec.get("url", defaults["url"]),
                                spec.get("md5", defaults["md5"]))
        data = (load_cifar10(tarball) if source == "cifar10"
                else load_cifar100(tarball, spec.get("labels", "fine")))
    elif source == "celeba":
        if "path" not in spec:
            raise DatasetError("celeba dataset needs 'path' (folder with list_attr_celeba.csv)")
        data = load_celeba(spec["path"], spec.get("target", "Blond_Hair"),
                           tuple(spec.get("attributes", ("Male", "Young"))),
                           spec.get("image_size", 64))
    elif source == "mnist":
        if "path" not in spec:
            raise DatasetError("mnist dataset needs 'path' (folder of the IDX files)")
        data = load_mnist(spec["path"], spec.get("mirror", MNIST_MIRROR))
    elif source == "probes":
        if "path" not in spec:
            raise DatasetError("probes dataset needs 'path' (the probe file of `bitdrift probe`)")
        data = load_probes(spec["path"])
    elif source == "grammar":
        data = load_grammar(spec.get("sequence_length", 32), spec.get("train_sequences", 4000),
                            spec.get("test_sequences", 256), spec.get("seed", 0))
    elif source == "deepweeds":
        if "path" not in spec:
            raise DatasetError("deepweeds dataset needs 'path' (folder with labels.csv)")
        data = load_deepweeds(spec["path"], spec.get("image_size", 224))
    else:
        raise DatasetError(f"unknown dataset source {source!r}")
    for split, limit_key in (("train", "limit_train"), ("test", "limit_test")):
        if limit_key in spec:
            data[f"x_{split}"] = data[f"x_{split}"][: spec[limit_key]]
            data[f"y_{split}"] = data[f"y_{split}"][: spec[limit_key]]
    if "a_test" in data and "limit_test" in spec:
        data["a_test"] = data["a_test"][: spec["limit_test"]]
    return data


def write_dataset(data: dict, name: str, source: str, out: str | Path) -> None:
    order = np.random.default_rng(SHUFFLE_SEED).permutation(len(data["x_train"]))
    with atomic_output(out) as tmp, h5py.File(tmp, "w") as handle:
        for key in ("x_train", "y_train", "x_test", "y_test"):
            handle.create_dataset(key, data=data[key], compression="gzip", compression_opts=1)
        handle.create_dataset("train_order", data=order)
        if "a_test" in data:  # sub-group attributes of the test images (CelebA)
            handle.create_dataset("a_test", data=data["a_test"])
            handle.attrs["attribute_names"] = json.dumps(data["attribute_names"])
        handle.attrs.update({
            "name": name, "source": source,
            "source_description": data["source_description"],
            "source_sha256": data["source_sha256"], "shuffle_seed": SHUFFLE_SEED,
            "class_names": json.dumps(data["class_names"]),
        })


def prepare_dataset(name: str, spec: dict, out: str | Path) -> None:
    write_dataset(load_source(spec), name, spec["source"], out)


def read_dataset(path: str | Path, splits=("train", "test")) -> dict:
    path = Path(path)
    try:
        with h5py.File(path, "r") as handle:
            data = {f"{p}_{s}": handle[f"{p}_{s}"][()] for s in splits for p in ("x", "y")}
            data["train_order"] = handle["train_order"][()]
            if "a_test" in handle:  # sub-group attributes (0/1), named in attribute_names
                data["a_test"] = handle["a_test"][()]
            data["attrs"] = {k: handle.attrs[k] for k in handle.attrs}
    except (OSError, KeyError) as error:
        raise DatasetError(f"{path}: not a bitdrift dataset file ({error})") from error
    return data


def dataset_classes(data: dict) -> int:
    """The number of classes of a dataset read by read_dataset: the class names recorded
    from the source, never the labels present (a small split may miss some classes)."""
    names = json.loads(data["attrs"]["class_names"])
    present = int(max(data["y_train"].max(), data["y_test"].max()) + 1)
    if present > len(names):
        raise DatasetError(f"dataset {data['attrs'].get('name')!r}: label {present - 1} but only "
                           f"{len(names)} class names")
    return len(names)


NPY_MAGIC = b"\x93NUMPY"


def is_inputs_file(path: str | Path) -> bool:
    """Whether ``path`` is a user's inputs file (a model's ``inputs:``): a .npy array, or
    a .npz archive of one, told by content; else a prepared dataset file (HDF5)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(len(NPY_MAGIC))
    except OSError:
        return False
    return head == NPY_MAGIC or (head.startswith(b"PK") and zipfile.is_zipfile(path))


class NamedInputs(dict):
    """A model's several inputs, {input name: array}, each array's first axis the sample
    (all of one length): indexing by rows (a slice, a list of indices) takes those rows
    of every array, so a batch is cut as from one array; a name gives its array."""

    def __getitem__(self, key):
        if isinstance(key, str):
            return super().__getitem__(key)
        return NamedInputs({name: array[key] for name, array in self.items()})

    @property
    def samples(self) -> int:
        return next(iter(self.values())).shape[0]

    def astype(self, dtype):
        return NamedInputs({name: array.astype(dtype) for name, array in self.items()})

    def describe(self) -> str:
        return "; ".join(f"{name!r} {sample_shape(array)}" for name, array in self.items())


def sample_count(inputs) -> int:
    """The samples of an array of inputs, or of NamedInputs."""
    return inputs.samples if isinstance(inputs, NamedInputs) else inputs.shape[0]


def sample_shape(array) -> str:
    """An array of inputs' shape and dtype, its first axis the samples:
    ``(samples, 3, 16, 16) float32``."""
    return f"({', '.join(['samples', *map(str, array.shape[1:])])}) {array.dtype.name}"


def read_inputs(path: str | Path):
    """The arrays of a user's inputs file (the first axis is the sample; any dtype and
    layout): a .npy file memory-mapped, or the one array of a .npz archive; a .npz of
    several arrays as NamedInputs (one per model input, by its name), every array of
    the same number of samples."""
    try:
        loaded = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise DatasetError(f"{path}: not a readable .npy or .npz inputs file ({error})") \
            from error
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            if not loaded.files:
                raise DatasetError(f"{path}: a .npz inputs file holding no array")
            try:
                arrays = {name: loaded[name] for name in loaded.files}
            except (OSError, ValueError, zipfile.BadZipFile) as error:
                raise DatasetError(f"{path}: a damaged .npz inputs file ({error})") from error
        for name, array in arrays.items():
            if array.ndim < 1 or array.shape[0] == 0:
                raise DatasetError(f"{path}: array {name!r} of shape {array.shape}: the "
                                   "first axis is the sample, and there is none")
        if len(arrays) == 1:
            return next(iter(arrays.values()))
        counts = {name: array.shape[0] for name, array in arrays.items()}
        if len(set(counts.values())) > 1:
            raise DatasetError(f"{path}: arrays of different sample counts ("
                               f"{', '.join(f'{name!r}: {n}' for name, n in counts.items())})"
                               "; the first axis of each is the sample")
        return NamedInputs(arrays)
    if loaded.ndim < 1 or loaded.shape[0] == 0:
        raise DatasetError(f"{path}: inputs of shape {loaded.shape}: the first axis is the "
                           "sample, and there is none")
    return loaded


def read_test_images(path: str | Path, indices: list[int]):
    """Test images at the given indices (float32, NHWC); for a user's inputs file, its
    samples at those indices as they are (NamedInputs for several arrays; bitdrift.formats
    checks them against the model)."""
    if is_inputs_file(path):
        inputs = read_inputs(path)
        _check_indices(path, indices, sample_count(inputs))
        if isinstance(inputs, NamedInputs):
            return NamedInputs({name: np.ascontiguousarray(array[list(indices)])
                                for name, array in inputs.items()})
        return np.ascontiguousarray(inputs[list(indices)])
    try:
        with h5py.File(path, "r") as handle:
            _check_indices(path, indices, handle["x_test"].shape[0])
            return np.stack([handle["x_test"][i] for i in indices])
    except (OSError, KeyError) as error:  # missing, not HDF5, or not a dataset file
        raise DatasetError(f"{path}: cannot read the test set, not a prepared dataset "
                           f"file ({error})") from error


def first_batch(path: str | Path, batch: int):
    """A device's first batch of the test set or inputs file at ``path``: its first
    ``batch`` rows, taken round again where it holds fewer (what a conversion at the
    device's batch size is traced and checked on)."""
    rows = count_test_images(path)
    return read_test_images(path, [row % rows for row in range(batch)])


def count_test_images(path: str | Path) -> int:
    """Number of test images in a prepared dataset file (samples in an inputs file)."""
    if is_inputs_file(path):
        return sample_count(read_inputs(path))
    try:
        with h5py.File(path, "r") as handle:
            return handle["x_test"].shape[0]
    except (OSError, KeyError) as error:
        raise DatasetError(f"{path}: cannot read the test set ({error})") from error


def test_image_shape(path: str | Path) -> tuple:
    """The shape of one test image of a prepared dataset file (one sample of an inputs
    file)."""
    if is_inputs_file(path):
        return tuple(read_inputs(path).shape[1:])
    try:
        with h5py.File(path, "r") as handle:
            return tuple(handle["x_test"].shape[1:])
    except (OSError, KeyError) as error:
        raise DatasetError(f"{path}: cannot read the test set ({error})") from error


def load_probes(path: str | Path) -> dict:
    """A probe file from `bitdrift probe` as a dataset: its test set is the probes (the
    labels are the search devices' first classes), no training set."""
    data = read_dataset(path)
    if data["attrs"].get("source") != "probes":
        raise DatasetError(f"{path}: not a probe file from `bitdrift probe` (source "
                           f"{data['attrs'].get('source')!r})")
    return {"x_train": data["x_train"], "y_train": data["y_train"],
            "x_test": data["x_test"], "y_test": data["y_test"],
            "class_names": json.loads(data["attrs"]["class_names"]),
            "source_sha256": file_digest(path),
            "source_description": f"probes {Path(path).name}: "
                                  f"{data['attrs']['source_description']}"}


def check_samples(path: str | Path, samples: list[int]) -> None:
    """Refuse sample indices beyond the test set of a prepared dataset file (the one check
    the workflow makes at parse time and `bitdrift infer` before its repeats)."""
    _check_indices(path, samples, count_test_images(path), "; config key samples")


def _check_indices(path, indices: list[int], n_test: int, hint: str = "") -> None:
    beyond = [index for index in indices if not 0 <= index < n_test]
    if beyond:
        raise DatasetError(f"{path}: samples {beyond} beyond the test set (indices 0.."
                           f"{n_test - 1}){hint}")
