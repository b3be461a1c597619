"""The paper-scale training-variance preset on the SLURM profile (dry run): Morin &
Willetts' 50 + 50 runs of Keras ResNet-50 and of the Keras example's ResNet v2 (depth 29),
200 epochs each, every run one job on its device's partition with its plan's resources."""

import itertools
import re

import pandas as pd
import pytest
import yaml

from bitdrift.record.reader import Record
from tests.utils import ROOT, snakemake

pytestmark = pytest.mark.workflow
PRESET = ROOT / "config/presets/training_variance_paper.yaml"


def dry_run_jobs(output: str) -> list[dict]:
    """Each job of a dry run: its rule, wildcards and resources."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", output):
        rule = re.match(r"(?:local)?rule (\w+):", block)
        if not rule:
            continue
        fields = {}
        for key in ("wildcards", "resources"):
            line = re.search(rf"^\s+{key}: (.*)$", block, re.M)
            fields[key] = dict(item.split("=", 1) for item in line.group(1).split(", ")) \
                if line else {}
        jobs.append({"rule": rule.group(1), **fields})
    return jobs


def test_morin_willetts_runs_land_on_their_partition_with_their_resources(tmp_path):
    settings = yaml.safe_load(PRESET.read_text())
    variance = settings["training_variance"]
    for plan, architecture in (("morin_resnet50", "resnet50"),
                               ("morin_resnet29v2", "resnet_v2")):
        model = variance["models"][variance["plans"][plan]["model"]]
        assert model["architecture"] == architecture and model["epochs"] == 200
        assert model["batch_size"] == 32 and variance["plans"][plan]["runs"] == 50
        assert set(variance["plans"][plan]["arms"]) == {"same", "different"}
    output = snakemake(tmp_path, "all", "-n", "--profile", str(ROOT / "profiles/slurm-gpu"),
                       configfile=PRESET)
    runs = [job for job in dry_run_jobs(output) if job["rule"] == "train_variance_run"]
    morin = [job for job in runs if job["wildcards"]["plan"].startswith("morin_")]
    assert len(morin) == 2 * 2 * 50  # two models x same/different x 50 runs
    for job in runs:
        plan = variance["plans"].get(job["wildcards"]["plan"]) or variance["ensemble"]
        device = settings["devices"][job["wildcards"]["device"]]
        expected = {**device.get("resources", {}), **plan.get("resources", {})}
        for key, value in expected.items():
            assert job["resources"].get(key) == str(value), (job, key)


# The runtimes of each format, written out (docs/your-model.md): the formats' lists are checked
RUNTIMES_OF = {".onnx": ("onnxruntime", "openvino", "torch_export", "litert"),
               ".pt2": ("onnxruntime", "openvino", "torch_export", "litert", "torch_inductor",
                        "executorch")}


def test_your_model_preset_runs_an_onnx_model_with_no_keras_rule(tmp_path):
    """config/presets/your_model.yaml (dry run; tests/workflow/test_onnx_model.py and
    test_pt2_model.py run such models through): the example ONNX model, the example .pt2
    programs (a CNN, an attention encoder) and their inputs are built by the rule
    example_model, then each device whose runtime runs the model's format runs it;
    nothing is trained or exported."""
    preset = ROOT / "config/presets/your_model.yaml"
    settings = yaml.safe_load(preset.read_text())
    output = snakemake(tmp_path, "all", "-n", configfile=preset)
    rules = [job["rule"] for job in dry_run_jobs(output)]
    assert rules.count("example_model") == len(settings["models"]) == 3
    backends = [device["backend"] for device in settings["devices"].values()]
    assert rules.count("run_inference") == sum(
        backend in RUNTIMES_OF[entry["file"][entry["file"].rindex("."):]]
        for entry in settings["models"].values() for backend in backends)
    for rule in ("train_model", "export_model", "export_reference", "prepare_dataset"):
        assert rule not in rules


def test_the_your_model_preset_runs_every_device_and_its_classes_recount(tmp_path):
    """CI runs config/presets/your_model.yaml as a user would: the rule example_model builds
    both models, every device whose runtime runs a model's format runs it (converted where
    it must be), none fails; each model's classes per sample are those of the records'
    final-output bytes, compared here pair by pair."""
    preset = ROOT / "config/presets/your_model.yaml"
    settings = yaml.safe_load(preset.read_text())
    snakemake(tmp_path, "all", configfile=preset, timeout=2400)
    results = tmp_path / "results"  # snakemake -d: the preset's workdir is this folder
    assert pd.read_csv(results / "tables/device_failures.csv").empty
    eqc = pd.read_csv(results / "tables/eqc.csv")
    for model, entry in settings["models"].items():
        runtimes = RUNTIMES_OF[entry["file"][entry["file"].rindex("."):]]
        devices = sorted(name for name, device in settings["devices"].items()
                         if device["backend"] in runtimes)
        rows = eqc[eqc["model"] == model]
        assert sorted(set(rows["device"])) == devices, model
        for sample, group in rows.groupby("sample"):
            classes = dict(zip(group["device"], group["eqc"], strict=True))
            outputs = {}
            for device in devices:
                with Record(results / f"inference/{model}/{device}.h5") as record:
                    outputs[device] = record.tensor(sample, "output").values[0].tobytes()
            for first, second in itertools.combinations(devices, 2):
                assert (classes[first] == classes[second]) == \
                    (outputs[first] == outputs[second]), (model, sample, first, second)
