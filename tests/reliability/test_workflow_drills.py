"""Drills on the workflow a user reaches after the first run: reordered devices, records
that have not arrived or were deleted, presets, the conda environment."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bitdrift.config import load_config
from bitdrift.studies.ablation.config import ablation_devices, variant_models
from tests.utils import ROOT, snakemake

pytestmark = pytest.mark.workflow


def jobs(dry_run: str) -> dict:
    return {line.split()[0]: int(line.split()[1]) for line in dry_run.splitlines()
            if len(line.split()) == 2 and line.split()[1].isdigit()}


def test_reordering_devices_renumbers_the_classes(own_run):
    workdir, config = own_run
    settings = yaml.safe_load(config.read_text())
    devices = list(settings["devices"])
    settings["devices"] = dict(reversed(list(settings["devices"].items())))
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    planned = jobs(snakemake(workdir, "all", "-n", configfile=config))
    assert planned.get("cluster_equivalence_classes") == 1 and "run_inference" not in planned
    snakemake(workdir, "all", configfile=config)
    eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
    first = eqc.groupby("sample")["device"].first()
    assert (first == devices[-1]).all()  # the new first device holds class 1
    assert (eqc[eqc["device"] == devices[-1]]["eqc"] == 1).all()


def test_a_missing_external_record_is_an_error_naming_device_path_and_command(own_run):
    workdir, config = own_run
    settings = yaml.safe_load(config.read_text())
    settings["devices"]["laptop"] = {"accelerator": "cpu", "backend": "torch",
                                     "external": True}
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    result = snakemake(workdir, "all", configfile=config, check=False)
    assert result.returncode != 0
    message = result.stdout + result.stderr
    assert "device 'laptop', model 'small': results/inference/small/laptop.h5" in message
    assert ("bitdrift infer --config config.yaml --model small --device laptop --model-file "
            "results/models/small/seed_3/model.keras --dataset-file "
            "results/datasets/digits.h5 --out results/inference/small/laptop.h5") in message


def test_a_deleted_record_is_made_again(own_run):
    workdir, config = own_run
    (workdir / "results/inference/small/tf_sse41.h5").unlink()
    planned = jobs(snakemake(workdir, "all", "-n", configfile=config))
    assert planned.get("run_inference") == 1 and planned.get("cluster_equivalence_classes") == 1


def test_every_lost_table_is_made_again_bit_for_bit(own_run):
    """A killed job's outputs are removed; if a table is needed by `all` only through a
    figure that still exists, Snakemake says "Nothing to be done" and the table stays lost
    (the example-divergence, training-statistics and bifurcation-volume tables did). Every
    table of the run is deleted here, and `all` must make each again, byte for byte."""
    workdir, config = own_run
    tables = sorted((workdir / "results/tables").iterdir())
    before = {path.name: path.read_bytes() for path in tables}
    assert {"example_divergence.csv", "training_variance.csv", "bifurcation_volume.csv",
            "effective_precision.csv", "eqc_table.csv"} <= set(before)
    for path in tables:
        path.unlink()
    snakemake(workdir, "all", configfile=config)
    after = {path.name: path.read_bytes() for path in (workdir / "results/tables").iterdir()}
    assert sorted(after) == sorted(before)
    changed = [name for name in before if after[name] != before[name]]
    assert not changed, changed


PRESETS = sorted((ROOT / "config/presets").glob("*.yaml"))
# The runtimes that run a model file of each kind, as docs/your-model.md lists them: a
# model runs on the devices of those runtimes only (a Keras model on every device).
RUNTIMES_OF = {".onnx": {"onnxruntime", "openvino", "torch_export", "litert"},
               ".pt2": {"torch_export", "torch_inductor", "executorch", "onnxruntime",
                        "openvino", "litert"}}


# A model a quantizer made runs on that quantizer's runtimes, as docs/your-model.md lists
# them (converting it has no quantized ops)
QUANTIZED_RUNTIMES = {"onnxruntime": {"onnxruntime", "openvino"},
                      "openvino": {"onnxruntime", "openvino"}, "litert": {"litert"},
                      "torch": {"torch_export", "torch_inductor", "executorch"}}


def runs_on(model: dict, device: dict, name: str = "", models: dict | None = None) -> bool:
    """Whether the device runs the model: a model's `devices` list (a quantized model
    without one: its float model's) names it, and its runtime runs the model."""
    chosen = model.get("devices")
    if "quantize" in model:
        runtimes = QUANTIZED_RUNTIMES[model["quantize"].get("tool", "onnxruntime")]
        chosen = chosen or (models or {}).get(model["quantize"]["model"], {}).get("devices")
    else:
        runtimes = RUNTIMES_OF.get(Path(model.get("file", "")).suffix)
    return not device["external"] and (runtimes is None or device["backend"] in runtimes) \
        and (chosen is None or name in chosen)


