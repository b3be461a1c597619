"""Real inference in fresh processes, with TensorFlow and torch, on a tiny saved model."""

import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from bitdrift.analysis.effective_precision import recheck_record
from bitdrift.errors import AcceleratorMissing, RecordError
from bitdrift.inputs.models import model_digest
from bitdrift.record.reader import Record
from bitdrift.run.inference import InferenceError, infer
from bitdrift.run.repeat import RepeatJob
from bitdrift.run.selection import batch_indices

CPU = {"accelerator": "cpu", "threads": 1, "batch_size": 1, "precision": "float32",
       "env": {}, "repeats": 2, "external": False}


@pytest.fixture(scope="module")
def assets(small_model_copy, tmp_path_factory):
    return small_model_copy(tmp_path_factory.mktemp("assets"))


def test_batch_padding_is_fixed_filler():
    assert batch_indices([3, 0], 1, 10) == [3, 0]
    assert batch_indices([3, 0], 4, 10) == [3, 0, 1, 2]
    with pytest.raises(InferenceError):
        batch_indices([0], 8, 4)


def test_a_repeat_job_travels_as_the_dict_the_runtimes_read():
    """The parent's job of a measured repeat and of the traced one (bitdrift.run.repeat):
    each read back as it was sent; the traced one without the measured repeats' keys (it
    runs the model as deployed whatever ``observe``); a key that is no job's, or a required
    one left out, refused in one line naming it."""
    common = {"device": {**CPU, "backend": "torch"}, "device_name": "torch_cpu",
              "model_path": "small.keras", "dataset_path": "digits.h5", "samples": [6, 0],
              "full_samples": [6], "layers": True, "model_format": "keras",
              "reference": None, "export": None, "deployed_export": None}
    measured = RepeatJob(**common, model_name="small", out="repeat0.npz", orders=True,
                         observe=False, error_file="repeat0.error", counted_as="repeat 1/2")
    sent = json.loads(json.dumps(measured.as_dict()))
    assert RepeatJob.from_dict(sent) == measured
    assert sent["observe"] is False and sent["error_file"] == "repeat0.error"
    assert sent["counted_as"] == "repeat 1/2"
    assert "trace" not in sent and "batches" not in sent
    traced = RepeatJob(**common, out="traced.npz", fingerprint=False, trace=True, batches=[0])
    sent = traced.as_dict()
    assert sent["trace"] is True and sent["batches"] == [0]
    assert not {"model_name", "orders", "observe", "error_file", "counted_as"} & set(sent)
    assert RepeatJob.from_dict(sent).observe is True
    with pytest.raises(InferenceError, match="unknown key.* bogus"):
        RepeatJob.from_dict({**measured.as_dict(), "bogus": 1})
    with pytest.raises(InferenceError, match="missing key.* out"):
        RepeatJob.from_dict({key: value for key, value in measured.as_dict().items()
                             if key != "out"})


