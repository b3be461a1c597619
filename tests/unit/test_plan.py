"""The workflow's plan (bitdrift.plan) without Snakemake: which device runs which model,
what a run of `all` makes, the checks before any job, and the jobs' resources. Every
expectation is written out here by hand."""

import copy
import json
import re
from pathlib import Path

import pytest

from bitdrift import paths
from bitdrift.config import validate_config
from bitdrift.errors import PlanError
from bitdrift.plan import Plan, scheduling_resources

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = ("tensorflow", "onnxruntime", "litert", "torch_export")
CONFIG = {
    "samples": [0, 2],
    "datasets": {"digits": {"source": "digits"}},
    "models": {"small": {"architecture": "cifar10_small", "dataset": "digits",
                         "train": {"seeds": [1, 2]}}},
    "devices": {**{backend: {"accelerator": "cpu", "backend": backend}
                   for backend in BACKENDS},
                "elsewhere": {"accelerator": "cpu", "backend": "tensorflow",
                              "external": True}},
}


def plan_of(config=CONFIG, files=()):
    """The plan of a validated copy of ``config``, with bring-your-own models of ``files``
    added after the validation (which needs the files to exist; the plan reads a file not
    made yet by its extension, as it reads an example model a rule makes)."""
    config = validate_config(copy.deepcopy(config))
    for path in files:
        config["models"][Path(path).stem] = {"file": path, "inputs": f"{path}.npy"}
    return Plan(config)


@pytest.mark.parametrize("model_file,devices", [
    (None, ["tensorflow", "onnxruntime", "litert", "elsewhere"]),  # Keras: not torch_export
    ("net.onnx", ["onnxruntime", "litert", "torch_export"]),
    ("net.pt2", ["onnxruntime", "litert", "torch_export"]),
    ("net.tflite", ["litert"]),
])
def test_a_device_runs_the_models_of_the_formats_its_runtime_reads(model_file, devices):
    plan = plan_of(files=[model_file] if model_file else [])
    model = Path(model_file).stem if model_file else "small"
    assert [device for device in plan.devices if plan.runs_on(model, device)] == devices
    assert plan.record_files() == [f"results/inference/small/{device}.h5" for device in
                                   ["tensorflow", "onnxruntime", "litert", "elsewhere"]] + (
        [f"results/inference/net/{device}.h5" for device in devices] if model_file else [])


def test_external_devices_are_never_scheduled_and_trained_models_are_the_architectures():
    plan = plan_of(files=["net.onnx"])
    assert plan.scheduled_devices == list(BACKENDS)
    assert plan.trained_models == ["small"]
    assert plan.training_targets() == ["results/models/small/seed_1/model.keras",
                                       "results/models/small/seed_2/model.keras"]


def test_the_expect_arguments_name_each_models_own_files():
    plan = plan_of(files=["net.onnx"])
    assert plan.expect_arguments() == [
        "--expect", "small", "results/models/small/seed_1/model.keras",
        "results/datasets/digits.h5",
        "--expect", "net", "net.onnx", "net.onnx.npy"]
    assert plan.provenance_files() == ["results/models/small/seed_1/model.keras",
                                       "results/datasets/digits.h5", "net.onnx",
                                       "net.onnx.npy"]


CORE_FILES = [
    "results/tables/eqc.csv", "results/tables/eqc_layers.csv", "results/tables/precision.csv",
    "results/figures/eqc.pdf", "results/figures/remaining_precision.pdf",
    "results/tables/explain.csv", "results/tables/divergence.csv",
    "results/tables/effective_precision.csv", "results/tables/argmax_agreement.csv",
    "results/tables/observer_check.csv", "results/tables/kernels.csv",
    "results/tables/kernel_coverage.csv", "results/tables/accumulation_orders.csv",
    "results/figures/kernels.pdf", "results/figures/accumulation_orders.pdf",
    "results/tables/flag_groups.csv", "results/tables/device_classes.csv",
    "results/tables/eqc_table.csv", "results/figures/eqc_table.pdf",
    "results/figures/divergence.pdf", "results/tables/device_failures.csv",
    "results/findings.md"]


def test_the_core_targets_are_the_scheduled_records_then_the_tables_and_figures():
    plan = plan_of()
    assert plan.core_targets() == [f"results/inference/small/{device}.h5"
                                   for device in ("tensorflow", "onnxruntime", "litert")] \
        + CORE_FILES