@pytest.mark.parametrize("profile", [None, "local", "slurm-gpu"])
@pytest.mark.parametrize("preset", PRESETS, ids=lambda path: path.stem)
def test_a_preset_stands_alone_under_every_profile(preset, profile, tmp_path):
    settings = load_config(preset)  # device matrices expanded, defaults filled
    arguments = ["all", "-n"] + (["--profile", str(ROOT / "profiles" / profile)]
                                 if profile else [])
    planned = jobs(snakemake(tmp_path, *arguments, configfile=preset))
    # Its own devices and models only, none of config.yaml's; the ablation's variants run
    # on the ablation's devices only.
    variants = variant_models(settings)
    # the matrix and the cross-framework devices, once each
    variant_devices = len(ablation_devices(settings)) if settings.get("ablation") else 0
    assert planned.get("run_inference", 0) == sum(
        runs_on(model, device, name, settings["models"])
        for model in settings["models"].values()
        for name, device in settings["devices"].items()) + len(variants) * variant_devices
    assert planned.get("train_model", 0) == sum(
        len(model["train"]["seeds"]) for model in [*settings["models"].values(),
                                                   *variants.values()]
        if "architecture" in model)
    if "training_variance" not in settings:
        assert "train_variance_run" not in planned
    if "maxpool" not in settings:
        assert "compute_backprop_variation" not in planned


def test_the_conda_environment_installs_this_checkout_from_anywhere(tmp_path):
    """Snakemake copies envs/*.yaml to .snakemake/conda/; the library's line must not be
    relative to the file. pip expands ${BITDRIFT_SOURCE}, which the Snakefile sets."""
    env = yaml.safe_load((ROOT / "envs/bitdrift.yaml").read_text())
    pip = next(entry["pip"] for entry in env["dependencies"] if isinstance(entry, dict))
    own = [line for line in pip if "bitdrift" in line.lower() or "BITDRIFT" in line]
    assert own == ["-e ${BITDRIFT_SOURCE}"]
    requirements = tmp_path / "elsewhere" / "condaenv.requirements.txt"
    requirements.parent.mkdir()
    requirements.write_text("\n".join(own) + "\n")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index",
         "--no-build-isolation", "-r", str(requirements)], cwd=tmp_path,
        env={**os.environ, "BITDRIFT_SOURCE": str(ROOT)}, capture_output=True, text=True,
        timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Would install bitdrift" in result.stdout
    common = (ROOT / "rules/common.smk").read_text()
    assert "os.environ.update(BITDRIFT_SOURCE=workflow.basedir)" in common


def test_samples_beyond_a_prepared_test_set_stop_before_any_job(own_run):
    workdir, config = own_run
    settings = yaml.safe_load(config.read_text())
    settings["datasets"]["digits"].pop("limit_test")  # only the prepared file knows its size
    settings["samples"] = [0, 16]  # the prepared file holds 16 test images: 0..15
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    result = snakemake(workdir, "all", "-n", configfile=config, check=False)
    assert result.returncode != 0
    assert "samples [16] beyond the test set (indices 0..15)" in result.stdout + result.stderr


def test_a_bitdrift_error_in_a_job_is_one_line_in_its_log_and_on_the_terminal(tmp_path):
    """Workflow scripts call the library directly: a BitdriftError there used to end in a
    traceback, and Snakemake showed none of it. Now its one line is in the job's log and
    in Snakemake's own output, with the error's exit status. A device's job is different:
    its failure is recorded, named at the end, and the run exits non-zero."""
    # a .keras archive as the config check sees one (config.json, model.weights.h5) that
    # Keras cannot load: the error comes from the job
    import zipfile

    with zipfile.ZipFile(tmp_path / "broken.keras", "w") as archive:
        archive.writestr("config.json", "{}")
        archive.writestr("model.weights.h5", "not HDF5")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "samples": [0], "datasets": {"digits": {"source": "digits", "limit_train": 32,
                                                "limit_test": 8}},
        "models": {"m": {"file": "broken.keras", "dataset": "digits"}},
        "devices": {"cpu": {"accelerator": "cpu", "backend": "tensorflow", "threads": 1,
                            "repeats": 1}}}))
    # The export reference (an analysis-side job) reads the model first: one line, status 4
    result = snakemake(tmp_path, "results/exports/m/reference.npz", configfile=config,
                       check=False)
    assert result.returncode != 0
    line = "bitdrift: error: broken.keras: cannot load the model"
    assert line in result.stdout + result.stderr
    log = (tmp_path / "logs/export_reference/m.log").read_text()
    assert log.rstrip().splitlines()[-1].startswith(line)
    assert "returned non-zero exit status 4" in result.stdout + result.stderr  # its status
    assert not (tmp_path / "results/exports/m/reference.npz").exists()
    # The device's job: its one line names the device, on the terminal and in its log
    result = snakemake(tmp_path, "results/inference/m/cpu.h5", configfile=config,
                       check=False)
    said = result.stdout + result.stderr
    assert result.returncode != 0
    failed = "bitdrift: device 'cpu' (model 'm') failed: device 'cpu', model 'm': repeat 1 " \
        "failed (exit 1)"
    assert failed in said and "cpu (model m): device 'cpu', model 'm': repeat 1 failed" in said
    log = (tmp_path / "logs/run_inference/m/cpu.log").read_text()
    assert log.rstrip().splitlines()[-1].startswith(failed)
    assert not (tmp_path / "results/inference/m/cpu.h5").exists()  # retried next time