@pytest.mark.parametrize("backend", ["tensorflow", "torch", "jax"])
def test_record_of_a_real_run(assets, tmp_path, backend):
    dataset, model = assets
    out = tmp_path / "rec.h5"
    device = {**CPU, "backend": backend, "env": {"BITDRIFT_TEST_MARK": "1"}}
    # torch: the order search and the replay at 64 of the first conv's 32x32 positions
    replay = {"replay": True, "replay_positions": 64, "replay_samples": 8} \
        if backend == "torch" else None
    with open(tmp_path / "log", "w") as log:
        infer(model_name="small", device_name=f"{backend}_cpu", device=device, model_path=model,
              dataset_path=dataset, samples=[6, 0], out=out, log=log, replay=replay)
    with Record(out) as record:
        assert record.samples == [0, 6]
        assert record.attr("backend") == backend
        assert record.attr("model_sha256") == model_digest(model)
        fingerprint = record.fingerprint
        assert fingerprint["environment"] == {"BITDRIFT_TEST_MARK": "1"}
        assert fingerprint["cpu"]["flags"] and fingerprint["cpu"]["count"] >= 1
        assert backend in fingerprint["versions"]
        assert fingerprint["cuda_visible_devices"] == ""  # a CPU device hides GPUs
        layers = record.layers(0)
        assert [i.name for i in layers][:3] == ["conv2d", "activation", "pooling2d"]
        assert [i.position for i in layers] == list(range(len(layers)))
        conv = record.tensor(0, "conv2d").values
        assert conv.shape == (2, 32, 32, 3) and conv.dtype == np.float32
        output = record.instrumented_output(6).values
        assert output.shape == (2, 10)
        # the instrumented run's final output is the last layer's output
        assert np.array_equal(output, record.tensor(6, "dense_3").values)
        # repeats in fresh processes on one CPU were bit-identical on every machine seen
        assert np.array_equal(output[0], output[1])
        # the observer check: each repeat also ran the model as deployed (Keras' predict),
        # whose output is the final output the analyses read; the record's verdict is the
        # bitwise comparison of the two, recounted here
        deployed = record.tensor(6, "output").values
        assert record.has_deployed(6) and deployed.shape == output.shape
        check = record.observer_check
        assert "predict" in check["program"]
        assert check["samples"]["6"] == (deployed[0].tobytes() == output[0].tobytes())
        # the traced repeat logged the deployed run's kernels apart from the layers'
        # (TensorFlow and torch; JAX's traced repeat dumps XLA per layer, no deployed run)
        compared = record.kernels.get("deployed")
        if backend == "jax":
            assert compared is None
        else:
            assert compared["deployed"] and compared["instrumented"]
            if backend == "torch":  # Keras' predict on torch is eager, as the probe is
                assert not compared["differs"], compared
        # every layer whose order was revealed and replayed gives the record's bits, on any
        # CPU (issue 63: where two products meet, MKL's sgemm on an Intel Xeon fuses the
        # one the replay once never tried)
        for layer, entry in record.accumulation_orders.items():
            if entry["order"] != "not revealed" and not entry["replay"].startswith(
                    "not replayed"):
                assert entry["replay"].startswith("bit-identical"), (backend, layer, entry)
        conv_order = record.accumulation_orders["conv2d"]
        maps = conv_order["places"]["maps"]
        if backend == "torch":
            # analysis.replay_positions reached the worker: the search looked where the
            # replay did, an 8 x 8 grid of the 32 x 32, and not elsewhere
            sampled = conv_order["places"]["sampled"]
            assert sampled == {"y": conv_order["replayed"]["y"],
                               "x": conv_order["replayed"]["x"]}
            assert len(sampled["y"]) == len(sampled["x"]) == 8
            assert all(sum(line.count("-") for line in lines) == 1024 - 64 for lines in maps)
            assert "not searched there" not in conv_order["replay"]
            assert conv_order["order"].endswith("(order searched at 64 of 1024 positions)")
        else:  # the default: every position searched, as before
            assert "sampled" not in conv_order["places"] and "replayed" not in conv_order
            assert not any("-" in line for lines in maps for line in lines)