def test_the_atlas_and_an_emulated_cpu_add_their_targets():
    config = copy.deepcopy(CONFIG)
    config["atlas"] = {"devices": ["tensorflow"]}
    config["devices"]["tensorflow"]["emulate"] = "Haswell-v4"
    plan = plan_of(config)
    plan.add_atlas_model()
    assert plan.all_models == ["small", "atlas_reference"]
    assert plan.config["models"]["atlas_reference"]["file"].endswith(".keras")
    assert plan.core_targets()[3:] == CORE_FILES + [
        "results/inference/atlas_reference/tensorflow.h5", "results/tables/atlas.csv",
        "results/figures/atlas.pdf", "results/figures/cpu_generations.pdf"]
    assert plan.findings_atlas_tables() == {"atlas": "results/tables/atlas.csv",
                                            "atlas_refused": "results/tables/atlas_refused.csv"}
    # the atlas's model is scheduled (its failures looked for) but never in the core tables
    assert "results/inference/atlas_reference/tensorflow.h5" in plan.scheduled_record_files()
    assert all("atlas_reference" not in file for file in plan.record_files())


def test_the_core_results_are_what_the_analysis_rules_make():
    """The one list (paths.CORE_RESULTS) against the outputs rules/analysis.smk spells: the
    only outputs beyond it are the figure of CPU generations and the findings."""
    text = (ROOT / "rules/analysis.smk").read_text()
    spelled = set(re.findall(r'paths\.(table|figure)_file\("(\w+)"\)', text))
    assert spelled == {*paths.CORE_RESULTS, ("figure", "cpu_generations")}
    # common.smk takes its targets from the plan: no table spelled there again
    assert "table_file(" not in (ROOT / "rules/common.smk").read_text()


def test_the_findings_read_the_core_tables_the_atlas_and_the_quantized_models():
    from bitdrift.report.findings import TABLES

    assert set(TABLES) == {"eqc", "eqc_layers", "precision", "explain", "divergence",
                           "effective_precision", "argmax_agreement", "observer_check",
                           "kernels", "kernel_coverage", "accumulation_orders",
                           "flag_groups", "device_classes", "eqc_table", "device_failures",
                           "atlas", "atlas_refused", "quantization_error", "quantized_parting"}


def test_a_missing_external_record_stops_the_plan_with_the_command_that_makes_it():
    plan = plan_of(files=["net.tflite"])
    with pytest.raises(PlanError) as raised:
        plan.check_external_records(exists=lambda path: False)
    message = str(raised.value)
    assert message.startswith("missing records of external devices")
    assert "device 'elsewhere', model 'small': results/inference/small/elsewhere.h5" in message
    assert ("bitdrift infer --config config.yaml --model small --device elsewhere "
            "--model-file results/models/small/seed_1/model.keras") in message
    # a TFLite model is not the external TensorFlow device's: no record asked of it
    assert "net" not in message.replace("cifar10", "")
    plan.check_external_records(exists=lambda path: path.endswith("elsewhere.h5"))


def test_samples_are_checked_only_against_prepared_datasets():
    plan_of().check_samples(exists=lambda path: False)  # nothing prepared: nothing read


def test_a_gpu_device_asks_for_one_gpu_unless_it_names_its_own():
    config = copy.deepcopy(CONFIG)
    config["devices"] = {
        "gpu": {"accelerator": "gpu", "backend": "torch"},
        "gres": {"accelerator": "gpu", "backend": "torch",
                 "resources": {"gres": "gpu:a100:1", "mem_mb": 8000}},
        "cpu": {"accelerator": "cpu", "backend": "tensorflow",
                "resources": {"slurm_partition": "short"}}}
    plan = plan_of(config)
    assert plan.device_resources("gpu") == {"gpu": 1}
    assert plan.device_resources("gres") == {"gres": "gpu:a100:1", "mem_mb": 8000}
    assert plan.device_resources("cpu") == {"slurm_partition": "short"}
    # the config entry is never changed by it
    assert "resources" not in plan.config["devices"]["gpu"]


def test_a_resource_a_job_leaves_unset_falls_back_to_the_profile_then_to_nothing():
    own = {"a": {"slurm_partition": "gpu", "mem_mb": 16000}, "b": {"runtime": 30}}
    profile = {"mem_mb": 4000}
    resources = scheduling_resources(list(own.values()), lambda job: own[job], profile.get)
    assert sorted(resources) == ["mem_mb", "runtime", "slurm_partition"]
    assert {key: value("a") for key, value in resources.items()} == {
        "mem_mb": 16000, "runtime": 0, "slurm_partition": "gpu"}
    # the profile's mem_mb; no runtime anywhere: 0; a name unset anywhere: ""
    assert {key: value("b") for key, value in resources.items()} == {
        "mem_mb": 4000, "runtime": 30, "slurm_partition": ""}