def test_samples_beyond_a_dataset_not_yet_prepared_stop_before_training(tmp_path):
    """The test set's size is known once the dataset is prepared: the check runs there,
    so a wrong sample index costs no training run."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        # no limit_test: only the prepared file knows the test set's size
        "samples": [0, 5000], "datasets": {"digits": {"source": "digits", "limit_train": 32}},
        "models": {"m": {"architecture": "cifar10_small", "dataset": "digits",
                         "train": {"epochs": 1, "seeds": [0]}}},
        "devices": {"cpu": {"accelerator": "cpu", "backend": "torch", "threads": 1}}}))
    result = snakemake(tmp_path, "all", configfile=config, check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert "samples [5000] beyond the test set (indices 0.." in output
    assert "config key samples" in output and "prepare_dataset" in output
    assert not (tmp_path / "logs/train_model").exists()


def test_plain_snakemake_runs_without_a_profile_or_cores(tmp_path):
    """`snakemake TARGET` with no --cores and no --profile: profiles/default supplies them
    (Snakemake reads a workflow's profiles/default on every run)."""
    (tmp_path / "config.yaml").write_bytes((ROOT / "config.yaml").read_bytes())
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d",
         str(tmp_path), "results/datasets/digits.h5"], capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "workflow specific profile" in result.stderr
    assert (tmp_path / "results/datasets/digits.h5").is_file()


def test_a_preset_writes_into_its_own_folder(tmp_path):
    """A preset's results go to runs/PRESET/ (its `workdir`), never into the results/ of
    the default run beside it."""
    (tmp_path / "results").mkdir()  # the default run's
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "--cores", "1",
         "results/tables/maxpool_zero_program.csv", "--configfile",
         str(ROOT / "config/presets/maxpool_paper.yaml")], cwd=tmp_path,
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "runs/maxpool_paper/results/tables/maxpool_zero_program.csv").is_file()
    assert not any((tmp_path / "results").iterdir())
    for preset in PRESETS:
        assert yaml.safe_load(preset.read_text())["workdir"] == f"runs/{preset.stem}"


def test_one_failing_device_costs_nothing_else(own_run):
    """A device whose job fails (an ONNX Runtime device asking for a GPU this machine does
    not have: refused, never a CPU fallback) beside the session run's devices: every other
    device's tables, findings and report are complete, the failure is named with its one
    line on the terminal, in device_failures.csv, findings.md and the report, the run
    exits non-zero, and the next run tries the device again."""
    workdir, config = own_run
    settings = yaml.safe_load(config.read_text())
    others = list(settings["devices"])
    settings["devices"]["ort_gpu"] = {"accelerator": "gpu", "backend": "onnxruntime",
                                      "threads": 1}
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    result = snakemake(workdir, "all", configfile=config, check=False)
    said = result.stdout + result.stderr
    assert result.returncode != 0
    assert "bitdrift: 1 device(s) failed" in said
    assert "ort_gpu (model small): device 'ort_gpu' asks for a GPU" in said
    eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
    assert set(eqc["device"]) == set(others)  # every other device, and only them
    precision = pd.read_csv(workdir / "results/tables/precision.csv")
    assert (precision["n_devices"] > 0).all()
    failures = pd.read_csv(workdir / "results/tables/device_failures.csv")
    assert failures["device"].tolist() == ["ort_gpu"]
    assert "refusing to fall back to the CPU" in failures["reason"].iloc[0]
    findings = (workdir / "results/findings.md").read_text()
    assert "- ort_gpu (small): device 'ort_gpu' asks for a GPU" in findings
    assert not (workdir / "results/inference/small/ort_gpu.h5").exists()  # cleared: retried
    # the run wrote the report itself, the failed device named in it
    assert "bitdrift: report written: results/report.html" in said
    assert "ort_gpu" in (workdir / "results/report.html").read_text(errors="replace")
    planned = jobs(snakemake(workdir, "all", "-n", configfile=config))
    assert planned.get("run_inference") == 1


