"""The ablation study: variant construction, and Tables SUP-8/SUP-9 counted on hand-built
per-layer records with known answers."""

import numpy as np
import pytest

from bitdrift.config import ConfigError, validate_config
from bitdrift.record.reader import open_records
from bitdrift.record.writer import write_record
from bitdrift.studies.ablation.config import variant_models, variants_of
from bitdrift.studies.ablation.tables import (
    ablation_layers,
    activation_deviations,
    layer_effects,
    precision_casting,
)
from tests.utils import BASE_ATTRS


def _config(**ablation):
    return {
        "samples": [0],
        "datasets": {"digits": {"source": "digits"}},
        "models": {"small": {"architecture": "cifar10_small", "dataset": "digits",
                             "train": {"epochs": 2, "seeds": [7]}}},
        "devices": {"a": {"accelerator": "cpu", "backend": "tensorflow", "threads": 1},
                    "b": {"accelerator": "cpu", "backend": "torch", "threads": 1},
                    "c": {"accelerator": "cpu", "backend": "tensorflow", "threads": 2},
                    "cast": {"matrix": {"devices": ["a", "b"],
                                        "precision": ["float16", "float64"]}}},
        "ablation": {"models": ["small"], "devices": ["a", "c"],
                     "cross_framework": ["a", "b"], **ablation},
    }


def test_variants_are_the_base_with_one_change_and_the_same_seed():
    config = validate_config(_config())
    assert list(config["devices"]) == ["a", "b", "c", "a_float16", "a_float64", "b_float16",
                                       "b_float64"]  # the matrix, expanded in place
    assert config["devices"]["b_float64"] == {**config["devices"]["b"],
                                              "precision": "float64"}
    models = variant_models(config)
    # the paper's variants by default: Table SUP-7 and Figures SUP-6/7
    assert set(models) == {"small_sigmoid_avgpool", "small_untrained_relu",
                           "small_untrained_sigmoid", "small_untrained_linear"}
    assert models["small_sigmoid_avgpool"]["activation"] == "sigmoid"
    assert models["small_sigmoid_avgpool"]["pooling"] == "avg"
    assert models["small_untrained_relu"].get("activation", "relu") == "relu"
    assert models["small_untrained_relu"].get("pooling", "max") == "max"
    assert models["small_untrained_linear"]["activation"] == "linear"
    assert models["small_untrained_sigmoid"]["train"]["epochs"] == 0
    assert {m["train"]["seeds"][0] for m in models.values()} == {7}  # the same init seed
    assert config["models"]["small"]["train"]["epochs"] == 2  # the base is left alone
    entries = {e["variant"]: e for e in variants_of(config)}
    assert entries["base"]["model"] == "small"
    assert entries["untrained_relu"]["trained"] is False
    assert entries["sigmoid_avgpool"]["pooling"] == "avg" and entries["sigmoid_avgpool"][
        "trained"]


def test_study_config_keeps_config_order_through_sorted_params():
    # The workflow passes study_config as params with every key sorted; the variants and
    # the casting devices must still come out in config order, as on the command line.
    import json

    from bitdrift.studies.ablation.cli import (
        ablation_inputs,
        casting_devices,
        in_config_order,
        study_config,
    )

    config = validate_config(_config(variants={"zeta": {"activation": "sigmoid"},
                                               "alpha": {"pooling": "avg"}}))
    sorted_params = json.loads(json.dumps(study_config(config), sort_keys=True))
    assert list(sorted_params["ablation"]["variants"]) == ["alpha", "zeta"]  # as Snakemake
    restored = in_config_order(sorted_params)
    assert [e["variant"] for e in variants_of(restored)] == ["base", "zeta", "alpha"]
    assert casting_devices(restored) == casting_devices(config) == [
        "a", "b", "a_float16", "a_float64", "b_float16", "b_float64"]
    assert ablation_inputs(restored) == ablation_inputs(config)