def test_the_studies_models_join_the_plan_but_not_the_core_tables():
    config = yaml_config()
    plan = Plan(validate_config(config))
    models = list(plan.models)
    added = plan.add_study_models()
    assert added and not set(added) & set(models)
    assert plan.all_models == models + list(added)
    assert all(name in plan.config["models"] for name in added)
    assert plan.record_files() == Plan(validate_config(yaml_config())).record_files()


def yaml_config():
    import yaml

    return yaml.safe_load((ROOT / "config.yaml").read_text())


def test_the_files_bitdrift_ships_are_named_relative_to_a_workdir_that_holds_them(
        monkeypatch, tmp_path):
    """The reference model, its inputs and the atlas, run from a checkout (the working
    directory holds them): relative paths, which a checkout moved whole keeps; from
    elsewhere, absolute. They were absolute always, so a moved checkout reran their jobs
    (tests/workflow/test_moved_checkout.py runs it)."""
    from bitdrift.inputs import reference_set

    config = copy.deepcopy(CONFIG)
    config["atlas"] = {"devices": ["tensorflow"]}
    checkout = reference_set.FOLDER.parents[3]  # src/bitdrift/inputs/reference_set
    for workdir, relative in ((checkout, True), (tmp_path, False)):
        monkeypatch.chdir(workdir)
        plan = plan_of(copy.deepcopy(config))
        plan.add_atlas_model()
        named = [plan.config["models"]["atlas_reference"]["file"],
                 plan.config["models"]["atlas_reference"]["inputs"], plan.atlas_folder()]
        assert [Path(name).is_absolute() for name in named] == [not relative] * 3
        assert [Path(name).resolve() for name in named] == [
            reference_set.model_file().resolve(), reference_set.inputs_file().resolve(),
            (reference_set.FOLDER / "atlas").resolve()]
        if relative:
            assert named[0] == "src/bitdrift/inputs/reference_set/cifar10_small.keras"


def test_devices_left_out_of_a_model_are_named_and_a_lone_device_is_said():
    """Issue 63: a device whose runtime cannot run a model's format was dropped without a
    word. The plan names them by runtime, says what the model is, and says when one device
    is left; a config where every device runs every model has nothing to say."""
    plan = plan_of(files=["net.tflite", "net2.onnx"])
    assert plan.skipped_devices("small") == {"torch_export": ["torch_export"]}
    assert plan.skipped_devices("net") == {"tensorflow": ["tensorflow", "elsewhere"],
                                           "onnxruntime": ["onnxruntime"],
                                           "torch_export": ["torch_export"]}
    assert plan.model_devices("net") == ["litert"]
    assert plan.device_plan()["net"] == {
        "devices": ["litert"], "format": "a LiteRT .tflite flatbuffer",
        "skipped": {"tensorflow": ["tensorflow", "elsewhere"],
                    "onnxruntime": ["onnxruntime"], "torch_export": ["torch_export"]}}
    assert plan.device_notes() == [
        "skipped for model small: torch_export cannot run a Keras .keras archive or .h5 "
        "file (device torch_export)",
        "skipped for model net: tensorflow, onnxruntime, torch_export cannot run a LiteRT "
        ".tflite flatbuffer (devices tensorflow, elsewhere, onnxruntime, torch_export)",
        "only one device runs model net (litert): nothing to compare",
        "skipped for model net2: tensorflow cannot run an ONNX model (devices tensorflow, "
        "elsewhere)"]
    keras_only = copy.deepcopy(CONFIG)
    keras_only["devices"].pop("torch_export")
    assert plan_of(keras_only).device_plan() == {} and plan_of(keras_only).device_notes() == []
    plan = plan_of(yaml_config())  # the default config: nothing to say
    assert plan.device_plan() == {} and plan.device_notes() == []


def test_a_model_no_device_runs_stops_the_plan():
    config = copy.deepcopy(CONFIG)
    config["devices"] = {"eager": {"accelerator": "cpu", "backend": "torch_export"}}
    with pytest.raises(PlanError, match=re.escape(
            "config key models.small: no device runs it: torch_export cannot run a Keras "
            ".keras archive or .h5 file (runtimes that can: tensorflow, torch, jax, "
            "onnxruntime, openvino, litert)")):
        plan_of(config).check_every_model_runs()
    plan_of().check_every_model_runs()  # every model has a device