@pytest.fixture(scope="module")
def dense_weights(assets, tmp_path_factory):
    """dense_1's kernel and bias as saved, read by Keras in a process of its own."""
    _, model = assets
    out = tmp_path_factory.mktemp("weights") / "dense_1.npz"
    code = ("import keras, sys, numpy as np; m = keras.saving.load_model(sys.argv[1]); "
            "k, b = m.get_layer('dense_1').get_weights(); np.savez(sys.argv[2], k=k, b=b)")
    subprocess.run([sys.executable, "-c", code, str(model), str(out)], check=True,
                   env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    with np.load(out) as data:
        return data["k"], data["b"]


@pytest.mark.parametrize("backend", ["tensorflow", "torch", "jax"])
def test_float64_device_computes_in_float64(assets, dense_weights, tmp_path, backend):
    """dense_1 of a float64 device against an exact recomputation (long double) from the
    record's own flatten_1 output: Keras on torch used to compute it in float32 (relative
    error ~1e-5); an honest float64 layer is within ~1e-14."""
    dataset, model = assets
    out = tmp_path / "rec64.h5"
    device = {**CPU, "backend": backend, "precision": "float64", "repeats": 1}
    with open(tmp_path / "log", "w") as log:
        infer(model_name="small", device_name="f64", device=device, model_path=model,
              dataset_path=dataset, samples=[0, 6], out=out, log=log)
    with h5py.File(out) as handle:
        assert handle["samples/0/output"].dtype == np.float64
        assert handle["samples/0/layers/conv2d"].dtype == np.float64
        assert handle.attrs["precision"] == "float64"
    kernel, bias = (w.astype(np.float64).astype(np.longdouble) for w in dense_weights)
    with Record(out) as record:
        for sample in (0, 6):
            flat = record.tensor(sample, "flatten_1").values[0].astype(np.longdouble)
            dense = record.tensor(sample, "dense_1").values[0].astype(np.longdouble)
            exact = flat @ kernel + bias
            scale = np.abs(flat) @ np.abs(kernel) + np.abs(bias)
            assert np.max(np.abs(dense - exact) / scale) < 1e-14
        effective = record.effective_precision
        # every Dense and Conv layer checked, all within float64
        assert sorted(effective) == ["conv2d", "conv2d_1", "dense_1", "dense_2", "dense_3"]
        assert not any(result["reduced"] for result in effective.values())
        assert effective["dense_1"]["effective_bits"] > 46
        # a process of one runtime never loads (nor lists) another's framework
        versions = record.fingerprint["versions"]
        for framework in ("tensorflow", "torch", "jax"):
            assert (framework in versions) == (backend == framework), (framework, versions)


@pytest.mark.parametrize("backend", ["tensorflow", "torch", "jax"])
def test_gpu_device_without_gpu_fails_loudly(assets, tmp_path, backend):
    dataset, model = assets
    out = tmp_path / "gpu.h5"
    device = {**CPU, "accelerator": "gpu", "backend": backend, "repeats": 1}
    log_path = tmp_path / "log"
    with open(log_path, "w") as log, pytest.raises(AcceleratorMissing, match="refusing to fall"):
        infer(model_name="small", device_name="my_gpu", device=device, model_path=model,
              dataset_path=dataset, samples=[0], out=out, log=log)
    text = log_path.read_text()
    assert "device 'my_gpu' asks for a GPU" in text and "refusing to fall back" in text
    assert not out.exists()


def test_full_samples_and_layer_select_in_a_real_run(assets, tmp_path):
    """torch, 2 repeats (bit-identical on one CPU): the Conv2D layers and dense_3 recorded,
    each once with its two digests; sample 6's values in full, samples 0 and 1 as digests
    (their final outputs in full). A selection naming no layer is one line, no record."""
    import hashlib

    dataset, model = assets
    out = tmp_path / "rec.h5"
    device = {**CPU, "backend": "torch"}
    with open(tmp_path / "log", "w") as log:
        infer(model_name="small", device_name="t", device=device, model_path=model,
              dataset_path=dataset, samples=[6, 0, 1], out=out, log=log, kernels=False,
              full_samples=[6], layer_select=["Conv2D", "dense_3"])
        with pytest.raises(InferenceError, match=r"^config key analysis.layer_select: "
                                                 r"'Conv3D' names no layer or layer class "
                                                 r"of model 'small' \(classes: .*Conv2D"):
            infer(model_name="small", device_name="t", device=device, model_path=model,
                  dataset_path=dataset, samples=[0], out=tmp_path / "none.h5", log=log,
                  kernels=False, layer_select=["Conv3D"])
    assert not (tmp_path / "none.h5").exists()
    with h5py.File(out) as handle:
        assert sorted(handle["samples/6/layers"]) == ["conv2d", "conv2d_1", "dense_3"]
        full, digests_only = handle["samples/6/layers/conv2d"], handle["samples/0/layers/conv2d"]
        assert full.shape == (1, 32, 32, 3) and digests_only.shape == (0, 32, 32, 3)
        assert full.attrs["repeat_digest"].tolist() == [0, 0]
        assert handle["samples/0/output"].shape == (1, 10)
    with Record(out) as record:
        assert record.value_samples == [6]
        conv = record.tensor(6, "conv2d").values
        assert conv.shape == (2, 32, 32, 3) and np.array_equal(conv[0], conv[1])
        truth = hashlib.sha256(b"float32:(32, 32, 3):" + conv[0].tobytes()).digest()
        assert record.digests(6, "conv2d") == [truth, truth]
        # the last layer is the final output: sample 0's digests equal its output's
        assert record.digests(0, "dense_3") == record.digests(0, record.layers(0)[-1])
        # conv2d's input is the image; the others' inputs are not recorded
        effective = record.effective_precision
        assert sorted(effective) == ["conv2d", "conv2d_1", "dense_3"]
        assert "elements" in effective["conv2d"]
        assert effective["dense_3"] == {"unchecked": "its input activation_3 is not "
                                                     "recorded (analysis.layer_select)"}
        # the recomputation from the record reads sample 6 alone and agrees
        assert recheck_record(record, model, dataset) is None
        assert sorted(record.effective_precision) == ["conv2d"]


def test_a_record_without_full_samples_says_its_effective_precision_is_unchecked(
        assets, tmp_path):
    """analysis.full_samples: 0 keeps every layer's digests only (0 rows on disk): the
    effective precision needs full tensors, so the record carries no check and the table,
    the classes' summary and the findings say unchecked, naming why (never an empty check
    that reads as "declared")."""
    import pandas as pd

    from bitdrift.analysis.effective_precision import (
        NO_FULL_SAMPLES,
        effective_precision_table,
        summary,
        unchecked_reason,
    )
    from bitdrift.report.findings.classes import reduced_precision

    dataset, model = assets
    out = tmp_path / "rec.h5"
    with open(tmp_path / "log", "w") as log:
        infer(model_name="small", device_name="t", device={**CPU, "backend": "torch"},
              model_path=model, dataset_path=dataset, samples=[0, 1], out=out, log=log,
              kernels=False, full_samples=0)
    with h5py.File(out) as handle:  # no sample holds a layer's values
        assert {handle[f"samples/{sample}/layers/{layer}"].shape[0] for sample in (0, 1)
                for layer in handle["samples/0/layers"]} == {0}
    with Record(out) as record:
        assert not record.has_attr("effective_precision")
        assert unchecked_reason(record) == NO_FULL_SAMPLES
        rows = effective_precision_table([record])
        assert summary(record.effective_precision, unchecked_reason(record)) == \
            f"unchecked: {NO_FULL_SAMPLES}"
        # the workflow's table recomputes from the record: still nothing to check
        assert recheck_record(record, model, dataset) is None
        assert effective_precision_table([record]) == rows
    assert len(rows) == 1 and rows[0]["layer"] is None
    assert rows[0]["unchecked"] == NO_FULL_SAMPLES and "full_samples: 0" in NO_FULL_SAMPLES
    lines = reduced_precision(pd.DataFrame(rows))
    assert lines == ["No effective-precision check in the records.",
                     f"Unchecked on t: {NO_FULL_SAMPLES}."]


def test_infer_command_line(assets, tmp_path):
    dataset, model = assets
    config = {"samples": [1], "datasets": {"digits": {"source": "digits"}},
              "models": {"mine": {"file": str(model), "dataset": "digits"}},
              "devices": {"laptop": {"accelerator": "cpu", "backend": "torch", "threads": 1,
                                     "repeats": 1}}}
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    out = tmp_path / "laptop.h5"
    subprocess.run([sys.executable, "-m", "bitdrift.cli", "infer", "--config",
                    str(tmp_path / "config.yaml"), "--model", "mine", "--device", "laptop",
                    "--dataset-file", str(dataset), "--out", str(out)], check=True)
    with Record(out) as record:
        assert record.device == "laptop" and record.samples == [1]


def test_cpu_description_is_kept_per_host_and_boot(tmp_path, monkeypatch):
    import tempfile

    from bitdrift.run.devices import cpu_info

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first = cpu_info()
    cached = list(tmp_path.glob("bitdrift-cpuinfo-*.json"))
    assert len(cached) == 1 and first["count"] >= 1 and isinstance(first["flags"], list)
    assert cpu_info() == first  # read back, not measured again


def test_a_traced_repeat_of_the_full_samples_batches_alone(assets, tmp_path):
    """analysis.traced_samples: full. torch, batch size 2, samples [6, 0, 1] with sample 1
    in full: the batches are [6, 0] and [1, filler], and the traced repeat runs the second
    alone. Its kernels are those a traced repeat of every batch names, with half the calls
    (one batch of two), its outputs are checked on sample 1's rows, and the record names
    the samples traced."""
    from bitdrift.run.selection import traced_batch_numbers

    # by hand: rows 0..4 in batches of 2; no full sample traces the first batch
    assert traced_batch_numbers([6, 0, 1], [1], 2, "full") == [1]
    assert traced_batch_numbers([6, 0, 1, 3, 4], [6, 4], 2, "full") == [0, 2]
    assert traced_batch_numbers([6, 0, 1], [], 2, "full") == [0]
    assert traced_batch_numbers([6, 0, 1], [1], 2, "all") is None
    dataset, model = assets
    device = {**CPU, "backend": "torch", "batch_size": 2}
    kernels, logs = {}, {}
    for which in ("all", "full"):
        with open(tmp_path / f"{which}.log", "w") as log:
            infer(model_name="small", device_name="t", device=device, model_path=model,
                  dataset_path=dataset, samples=[6, 0, 1], out=tmp_path / f"{which}.h5",
                  log=log, full_samples=[1], traced_samples=which,
                  replay={"replay": False, "replay_positions": 64, "replay_samples": 1})
        logs[which] = (tmp_path / f"{which}.log").read_text()
        with Record(tmp_path / f"{which}.h5") as record:
            kernels[which] = record.kernels
    assert kernels["full"]["traced"] and kernels["full"]["outputs_match"]
    assert kernels["full"]["samples"] == [1] and "samples" not in kernels["all"]
    assert " on the batches of samples [1] alone (analysis.traced_samples: full)" in \
        logs["full"].split("traced repeat (kernel logs) in ")[1].splitlines()[0]
    # the traced repeat's own lines: one batch against two
    assert logs["full"].count("bitdrift: instrumented run of 1 batches of 2") == 1
    assert "bitdrift: instrumented run of 1 batches" not in logs["all"]
    layers_all, layers_full = kernels["all"]["layers"], kernels["full"]["layers"]
    assert {name: entry["signature"] for name, entry in layers_full.items()} == \
        {name: entry["signature"] for name, entry in layers_all.items()}
    logged = [name for name, entry in layers_all.items() if entry["calls"]]
    assert logged, "torch logged no oneDNN call: nothing to compare"
    for name in logged:
        assert 2 * len(layers_full[name]["calls"]) == len(layers_all[name]["calls"]), name



def test_samples_in_any_order_give_records_the_provenance_check_accepts(assets, tmp_path):
    """Issue 63: a config listing its samples out of order ([6, 0, 1]) ran every device,
    then every analysis refused every record (input_sha256 differs): the record's digest
    is of the images in the order the device ran them, the check took the samples sorted.
    Now the check takes the record's own order (samples_order): records of the samples
    listed in two orders both pass, each digest checked against one taken by hand, and,
    one sample per batch, they hold the same outputs. A record older than samples_order
    is checked in the order whose rows give its digest; other inputs, or a samples_order
    that is not the order the digest was taken in, are refused."""
    import hashlib
    import shutil

    from bitdrift.run.provenance import check_provenance

    dataset, model = assets
    device = {**CPU, "backend": "torch", "repeats": 1}
    records = {}
    with open(tmp_path / "log", "w") as log:
        for samples in ([6, 0, 1], [0, 1, 6]):
            records[tuple(samples)] = out = tmp_path / f"{'_'.join(map(str, samples))}.h5"
            infer(model_name="small", device_name="t", device=device, model_path=model,
                  dataset_path=dataset, samples=samples, out=out, log=log, kernels=False)
    with h5py.File(dataset) as handle:
        images = {sample: handle["x_test"][sample].astype(np.float32) for sample in (0, 1, 6)}

    def by_hand(order):
        return hashlib.sha256(b"".join(images[sample].tobytes() for sample in order)
                              ).hexdigest()

    with Record(records[(6, 0, 1)]) as shuffled, Record(records[(0, 1, 6)]) as ordered:
        assert shuffled.attr("input_sha256") == by_hand([6, 0, 1])
        assert ordered.attr("input_sha256") == by_hand([0, 1, 6])
        assert shuffled.json_attr("samples_order", list) == [6, 0, 1]
        assert check_provenance([shuffled, ordered], "small", model, dataset) == 2
        for sample in (0, 1, 6):
            assert np.array_equal(shuffled.tensor(sample, "output").values,
                                  ordered.tensor(sample, "output").values)
    older = tmp_path / "older.h5"
    shutil.copy(records[(6, 0, 1)], older)
    for digest, order, accepted in ((by_hand([6, 0, 1]), None, True),
                                    (by_hand([6, 0, 1]), [0, 1, 6], False),
                                    ("0" * 64, [6, 0, 1], False), ("0" * 64, None, False)):
        with h5py.File(older, "a") as handle:
            handle.attrs["input_sha256"] = digest
            if order is None:  # a record older than samples_order
                handle.attrs.pop("samples_order", None)
            else:
                handle.attrs["samples_order"] = json.dumps(order)
        with Record(older) as record:
            if accepted:
                assert check_provenance([record], "small", model, dataset) == 1
            else:
                with pytest.raises(RecordError, match=r"older.h5: device 't' was run on other "
                                   r"inputs than samples \[[016, ]+\] of "):
                    check_provenance([record], "small", model, dataset)