def test_variant_models_build_with_their_layer_classes_and_positions():
    pytest.importorskip("keras")
    import os

    from bitdrift.inputs.models import build_model
    from bitdrift.run.devices import import_keras

    keras = import_keras(os.environ.get("KERAS_BACKEND", "tensorflow"))
    config = validate_config(_config(variants={"sigmoid_avg": {"activation": "sigmoid",
                                                               "pooling": "avg"}}))
    spec = variant_models(config)["small_sigmoid_avg"]
    model = build_model(keras, spec, (32, 32, 3), 10)
    classes = {index: layer.__class__.__name__ for index, layer in enumerate(model.layers)}
    assert [i for i, c in classes.items() if c == "AveragePooling2D"] == [3, 6]
    assert [i for i, c in classes.items() if c == "Activation"] == [2, 5, 9, 11]
    assert {model.layers[i].get_config()["activation"] for i in (2, 5, 9, 11)} == {"sigmoid"}
    assert model.layers[1].kernel_initializer.__class__.__name__ == "GlorotUniform"
    # Figure SUP-6: the linear model starts from the sigmoid model's (Xavier) weights
    linear = build_model(keras, {**spec, "activation": "linear"}, (32, 32, 3), 10)
    assert linear.layers[1].kernel_initializer.__class__.__name__ == "GlorotUniform"
    assert linear.get_layer("activation").get_config()["activation"] == "linear"


@pytest.mark.parametrize(("change", "key"), [
    ({"models": ["nope"]}, "ablation.models"),
    ({"devices": ["a", "zz"]}, "ablation.devices"),
    ({"devices": ["a", "a_float16"]}, "ablation.devices"),  # not the analysis precision
    ({"devices": ["a", "b"]}, "ablation.devices"),  # two frameworks: not the paper's test
    ({"cross_framework": ["a", "c"]}, "ablation.cross_framework"),  # one framework
    ({"variants": {"x": {"activation": "tanh"}}}, "ablation.variants.x.activation"),
])
def test_bad_ablation_sections_name_the_key(change, key):
    config = _config()
    config["ablation"].update(change)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(config)


def _flip(values, element, xor):
    bits = values.view(np.uint32).copy()
    bits[element] ^= np.uint32(xor)
    return bits.view(np.float32)


LAYERS = [("conv", "Conv2D"), ("act", "Activation"), ("pool", "MaxPooling2D"),
          ("dense", "Dense"), ("act2", "Activation")]


def _records(tmp_path):
    """Three devices; per layer, the elements device `b` and `c` change and the xor:
    conv: 3 of 4 elements differ in bit 0 (RP 22, 75 % deviating); act: 1 of 4 in bit 0
    (RP 22, 25 %); pool: identical (RP 23, 0 %); dense: 2 of 4 in bit 2 (RP 20, 50 %);
    act2: 1 of 4 in bit 1 (RP 21, 25 %)."""
    base = np.array([1.5, 2.5, 3.5, 4.5], dtype=np.float32)
    changes = {"conv": ([0, 1, 2], 1), "act": ([3], 1), "pool": ([], 0),
               "dense": ([0, 1], 4), "act2": ([2], 2)}
    paths = []
    for device in ("a", "b", "c"):
        layers = []
        for name, _ in LAYERS:
            values = base.copy()
            elements, xor = changes[name]
            if device != "a":
                for element in elements:
                    values = _flip(values, element, xor)
            layers.append((name, values[None, None, :]))
        path = tmp_path / f"{device}.h5"
        write_record(path, {**BASE_ATTRS, "model": "m", "device": device},
                     {0: {"output": layers[-1][1], "layers": layers,
                          "layer_classes": [c for _, c in LAYERS]},
                      1: {"output": layers[-1][1], "layers": layers,
                          "layer_classes": [c for _, c in LAYERS]}})
        paths.append(path)
    return open_records(paths)


ENTRY = {"base": "m", "variant": "base", "model": "m", "activation": "relu",
         "pooling": "max", "trained": True}


def test_table_sup8_deviations_before_and_after_each_activation(tmp_path):
    layers = ablation_layers([ENTRY], {"m": _records(tmp_path)}, "float32")
    by_layer = layers[layers["sample"] == 0].set_index("layer")
    assert by_layer.loc["conv", "remaining_precision"] == 22
    assert by_layer.loc["dense", "remaining_precision"] == 20
    assert by_layer.loc["act", "layer_index"] == 2  # input layer at 0
    table = activation_deviations(layers).set_index("layer")
    assert list(table.index) == ["act", "act2"]
    assert table.loc["act", "deviating_before"] == 0.75
    assert table.loc["act", "deviating_after"] == 0.25
    assert table.loc["act2", "previous_layer"] == "dense"
    assert (table.loc["act2", "deviating_before"], table.loc["act2", "deviating_after"]) == (
        0.5, 0.25)
    assert table["samples"].tolist() == [2, 2]


