"""The paper-scale training-variance preset on the SLURM profile (dry run): Morin &
Willetts' 50 + 50 runs of Keras ResNet-50 and of the Keras example's ResNet v2 (depth 29),
200 epochs each, every run one job on its device's partition with its plan's resources."""

import re

import pytest
import yaml

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


def test_your_model_preset_runs_an_onnx_model_with_no_keras_rule(tmp_path):
    """config/presets/your_model.yaml (dry run; tests/workflow/test_onnx_model.py and
    test_pt2_model.py run such models through): the example ONNX model, the example .pt2
    program and their inputs are built by the rule example_model, then each device whose
    runtime runs the model's format runs it; nothing is trained or exported."""
    preset = ROOT / "config/presets/your_model.yaml"
    settings = yaml.safe_load(preset.read_text())
    output = snakemake(tmp_path, "all", "-n", configfile=preset)
    rules = [job["rule"] for job in dry_run_jobs(output)]
    assert rules.count("example_model") == 2
    backends = [device["backend"] for device in settings["devices"].values()]
    # written out: the formats' lists are checked
    onnx_runtimes = ("onnxruntime", "openvino", "torch_export", "litert")
    pt2_runtimes = onnx_runtimes + ("torch_inductor", "executorch")
    assert rules.count("run_inference") == sum(backend in onnx_runtimes for backend in backends) \
        + sum(backend in pt2_runtimes for backend in backends)
    for rule in ("train_model", "export_model", "export_reference", "prepare_dataset"):
        assert rule not in rules
