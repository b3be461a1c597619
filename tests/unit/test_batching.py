"""The batch-invariance study: verdicts on hand-built layers whose batch dependence is
known, the batches it builds, decoding, the config's errors, and a real transformer run
on TensorFlow and torch in the device's own process."""

import copy
import json

import numpy as np
import pytest

from bitdrift.config import load_config, validate_config
from bitdrift.errors import ConfigError, DatasetError
from bitdrift.inputs.datasets import GRAMMAR_VOCABULARY, detokenize, load_grammar, tokenize
from bitdrift.studies.batching.analysis import batching_tables, origins
from bitdrift.studies.batching.runs import (
    batch_settings,
    build_batch,
    compare,
    decoding_entry,
    first_divergence,
    greedy_decode,
    layer_verdicts,
)
from tests.utils import ROOT

LAYERS = ["scale", "ordered_sum", "after_sum", "sequence_mean"]
INBOUND = {"scale": ["tokens"], "ordered_sum": ["scale"], "after_sum": ["ordered_sum"],
           "sequence_mean": ["scale"]}


def hand_built_run(batch):
    """A four-layer "model" in NumPy float32. scale: elementwise. ordered_sum: a running
    sum over each token's features whose order depends on the batch size (forward alone,
    backward in a batch), as a split reduction's does. after_sum: elementwise on it (an
    exact doubling). sequence_mean: a mean over the whole (padded) row, which padding changes."""
    tokens = batch.astype(np.float32)
    features = np.float32(1.0) / (tokens[..., None] + np.arange(1, 17, dtype=np.float32))
    scale = features * np.float32(3.7)
    order = range(16) if len(batch) == 1 else range(15, -1, -1)
    total = np.zeros(scale.shape[:2], np.float32)
    for index in order:
        total = total + scale[..., index]
    return [scale, total, total * np.float32(2.0), np.broadcast_to(
        scale.mean(axis=1, keepdims=True), scale.shape).copy()]


@pytest.fixture(scope="module")
def hand_built():
    rng = np.random.default_rng(0)
    test = rng.integers(1, 40, size=(20, 6)).astype(np.float32)
    settings = batch_settings([2, 8], ["first", "middle", "last"], 2, 9)
    verdicts = layer_verdicts(hand_built_run, LAYERS, [0, 3], test, settings, 9)
    return test, settings, verdicts


def test_settings_cover_sizes_positions_neighbours_and_padding():
    names = [s["name"] for s in batch_settings([2, 8], ["first", "middle", "last"], 2, 9)]
    assert names == ["alone", "batch2_at0", "batch2_at1", "batch2_neighbours1", "batch8_at0",
                     "batch8_at4", "batch8_at7", "batch8_neighbours1", "padded9"]


def test_a_batch_dependent_reduction_is_flagged_and_an_elementwise_layer_is_not(hand_built):
    test, settings, verdicts = hand_built
    by = {(v["setting"], v["input"], v["layer"]): v for v in verdicts}
    # the truth, computed here: does the backward sum differ from the forward one?
    for index in (0, 3):
        scale = (np.float32(1.0) / (test[index][:, None] + np.arange(1, 17, dtype=np.float32))
                 ) * np.float32(3.7)
        forward = np.zeros(len(test[index]), np.float32)
        backward = np.zeros(len(test[index]), np.float32)
        for column in range(16):
            forward = forward + scale[:, column]
            backward = backward + scale[:, 15 - column]
        assert not np.array_equal(forward, backward)  # the hand-built case is non-invariant
        for setting in settings:
            name = setting["name"]
            assert by[(name, index, "scale")]["equal"]  # elementwise: never flagged
            in_batch = setting["batch_size"] > 1
            assert by[(name, index, "ordered_sum")]["equal"] is not in_batch
            assert by[(name, index, "after_sum")]["equal"] is not in_batch
            # padding lengthens the row the mean runs over; batching does not
            assert by[(name, index, "sequence_mean")]["equal"] is not setting["padded"]
    started = origins(verdicts, INBOUND)
    assert {layer for _, _, layer in started} == {"ordered_sum", "sequence_mean"}
    # after_sum differs only because its input does: inherited, not an origin
    assert not any(layer == "after_sum" for _, _, layer in started)


def test_remaining_precision_of_a_one_bit_difference():
    a = np.array([1.0, 2.0], np.float32)
    b = np.array([np.nextafter(np.float32(1.0), np.float32(2.0)), 2.0], np.float32)
    assert compare(a, a) == {"equal": True, "remaining_precision": 23, "differing_share": 0.0}
    result = compare(a, b)
    assert result["equal"] is False
    assert result["remaining_precision"] == 22  # the lowest of 23 mantissa bits differs
    assert result["differing_share"] == 0.5


