"""`bitdrift repro`: the first layer where two real records part, as one-layer scripts that
reproduce each device's bits. The truth is read from the records with h5py and hashed
here; the scripts run in their own processes, as a user runs them."""

import hashlib
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from bitdrift.cli import main
from bitdrift.run.inference import infer

CPU = {"accelerator": "cpu", "threads": 1, "batch_size": 2, "precision": "float32",
       "env": {}, "repeats": 1, "external": False}
DEVICES = {
    "tf": {"backend": "tensorflow"},
    # another batch size: each script pads the shared input to its own batches
    "tf_batch4": {"backend": "tensorflow", "batch_size": 4},
    "torch": {"backend": "torch"},
    "jax": {"backend": "jax"},
    "ort": {"backend": "onnxruntime", "graph_optimization_level": "all"},
    "ort_plain": {"backend": "onnxruntime", "graph_optimization_level": "disable_all"},
    "openvino": {"backend": "openvino", "execution_mode": "ACCURACY"},
    "tf_f16": {"backend": "tensorflow", "precision": "float16"},
    "torch_f16": {"backend": "torch", "precision": "float16"},
    "litert": {"backend": "litert", "op_resolver": "xnnpack"},
    "litert_builtin": {"backend": "litert", "op_resolver": "builtin"},
}
SAMPLES = [6, 0, 3]


@pytest.fixture(scope="module")
def records(small_export_copy, tmp_path_factory):
    """Real records of an untrained Cifar10-small on the devices above, and its export."""
    from tests.utils import EXPORT_FILES

    tmp = tmp_path_factory.mktemp("repro")
    dataset, model, reference = small_export_copy(tmp)
    paths = {}
    for name, settings in DEVICES.items():
        device = {**CPU, **settings}
        paths[name] = tmp / f"{name}.h5"
        with open(tmp / "log", "a") as log:
            infer(model_name="small", device_name=name, device=device, model_path=model,
                  dataset_path=dataset, samples=SAMPLES, out=paths[name], log=log,
                  reference=reference,
                  export=tmp / EXPORT_FILES[device["backend"]]
                  if device["backend"] in EXPORT_FILES else None, kernels=False)
    return paths, model, dataset


def first_parting(path_a, path_b):
    """The first layer (by recorded position) whose stored bits differ in any sample,
    and each record's SHA-256 of that layer over the samples in the order they ran (the
    record's samples_order; repeat 0)."""
    with h5py.File(path_a) as a, h5py.File(path_b) as b:
        samples = [str(sample) for sample in json.loads(a.attrs["samples_order"])]
        assert samples == [str(sample) for sample in SAMPLES]
        layers = sorted(a[f"samples/{samples[0]}/layers"].items(),
                        key=lambda item: int(item[1].attrs["position"]))
        for name, _ in layers:
            values = [np.stack([f[f"samples/{s}/layers/{name}"][0] for s in samples])
                      for f in (a, b)]
            if values[0].tobytes() != values[1].tobytes():
                return name, [hashlib.sha256(v.tobytes()).hexdigest() for v in values]
    return None, None


def run_script(folder, script):
    done = subprocess.run([sys.executable, script], cwd=folder, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("pair", [("tf", "torch"), ("tf", "jax"), ("ort", "ort_plain"),
                                  ("ort", "openvino"), ("tf", "ort"),
                                  ("tf_f16", "torch_f16"), ("litert", "litert_builtin"),
                                  ("tf", "litert"), ("tf", "tf_batch4"),
                                  ("tf_batch4", "jax")])
def test_each_script_prints_its_records_digest_and_the_two_differ(records, tmp_path, pair):
    paths, model, dataset = records
    a, b = pair
    layer, truths = first_parting(paths[a], paths[b])
    if layer is None:  # this CPU gave both devices the same bits: nothing parts
        assert main(["repro", str(paths[a]), str(paths[b]), "--model-file", str(model),
                     "--out", str(tmp_path / "repro")]) == 1
        return
    out = tmp_path / "repro"
    assert main(["repro", str(paths[a]), str(paths[b]), "--model-file", str(model),
                 "--dataset-file", str(dataset), "--out", str(out)]) == 0
    summary = json.loads((out / "expected.json").read_text())
    assert summary["layer"] == layer
    for name, truth in zip(pair, truths, strict=True):
        script = summary["devices"][name]["script"]
        # the script needs numpy and its runtime, not bitdrift
        assert "bitdrift" not in (out / script).read_text()
        assert run_script(out, script) == truth, name
    assert truths[0] != truths[1]
    # the command's own check agrees
    assert main(["repro", str(paths[a]), str(paths[b]), "--model-file", str(model),
                 "--dataset-file", str(dataset), "--out", str(out), "--check"]) == 0


def test_records_that_agree_another_model_or_format_are_refused(records, tmp_path, capsys):
    paths, model, dataset = records
    out = str(tmp_path / "repro")
    assert main(["repro", str(paths["tf"]), str(paths["tf"]), "--model-file", str(model),
                 "--out", out]) == 1
    assert "agree bit for bit in every recorded layer" in capsys.readouterr().err
    assert main(["repro", str(paths["tf"]), str(paths["tf_f16"]), "--model-file", str(model),
                 "--out", out]) != 0
    assert "other precisions (float32, float16)" in capsys.readouterr().err
    # a model file the records did not run: named
    other = tmp_path / "other.keras"
    code = ("import keras, sys; from bitdrift.inputs.models import build_model; "
            "keras.utils.set_random_seed(1); build_model(keras, {'architecture': "
            "'cifar10_small'}, (32, 32, 3), 10).save(sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, str(other)], check=True,
                   env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    layer, _ = first_parting(paths["tf"], paths["torch"])
    if layer is not None:
        assert main(["repro", str(paths["tf"]), str(paths["torch"]), "--model-file",
                     str(other), "--out", out]) != 0
        assert f"{other}: not the model the records ran" in capsys.readouterr().err
    # a folder of other files is never replaced
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert main(["repro", str(paths["tf"]), str(paths["jax"]), "--model-file", str(model),
                 "--dataset-file", str(dataset), "--out", str(busy)]) != 0
    assert (busy / "notes.txt").read_text() == "mine"


def test_an_emulated_arm_device_is_refused_a_script_with_the_reason():
    """Its command would name this machine's QEMU, root and site: the folder says why
    instead (checked before anything about the layer is looked at)."""
    from bitdrift.run.repro import refusal

    why = refusal({"backend": "onnxruntime", "precision": "float32",
                   "emulate": "neoverse-n1"}, None)
    assert why and "emulated Arm CPU neoverse-n1" in why
    # an emulated x86 CPU is not refused for being emulated
    assert refusal({"backend": "litert", "precision": "float16",
                    "emulate": "Haswell-v4"}, None) == "litert: the export is float32"