def test_a_run_where_every_device_fails_leaves_no_earlier_answer(own_run):
    """The session run's answer is in place (findings.md, report.html); then a config whose
    every device fails (GPU devices on a machine without one). The run names both failures
    and exits non-zero; findings.md says that no device ran, with each reason, instead of
    the earlier run's answer; the earlier report is gone; and `--report` under the quiet
    logger fails with Snakemake's reason on the terminal, not in silence."""
    workdir, config = own_run
    findings, report = workdir / "results/findings.md", workdir / "results/report.html"
    assert "Devices that ran" in findings.read_text() and report.exists()
    settings = yaml.safe_load(config.read_text())
    settings["devices"] = {f"ort_gpu_{threads}": {"accelerator": "gpu",
                                                  "backend": "onnxruntime", "threads": threads}
                           for threads in (1, 2)}
    # their plans (the studies', the atlas comparison's) name the CPU devices
    for key in ("maxpool", "training_variance", "atlas"):
        settings.pop(key)
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    result = snakemake(workdir, "all", configfile=config, check=False)
    said = result.stdout + result.stderr
    assert result.returncode != 0
    assert "bitdrift: 2 device(s) failed" in said and "no device ran" in said
    written = findings.read_text()
    assert "Devices that ran" not in written
    assert "No device ran: 2 of the 2 scheduled devices failed" in written
    for device in settings["devices"]:
        assert f"- {device} (small): device '{device}' asks for a GPU" in written
    assert not report.exists() and not (workdir / "results/findings.rst").exists()
    built = snakemake(workdir, "--report", str(report), "--logger", "bitdrift",
                      configfile=config, check=False)
    assert built.returncode != 0 and not report.exists()
    assert "marked for report but does not exist" in built.stdout + built.stderr


def test_shuffled_samples_a_skipped_device_and_a_model_file_typo_are_said(tmp_path):
    """Issue 63's silent answers, on a user's ONNX model. Samples listed out of order
    ([3, 0, 1]) run and every analysis accepts the records (their input digest was of the
    config's order, the check's of the sorted samples: every record refused after the
    inference). A TensorFlow device, which cannot run an ONNX model, is named on the
    terminal and in findings.md; left with one device, the model says so. Then a typo in
    the model's file name: one line naming the key, no job, and findings.md stays the
    earlier run's (it was rewritten from the old records)."""
    from bitdrift.inputs.examples import write_example

    write_example("onnx_cnn", tmp_path / "mine.onnx", tmp_path / "mine.onnx.npy", samples=8)
    one_thread = {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1, "repeats": 1}
    settings = {
        "samples": [3, 0, 1], "analysis": {"precision": "float32"},
        "models": {"mine": {"file": "mine.onnx", "inputs": "mine.onnx.npy"}},
        "devices": {"ort_all": one_thread,
                    "ort_basic": {**one_thread, "graph_optimization_level": "basic"},
                    "tf_1thread": {"accelerator": "cpu", "backend": "tensorflow",
                                   "threads": 1}}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    said = snakemake(tmp_path, "all", "--logger", "bitdrift", configfile=config)
    skipped = "skipped for model mine: tensorflow cannot run an ONNX model (device tf_1thread)"
    assert f"bitdrift: {skipped}\n" in said
    findings = tmp_path / "results/findings.md"
    written = findings.read_bytes()
    assert f"- S{skipped[1:]}.\n" in written.decode()
    assert "Devices that ran: 2; failed: 0." in written.decode()
    eqc = pd.read_csv(tmp_path / "results/tables/eqc.csv")
    assert sorted(set(eqc["device"])) == ["ort_all", "ort_basic"]
    assert sorted(set(eqc["sample"])) == [0, 1, 3]
    # one device left: said at the start (a dry run says it too)
    settings["devices"].pop("ort_basic")
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    said = snakemake(tmp_path, "all", "-n", configfile=config)
    assert "bitdrift: only one device runs model mine (ort_all): nothing to compare" in said
    # the typo: refused before any job, whatever records are there
    settings["models"]["mine"]["file"] = "mnie.onnx"
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    result = snakemake(tmp_path, "all", "--logger", "bitdrift", configfile=config,
                       check=False)
    said = result.stdout + result.stderr
    assert result.returncode != 0
    assert (f"config key models.mine.file: mnie.onnx does not exist (in {tmp_path}), and no "
            "rule of the workflow makes it") in said
    assert "] done " not in said and "MissingInputException" not in said
    assert findings.read_bytes() == written