def test_build_batch_places_the_target_and_never_repeats_it():
    target = np.array([5, 6, 7], np.float32)
    pool = np.arange(1, 31, dtype=np.float32).reshape(10, 3) + 100
    batch = build_batch(target, pool, {"batch_size": 4, "position": 2, "neighbours": 1,
                                       "padded": False})
    assert batch.shape == (4, 3) and np.array_equal(batch[2], target)
    assert all(any(np.array_equal(row, p) for p in pool) for row in np.delete(batch, 2, 0))
    padded = build_batch(target, pool, {"batch_size": 1, "position": 0, "neighbours": 0,
                                        "padded": True}, 5)
    assert padded.tolist() == [[5, 6, 7, 0, 0]]


def test_greedy_decoding_and_first_divergence():
    vocabulary = 10

    def final(batch):  # next token = last token + 1, or + 2 in a batch of 8 after step 3
        logits = np.zeros((*batch.shape, vocabulary), np.float32)
        for row in range(len(batch)):
            for position in range(batch.shape[1]):
                step = 2 if len(batch) == 8 and position >= 4 else 1
                logits[row, position, (int(batch[row, position]) + step) % vocabulary] = 1
        return logits

    pool = np.ones((10, 8), np.float32)
    alone = greedy_decode(final, [1, 2], 5, pool, {"batch_size": 1, "position": 0,
                                                   "neighbours": 0}, 7)
    batched = greedy_decode(final, [1, 2], 5, pool, {"batch_size": 8, "position": 3,
                                                     "neighbours": 0}, 7)
    assert alone[0] == [3, 4, 5, 6, 7]
    assert batched[0] == [3, 4, 5, 7, 9]
    assert first_divergence(alone[0], batched[0]) == 4
    assert first_divergence(alone[0], alone[0]) is None
    # one-hot logits: every decision has a gap of 1; up to the divergent step the logits
    # move by 1 (step 4's one-hot sits on another token), never more
    entry = decoding_entry(alone, batched)
    assert entry == {"tokens": [3, 4, 5, 7, 9], "largest_logit_change": 1.0,
                     "smallest_margin": 1.0}
    assert decoding_entry(alone, alone)["largest_logit_change"] == 0.0


def test_decoding_entry_measures_the_closest_call():
    alone = ([1, 1], np.array([[0.0, 2.0, 1.5], [0.0, 3.0, 0.0]]))
    nudged = ([1, 1], np.array([[0.0, 2.0, 1.5001], [0.0, 3.0, 0.0]]))
    entry = decoding_entry(alone, nudged)
    assert entry["smallest_margin"] == pytest.approx(0.5)  # 2.0 - 1.5 at step 1
    assert entry["largest_logit_change"] == pytest.approx(1e-4)


def test_tables_count_differing_settings_and_completions(hand_built):
    _, settings, verdicts = hand_built
    run = {"device": "d", "backend": "numpy", "precision": "float32",
           "layers": [[layer, "X"] for layer in LAYERS], "settings": settings,
           "verdicts": verdicts, "prompts": [[1, 2]],
           "decoding": [{"prompt": 0, "setting": s["name"],
                         "tokens": [3, 4] if s["batch_size"] == 1 else [3, 5],
                         "largest_logit_change": 0.25 * s["batch_size"],
                         "smallest_margin": 0.5}
                        for s in settings]}
    tables = batching_tables([run], INBOUND, [str(i) for i in range(10)])
    (summary,) = tables["summary"]
    # the last layer (sequence_mean) differs only when padded
    assert summary["settings_differing"] == 1
    assert summary["first_layer_differing"] == "ordered_sum"
    assert summary["origin_layers"] == "ordered_sum;sequence_mean"
    assert summary["first_divergent_token"] == 2
    assert summary["distinct_completions"] == 2
    assert summary["largest_logit_change"] == 2.0  # 0.25 x batch 8
    assert summary["smallest_margin"] == 0.5
    cells = {(r["layer"], r["setting"]): r for r in tables["layers"]}
    assert cells[("scale", "batch8_at4")]["verdict"] == "equal"
    assert cells[("ordered_sum", "batch8_at4")]["inputs_differing"] == 2


def test_grammar_tokens_round_trip_and_unknown_words_are_named():
    data = load_grammar(sequence_length=10, train_sequences=5, test_sequences=3, seed=1)
    assert data["x_test"].shape == (3, 10) and data["x_test"].dtype == np.float32
    # y is x shifted by one token: the next token at every position
    assert np.array_equal(data["x_train"][:, 1:], data["y_train"][:, :-1])
    text = detokenize(data["x_test"][0])
    assert tokenize(text) == data["x_test"][0].astype(int).tolist()
    with pytest.raises(DatasetError, match="'unicorn'"):
        tokenize("the unicorn sleeps")
    assert GRAMMAR_VOCABULARY[0] == "<pad>"