def test_a_model_file_that_is_not_there_and_no_rule_makes_stops_the_plan(tmp_path,
                                                                         monkeypatch):
    """Issue 63: a typo in a model's `file` was planned by its extension, and an earlier
    run's records of the model were kept as current. A file that is not there is an error
    naming the key unless a rule makes it: a trained model, an example model and its inputs."""
    from bitdrift.inputs.examples import write_example

    monkeypatch.chdir(tmp_path)
    write_example("onnx_cnn", "mine.onnx", "mine.onnx.npy")
    plan_of(files=["mine.onnx", "examples/onnx_cnn.onnx", "examples/torch_cnn.pt2",
                   "./examples/onnx_cnn.onnx"]).check_model_files()
    config = copy.deepcopy(CONFIG)
    config["models"]["again"] = {"file": "results/models/small/seed_1/model.keras",
                                 "dataset": "digits"}  # the training rule makes it
    plan_of(config).check_model_files()
    for path, key, missing in (("mnie.onnx", "file", "mnie.onnx"),
                               ("examples/onnx_cnn.pt2", "file", "examples/onnx_cnn.pt2"),
                               ("results/models/small/seed_9/model.keras", "file",
                                "results/models/small/seed_9/model.keras")):
        with pytest.raises(PlanError, match=re.escape(
                f"config key models.{Path(path).stem}.{key}: {missing} does not exist (in "
                f"{tmp_path}), and no rule of the workflow makes it")):
            plan_of(files=[path]).check_model_files()
    Path("mnie.onnx").write_bytes(Path("mine.onnx").read_bytes())  # its inputs are not
    with pytest.raises(PlanError, match=re.escape(
            "config key models.mnie.inputs: mnie.onnx.npy does not exist")):
        plan_of(files=["mnie.onnx"]).check_model_files()
    with pytest.raises(PlanError, match=re.escape(
            f"config key models.gone.file: {tmp_path}/gone.onnx does not exist, and no rule")):
        plan_of(files=[f"{tmp_path}/gone.onnx"]).check_model_files()


def test_an_external_record_of_other_samples_or_order_stops_the_plan(tmp_path, monkeypatch):
    """A record's input digest is of its samples in the order it ran them; the workflow
    runs its own devices again when config key samples changes, but an external device's
    record, measured elsewhere, would be refused by every analysis after the others ran.
    Said before any job: the samples it ran, and how to mend it."""
    from bitdrift.record.writer import write_record
    from tests.utils import BASE_ATTRS

    monkeypatch.chdir(tmp_path)
    record = Path(paths.record_file("small", "elsewhere"))
    record.parent.mkdir(parents=True)

    def measured(samples_order, samples=(0, 2)):
        attrs = {**BASE_ATTRS, "model": "small", "device": "elsewhere"}
        if samples_order is not None:
            attrs["samples_order"] = json.dumps(samples_order)
        write_record(record, attrs, {sample: {"output": [[1.0, 2.0]]} for sample in samples})

    config = copy.deepcopy(CONFIG)
    for samples, ran, accepted in (([0, 2], [0, 2], True), ([2, 0], [2, 0], True),
                                   ([2, 0], None, False),  # older: ran in sample order
                                   ([0, 2], [2, 0], False), ([0, 3], [0, 2], False)):
        measured(ran)
        config["samples"] = samples
        plan = plan_of(config)
        if accepted:
            plan.check_external_samples()
            continue
        with pytest.raises(PlanError) as raised:
            plan.check_external_samples()
        reordered = sorted(samples) == sorted(ran or [0, 2])
        assert str(raised.value) == (
            f"config key samples: {samples}, but external device 'elsewhere''s record "
            f"{record} ran {ran or [0, 2]} ("
            + ("the same samples in another order" if reordered else "other samples")
            + "), which every analysis would refuse: "
            + ("list the samples in its order, or " if reordered else "")
            + "measure it again with `bitdrift infer --config config.yaml --model small "
            "--device elsewhere --model-file results/models/small/seed_1/model.keras "
            f"--dataset-file results/datasets/digits.h5 --out {record}`")
    record.write_bytes(b"not HDF5")
    with pytest.raises(PlanError, match=re.escape(f"external device 'elsewhere': {record}")):
        plan_of(config).check_external_samples()
    record.unlink()
    plan_of(config).check_external_samples()  # not there: check_external_records says so