def test_table_sup9_counts_layers_that_raise_keep_or_lower_precision(tmp_path):
    layers = ablation_layers([ENTRY], {"m": _records(tmp_path)}, "float32")
    effects = layer_effects(layers).set_index("layer_kind")
    # act: 22 -> 22 unaffected; pool: 22 -> 23 up; dense: 23 -> 20 down; act2: 20 -> 21 up
    assert effects.loc["activation", ["increase", "unaffected", "decrease"]].tolist() == [
        1, 1, 0]
    assert effects.loc["pooling", ["increase", "unaffected", "decrease"]].tolist() == [1, 0, 0]
    assert effects.loc["dense", ["increase", "unaffected", "decrease"]].tolist() == [0, 0, 1]
    assert "convolution" not in effects.index  # the first layer has no layer before it
    assert effects["samples"].eq(2).all()


def test_precision_casting_groups_devices_by_precision(tmp_path, make_record):
    records = _records(tmp_path)
    table = precision_casting("m", records, ["float16", "float32"])
    assert set(table["precision"]) == {"float32"}  # no float16 record: left out
    output = table[(table["layer"] == "output") & (table["sample"] == 0)].iloc[0]
    assert output["mantissa_bits"] == 23 and output["n_devices"] == 3
    assert output["remaining_share"] == pytest.approx(21 / 23)


def test_adding_a_device_the_ablation_does_not_read_leaves_its_params_alone():
    """The tabulate rule's params are study_config: a new device elsewhere in the config
    must not make the workflow redo the ablation tables."""
    from bitdrift.studies.ablation.cli import study_config

    before = study_config(validate_config(_config()))
    extended = _config()
    extended["devices"]["laptop_gpu"] = {"accelerator": "gpu", "backend": "torch"}
    after = study_config(validate_config(extended))
    assert after == before
    assert set(before["devices"]) == {"a", "b", "c", "a_float16", "a_float64", "b_float16",
                                      "b_float64"}


def _layers_table(counts: dict[str, list[int]], devices: int = 3):
    """A hand-built ablation_layers table: one sample, three layers, a variant per key of
    ``counts`` with its number of classes per layer."""
    import pandas as pd

    rows = [{"base": "small", "variant": variant, "model": f"small_{variant}",
             "activation": "relu", "pooling": "max", "trained": True, "sample": 0,
             "layer": layer, "position": position, "layer_class": layer_class,
             "n_devices": devices, "n_eqc": count, "remaining_precision": 10 + position,
             "significant_bits_mean": 20.0}
            for variant, per_layer in counts.items()
            for position, ((layer, layer_class), count) in enumerate(zip(
                (("conv", "Conv2D"), ("relu", "Activation"), ("pool", "MaxPooling2D")),
                per_layer, strict=True))]
    return pd.DataFrame(rows)


def test_class_counts_equal_everywhere_are_said_in_the_title_not_drawn_flat(tmp_path):
    """Issue 64: five variants at 3 classes of 3 devices on every layer drew one flat line;
    the count goes into the title, and only a count that varies gets its panel."""
    from bitdrift.studies.ablation.figures import class_count_note, plot_ablation_layers
    from tests.utils import figure_text

    flat = _layers_table({"base": [3, 3, 3], "sigmoid": [3, 3, 3]})
    assert class_count_note(flat) == ("every layer of every variant: 3 classes among 3 "
                                      "devices (each device its own bits)")
    assert "agree bit for bit" in class_count_note(_layers_table({"base": [1, 1, 1]}))
    assert class_count_note(_layers_table({"base": [3, 3, 3], "sigmoid": [3, 1, 3]})) is None
    text = figure_text(plot_ablation_layers, flat, folder=tmp_path)
    assert "classes: every layer of every variant: 3 classes among 3 devices" in text
    assert "number of classes" not in text
    varied = figure_text(plot_ablation_layers,
                         _layers_table({"base": [3, 3, 3], "sigmoid": [3, 1, 3]}),
                         folder=tmp_path)
    assert "number of classes" in varied and "every layer of every variant" not in varied
