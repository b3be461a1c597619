import copy
from pathlib import Path

import pytest
import yaml

from bitdrift.config import ConfigError, load_config, validate_config

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = {"datasets": {"digits": {"source": "digits"}},
           "models": {"small": {"architecture": "cifar10_small", "dataset": "digits"}},
           "devices": {"cpu": {"accelerator": "cpu", "backend": "tensorflow"}}}


# every preset, the ones added later too (config/presets/resnet50_224.yaml, ...)
PRESETS = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "config/presets").glob("*.yaml"))


@pytest.mark.parametrize("path", ["config.yaml", "tests/config/config.yaml", *PRESETS])
def test_shipped_configs_are_valid(path):
    load_config(ROOT / path)


def test_the_real_size_preset_is_resnet50_at_224_on_the_default_devices():
    preset = load_config(ROOT / "config/presets/resnet50_224.yaml")
    default = load_config(ROOT / "config.yaml")
    assert preset["devices"] == default["devices"] and len(preset["devices"]) == 30
    assert preset["samples"] == list(range(100))
    (model,) = preset["models"].values()
    dataset = preset["datasets"][model["dataset"]]
    assert model["architecture"] == "resnet50" and dataset["image_size"] == 224
    # the digits' test set is the last 20 % of 1797 images: 360, cut to limit_test
    assert dataset["limit_test"] >= len(preset["samples"])
    # every device's last batch is filled up from the test set (bitdrift.run.selection.
    # batch_indices): tf_batch8 needs 104 images for 100 samples
    for name, device in preset["devices"].items():
        batches = -(-len(preset["samples"]) // device["batch_size"])
        assert dataset["limit_test"] >= batches * device["batch_size"], name


def test_defaults_are_filled():
    config = validate_config(copy.deepcopy(MINIMAL))
    assert config["samples"] == [0, 1, 6]
    device = config["devices"]["cpu"]
    assert device["repeats"] == 2 and device["precision"] == "float32"
    assert device["batch_size"] == 1 and device["env"] == {}
    assert config["models"]["small"]["train"]["seeds"] == [1]
    assert config["analysis"]["precision"] == "float32"
    from bitdrift.config import replay_settings

    # the replay of every position and sample of the default run (a 32x32 grid, 3 samples)
    assert replay_settings(config) == {"replay": True, "replay_positions": 1024,
                                       "replay_samples": 8}


@pytest.mark.parametrize("mutate,key", [
    (lambda c: c["devices"]["cpu"].update(threads="two"), "devices.cpu.threads"),
    (lambda c: c["devices"]["cpu"].update(threds=2), "devices.cpu"),
    (lambda c: c["devices"]["cpu"].update(accelerator="fpga"), "devices.cpu.accelerator"),
    (lambda c: c["devices"]["cpu"]["env"].update(X=1) if "env" in c["devices"]["cpu"]
     else c["devices"]["cpu"].update(env={"X": 1}), "devices.cpu.env.X"),
    (lambda c: c["devices"].update({"bad name": {"accelerator": "cpu", "backend": "torch"}}),
     "devices"),
    (lambda c: c["models"]["small"].update(file="x.keras"), "models.small"),
    (lambda c: c.update(samples=[-1]), "samples.0"),
    (lambda c: c["models"]["small"].update(dataset="cifar"), "models.small.dataset"),
    (lambda c: c.pop("devices"), "(top level)"),
    (lambda c: c.setdefault("analysis", {}).update(full_samples=[0, 9]),
     "analysis.full_samples"),
    (lambda c: c.setdefault("analysis", {}).update(full_samples=-1), "analysis.full_samples"),
    (lambda c: c.setdefault("analysis", {}).update(layer_select=[]), "analysis.layer_select"),
])
def test_errors_name_the_bad_key(mutate, key):
    config = copy.deepcopy(MINIMAL)
    mutate(config)
    with pytest.raises(ConfigError) as error:
        validate_config(config)
    assert f"config key {key}:" in str(error.value)


def test_a_model_file_cannot_be_trained():
    config = copy.deepcopy(MINIMAL)
    config["models"]["mine"] = {"file": "m.keras", "dataset": "digits", "train": {"epochs": 1}}
    with pytest.raises(ConfigError, match="models.mine.train"):
        validate_config(config)


def test_snakefile_rejects_bad_config_with_the_key(tmp_path):
    import subprocess
    import sys

    bad = copy.deepcopy(MINIMAL)
    bad["devices"]["cpu"]["repeats"] = 0
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", "-s", str(ROOT / "Snakefile"),
                             "--configfile", str(tmp_path / "bad.yaml"), "-d", str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode != 0
    assert "config key devices.cpu.repeats" in result.stdout + result.stderr


def _undescribed(node, path=""):
    """Schema keys without a description (a $ref carries its target's)."""
    missing = []
    if not isinstance(node, dict):
        return missing
    for key, child in node.get("properties", {}).items():
        if isinstance(child, dict) and "description" not in child and "$ref" not in child:
            missing.append(f"{path}.{key}")
        missing += _undescribed(child, f"{path}.{key}")
    for key in ("additionalProperties", "items"):
        missing += _undescribed(node.get(key), f"{path}.{key}")
    for name, child in node.get("$defs", {}).items():
        if "description" not in child:
            missing.append(f"$defs.{name}")
        missing += _undescribed(child, f"$defs.{name}")
    for key in ("oneOf", "anyOf", "allOf"):
        for child in node.get(key, []):
            missing += _undescribed(child, path)
    return missing


def test_every_schema_key_is_described():
    from bitdrift.config import load_schema

    assert _undescribed(load_schema()) == []