@pytest.mark.parametrize(("change", "message"), [
    (lambda b: b.update(batch_sizes=[2, 300]), r"batch_sizes: \[300\] above the test set's 256"),
    (lambda b: b.update(padded_length=80), r"padded_length: 80 .* context \(64\)"),
    (lambda b: b["decoding"].update(prompts=["the unicorn"]), r"prompts\[0\].*'unicorn'"),
    (lambda b: b["decoding"].update(tokens=70), r"longer than the model's context \(64\)"),
    (lambda b: b.update(inputs=[256]), r"inputs: \[256\] beyond the test set"),
    (lambda b: b.update(devices=["tf_gpu"]), r"batching.devices: unknown device 'tf_gpu'"),
])
def test_config_errors_name_the_value_before_any_job(change, message):
    config = load_config(ROOT / "config.yaml")
    raw = copy.deepcopy(config)
    change(raw["batching"])
    with pytest.raises(ConfigError, match=message):
        validate_config(raw)


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    """A one-block transformer trained for one epoch on short grammar sequences, by Keras
    on TensorFlow in a process of its own (this one may hold Keras on another backend)."""
    import os
    import subprocess
    import sys

    from bitdrift.inputs.datasets import prepare_dataset

    folder = tmp_path_factory.mktemp("transformer")
    dataset = folder / "grammar.h5"
    prepare_dataset("grammar", {"source": "grammar", "sequence_length": 10,
                                "train_sequences": 128, "test_sequences": 16}, dataset)
    spec = {"architecture": "tiny_transformer", "dataset": "grammar", "blocks": 1,
            "embedding_size": 16, "heads": 2, "context": 16,
            "train": {"epochs": 1, "batch_size": 32, "learning_rate": 0.003,
                      "optimizer": "adam", "seeds": [1], "deterministic": True,
                      "backend": "tensorflow"}}
    code = ("import json, sys; from bitdrift.run.training import train_model; "
            "folder = sys.argv[2]; "
            "train_model(spec=json.loads(sys.argv[1]), seed=1, "
            "dataset_path=folder + '/grammar.h5', out_model=folder + '/model.keras', "
            "out_history=folder + '/history.csv', out_logits=folder + '/logits.h5', "
            "threads=1)")
    subprocess.run([sys.executable, "-c", code, json.dumps(spec), str(folder)], check=True,
                   env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    return folder


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_transformer_run_on_a_device(transformer, backend):
    from bitdrift.studies.batching.runs import run_device

    out = transformer / f"{backend}.json"
    device = {"accelerator": "cpu", "backend": backend, "threads": 1, "precision": "float32",
              "batch_size": 1, "repeats": 1, "env": {}}
    with open(transformer / f"{backend}.log", "w") as log:
        run_device(model_name="t", device_name=backend, device=device,
                   model_path=transformer / "model.keras",
                   dataset_path=transformer / "grammar.h5", inputs=[0, 2],
                   batch_sizes=[2, 16], positions=["first", "last"], neighbour_sets=1,
                   padded_length=14, prompts=[tokenize("the cat")], tokens=4, out=out,
                   log=log)
    run = json.loads(out.read_text())
    layers = [layer for layer, _ in run["layers"]]
    assert layers[0] == "token_embedding" and layers[-1] == "logits"
    assert "causal_mask" not in layers  # a boolean mask has no bits to compare
    settings = [s["name"] for s in run["settings"]]
    assert settings == ["alone", "batch2_at0", "batch2_at1", "batch16_at0", "batch16_at15",
                        "padded14"]
    assert len(run["verdicts"]) == 2 * len(settings) * len(layers)
    for verdict in run["verdicts"]:
        if verdict["setting"] == "alone" or verdict["layer"] == "token_embedding":
            # the baseline itself, and a gather (a row lookup): bit-equal by construction
            assert verdict["equal"], verdict
    assert len(run["decoding"]) == len(settings)
    assert all(len(entry["tokens"]) == 4 for entry in run["decoding"])


def test_a_terminated_run_leaves_no_temporary_folder_and_no_output(transformer, tmp_path):
    """SIGTERM (Snakemake, scancel) mid-run: the worker's folder is removed, no run file."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out, log = tmp_path / "run.json", tmp_path / "log.txt"
    code = (
        "from bitdrift.studies.batching.runs import run_device\n"
        "import sys\n"
        "run_device(model_name='t', device_name='tf', device={'accelerator': 'cpu', "
        "'backend': 'tensorflow', 'threads': 1, 'precision': 'float32', 'batch_size': 1, "
        "'repeats': 1, 'env': {}}, "
        f"model_path={str(transformer / 'model.keras')!r}, "
        f"dataset_path={str(transformer / 'grammar.h5')!r}, inputs=[0], batch_sizes=[2], "
        "positions=['first'], neighbour_sets=1, padded_length=None, prompts=[[1, 2]], "
        f"tokens=8, out={str(out)!r}, log=sys.stderr)\n")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    with open(log, "w") as handle:
        process = subprocess.Popen([sys.executable, "-c", code], stderr=handle,
                                   env={**os.environ, "TMPDIR": str(temporary)})
        deadline = time.time() + 120
        while "batch settings" not in log.read_text() and time.time() < deadline:
            time.sleep(0.2)
        work = f".{out.name}.work-*"
        assert list(out.parent.glob(work))  # the run is under way, beside its output
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) != 0
    assert not list(out.parent.glob(work)) and not list(temporary.iterdir())
    assert not out.exists()
