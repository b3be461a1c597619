"""The atlas index (bitdrift.atlas.digest_index) against a brute-force comparison of the records."""

import subprocess
import sys

import numpy as np
import pytest

from bitdrift.atlas.digest_index import Index
from bitdrift.errors import RecordError
from bitdrift.record.reader import Record, open_records
from bitdrift.record.writer import write_record
from tests.utils import BASE_ATTRS

SAMPLES = (0, 1, 2)


def _perturbed(values, rng, bits):
    """``values`` with the low ``bits`` mantissa bits of some elements changed."""
    raw = values.view(np.uint32).copy()
    if bits:
        chosen = rng.choice(raw.size, size=3, replace=False)
        raw.ravel()[chosen] ^= np.uint32(1 << (bits - 1))
    return raw.view(np.float32)


def _atlas(folder, rng, *, records=60, model="m" * 64):
    """Records in classes: each class a base output per sample, its members bit-identical
    except where a member is perturbed at a chosen bit (repeats: two equal, the majority,
    and one other)."""
    bases = {sample: rng.standard_normal(10).astype(np.float32) for sample in SAMPLES}
    paths = []
    for number in range(records):
        bits = int(rng.choice([0, 0, 0, 1, 4, 9, 17]))
        outputs = {}
        for sample in SAMPLES:
            majority = _perturbed(bases[sample], rng, bits) if number % 5 else bases[sample]
            outlier = _perturbed(majority, rng, 20)
            outputs[sample] = {"output": np.stack([majority, majority, outlier])}
        path = folder / f"record{number}.h5"
        write_record(path, {**BASE_ATTRS, "model_sha256": model, "model": "m",
                            "device": f"device{number}"}, outputs)
        paths.append(path)
    return paths


def _brute_force(query: Record, known: list[Record]):
    """Exact: equal majority bytes on every sample; else the fewest dropped bits, with
    the bits compared by Python integers, element by element."""
    def majority(record, sample):
        values = record.tensor(sample, "output").values
        keys = [v.tobytes() for v in values]
        return values[max(range(len(keys)), key=lambda i: (keys.count(keys[i]), -i))]

    exact, dropped = [], []
    for record in known:
        pairs = [(majority(record, s), majority(query, s)) for s in SAMPLES]
        if all(a.tobytes() == b.tobytes() for a, b in pairs):
            exact.append(record.device)
        worst = 0
        for a, b in pairs:
            for x, y in zip(a.view(np.uint32).ravel().tolist(),
                            b.view(np.uint32).ravel().tolist(), strict=True):
                worst = max(worst, (x ^ y).bit_length())
        dropped.append(worst)
    best = min(dropped)
    return exact, [r.device for r, d in zip(known, dropped, strict=True) if d == best], best


def _devices(labels):
    return [label.split(" ")[0] for label in labels]


def test_index_look_up_equals_brute_force(tmp_path):
    rng = np.random.default_rng(3)
    known = open_records(_atlas(tmp_path, rng))
    index = Index.build(known)
    index.write(tmp_path / "atlas.h5")
    read = Index.read(tmp_path / "atlas.h5")
    # Queries: every indexed record itself, and new records perturbed from them.
    queries = list(known[:20])
    for number, record in enumerate(known[:20]):
        path = tmp_path / f"query{number}.h5"
        bits = int(rng.integers(1, 24))
        write_record(path, {**BASE_ATTRS, "model": "m", "device": "unknown"},
                     {s: {"output": _perturbed(record.tensor(s, "output").values[0],
                                               rng, bits)[None]} for s in SAMPLES})
        queries.append(Record(path))
    outcomes = set()
    for query in queries:
        exact, nearest, best = _brute_force(query, known)
        for found in (index.identify(query), read.identify(query)):
            assert found.keys == len(SAMPLES)
            if exact:
                assert found.matched and _devices(found.records) == exact
            else:
                assert not found.matched and _devices(found.records) == nearest
                assert found.remaining_precision == max(23 - best, 0)
        outcomes.add(bool(exact))
    assert outcomes == {True, False}  # both paths were exercised


def test_an_index_never_matches_across_models(tmp_path):
    """Two models' records with identical outputs: a query is matched within its own
    model only, and a model the index has never seen is refused."""
    rng = np.random.default_rng(5)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = _atlas(tmp_path / "a", rng, records=4, model="a" * 64)
    second = []
    for path in first:
        record = Record(path)
        copy = tmp_path / "b" / path.name
        write_record(copy, {**BASE_ATTRS, "model_sha256": "b" * 64, "model": "m",
                            "device": record.device + "_b"},
                     {s: {"output": record.tensor(s, "output").values} for s in SAMPLES})
        second.append(copy)
    index = Index.build(open_records(first + second))
    found = index.identify(Record(first[0]))
    assert found.matched and all(not d.endswith("_b") for d in _devices(found.records))
    found = index.identify(Record(second[0]))
    assert found.matched and all(d.endswith("_b") for d in _devices(found.records))
    stranger = tmp_path / "stranger.h5"
    write_record(stranger, {**BASE_ATTRS, "model_sha256": "c" * 64, "model": "m",
                            "device": "x"},
                 {s: {"output": Record(first[0]).tensor(s, "output").values}
                  for s in SAMPLES})
    with pytest.raises(RecordError, match="not in the index.*never matched across models"):
        index.identify(Record(stranger))


def test_a_file_that_is_not_an_index_is_refused_by_name(tmp_path):
    path = tmp_path / "atlas.h5"
    path.write_bytes(b"not hdf5")
    with pytest.raises(RecordError, match="atlas.h5"):
        Index.read(path)


def test_the_commands(tmp_path):
    rng = np.random.default_rng(7)
    paths = _atlas(tmp_path, rng, records=6)
    atlas = tmp_path / "atlas.h5"
    built = subprocess.run([sys.executable, "-m", "bitdrift", "index", *map(str, paths),
                            "--out", str(atlas)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    assert "6 records" in built.stdout
    found = subprocess.run([sys.executable, "-m", "bitdrift", "identify", str(paths[0]),
                            "--index", str(atlas)], capture_output=True, text=True)
    assert found.returncode == 0 and "matched" in found.stdout and "device0" in found.stdout
    both = subprocess.run([sys.executable, "-m", "bitdrift", "identify", str(paths[0]),
                           "--index", str(atlas), "--against", str(paths[1])],
                          capture_output=True, text=True)
    assert both.returncode != 0 and "either --against" in both.stderr
