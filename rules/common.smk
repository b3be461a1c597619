# Python helpers for the rules, in sections: validation and constants (core, then the
# studies), target functions, input and params functions, resources.
import os
import re
import sys

# The library is installed into the environment; fall back to the checkout's src/ so a
# plain clone still parses (e.g. `snakemake --lint` before installing).
sys.path.insert(0, f"{workflow.basedir}/src")
# envs/*.yaml install the library from here (`--sdm conda`): an absolute path, since
# Snakemake copies the env files elsewhere.
os.environ.update(BITDRIFT_SOURCE=workflow.basedir)

from snakemake.exceptions import WorkflowError

from bitdrift import paths
from bitdrift.atlas import entries as atlas_entries
from bitdrift.backends.keras import export
from bitdrift.config import replay_settings, validate_config
from bitdrift.emulation.cpus import architecture
from bitdrift.errors import BitdriftError
from bitdrift.inputs import reference_set
from bitdrift.inputs.examples import EXAMPLES
from bitdrift.plan import Plan
from bitdrift.plan import scheduling_resources as plan_resources
from bitdrift.record.failures import end_of_run
from bitdrift.run import fork_server as forkserver

# A job run by a cluster's executor (SLURM's, any remote one: its process parses this file
# in remote mode) trains in fresh processes: a fork server started by one job would live in
# that job's allocation (bitdrift.run.fork_server, which also checks for SLURM itself)
if workflow.remote_exec:
    os.environ[forkserver.FRESH] = "1"

# ---- validation and constants: core -------------------------------------------------------
# The plan (bitdrift.plan): which device runs which model, the targets, the checks before
# any job and the resources; here only what needs Snakemake's own objects.
try:
    validate_config(config)
    PLAN = Plan(config)
    # A model file no rule makes and that is not there, a model no device runs, an
    # external device's missing record or one of other samples, samples beyond a
    # prepared test set: said now
    PLAN.check_model_files()
    PLAN.check_every_model_runs()
    PLAN.check_external_records()
    PLAN.check_external_samples()
    PLAN.check_samples()
    # The models the studies add, and the atlas's reference model, join config["models"]
    # after the config's own are taken (the core's tables stay the config's own models)
    PLAN.add_study_models()
    PLAN.add_atlas_model()
except BitdriftError as error:
    raise WorkflowError(str(error)) from None

# Devices left out of a model (their runtime cannot run its format), a model of one
# device: said once, by the run's own process (its jobs parse this file again)
if workflow.is_main_process:
    for note in PLAN.device_notes():
        print(f"bitdrift: {note}", file=sys.stderr)

# The plan's names the rules read
DEVICES = PLAN.devices
SCHEDULED_DEVICES = PLAN.scheduled_devices
EXPORT_FORMATS = PLAN.export_formats()
PROVENANCE_FILES = PLAN.provenance_files()
EXPECT_ARGUMENTS = PLAN.expect_arguments()
ATLAS_FOLDER = PLAN.atlas_folder()
QUANTIZED_MODELS = list(PLAN.quantizations())
QUANTIZED_SUFFIXES = sorted(set(paths.QUANTIZED_SUFFIXES.values()))
QUANTIZATION_ERROR_PAIRS = PLAN.quantization_error_pairs()
QUANTIZED_PARTING_MODELS = PLAN.quantized_parting_models()
# What each study's rule file (rules/<study>.smk) adds to `all`, and the summaries of a
# study the findings quote: {name: table path}, where the study has run.
STUDY_TARGETS = []
FINDINGS_TABLES = {}


def _choice(names):
    return "|".join(re.escape(name) for name in names) if names else "(?!)"


wildcard_constraints:
    dataset=_choice(config["datasets"]),
    model=_choice(PLAN.all_models),
    seed=r"\d+",


# ---- target functions ---------------------------------------------------------------------
def all_targets():
    """The core's targets (bitdrift.plan), then what each study registered in STUDY_TARGETS."""
    return (
        PLAN.training_targets()
        + PLAN.core_targets()
        + [target for targets in STUDY_TARGETS for target in targets()]
    )


# ---- the report ---------------------------------------------------------------------------
def write_report():
    """results/report.html at the end of a run of `all`, from this run's own DAG: what
    `snakemake --report` does after building the DAG anew (a second Snakemake started
    here would find this one's lock). A run of other targets leaves the report as it is
    and says so; the report is written under another name first, so a failure leaves the
    old one whole."""
    from pathlib import Path

    from snakemake.report import auto_report
    from snakemake.settings.types import GlobalReportSettings
    from snakemake_interface_report_plugins.registry import ReportPluginRegistry

    html = Path(paths.report_file())
    by_hand = f"snakemake --profile profiles/local --report {html}"
    if not any(job.rule.name == "all" for job in workflow.dag.targetjobs):
        print(
            f"bitdrift: {html} not rebuilt (not a run of `all`): {by_hand}",
            file=sys.stderr,
        )
        return
    plugin = ReportPluginRegistry().get_plugin("html")
    partial = html.with_name(f".{html.stem}.partial.html")
    try:
        workflow.async_run(
            auto_report(
                workflow.dag,
                plugin,
                plugin.settings_cls(path=partial),
                GlobalReportSettings(),
            )
        )
        partial.replace(html)
    except (WorkflowError, OSError) as error:  # the results stand; the report is old
        partial.unlink(missing_ok=True)
        print(f"bitdrift: {html} not rebuilt ({error}): {by_hand}", file=sys.stderr)
        return
    print(f"bitdrift: report written: {html}", file=sys.stderr)


# ---- input and params functions: core -----------------------------------------------------
def canonical(entry):
    """A config entry with sorted keys: params are compared by value, so reordering keys
    in config.yaml must not trigger reruns."""
    if isinstance(entry, dict):
        return {key: canonical(entry[key]) for key in sorted(entry)}
    if isinstance(entry, list):
        return [canonical(item) for item in entry]
    return entry


def record_files(wildcards=None):
    """Every record of the config's models, devices in config order (bitdrift.plan)."""
    return PLAN.record_files()


def scheduled_record_files():
    """Every record a device job may write: where the end of a run looks for failures."""
    return PLAN.scheduled_record_files()


def answer_files():
    """What the end of a run replaces when no device ran (bitdrift.record.failures.end_of_run):
    findings.md, which then says so, and the earlier run's report and findings.rst; no
    device ran when none of the records the findings are written from was made."""
    return {
        "findings": paths.findings_file("md"),
        "stale": [paths.findings_file("rst"), paths.report_file()],
        "analysed": record_files(),
    }


def findings_study_tables(wildcards):
    """The studies' summaries the findings quote (FINDINGS_TABLES, which the study rule
    files fill), where a study has run (`snakemake probes`, `snakemake batching`): a study
    run later changes the inputs, and the findings are written again by the next run."""
    return {key: path for key, path in FINDINGS_TABLES.items() if os.path.exists(path)}


def dataset_source_files(wildcards):
    """A dataset made from a workflow output (a probe file) depends on it."""
    spec = config["datasets"][wildcards.dataset]
    return [spec["path"]] if spec["source"] == "probes" else []


def dataset_spec(wildcards):
    return canonical(config["datasets"][wildcards.dataset])


def dataset_samples(wildcards):
    """The sample indices the devices read from this dataset (none if no model uses it)."""
    return PLAN.dataset_samples(wildcards.dataset)


def model_spec(wildcards):
    return canonical(config["models"][wildcards.model])


def device_spec(wildcards):
    return canonical(config["devices"][wildcards.device])


def model_dataset_file(wildcards):
    """The dataset's prepared file, or the model's own inputs file."""
    return paths.model_inputs_file(config, wildcards.model)


def model_samples(wildcards):
    """The samples a model is recorded on; the reference model, the reference set's."""
    if wildcards.model == paths.ATLAS_MODEL:
        return reference_set.samples()
    return config["samples"]


def atlas_record_files(wildcards=None):
    return PLAN.atlas_record_files()


def atlas_entry_files(wildcards=None):
    """The atlas's entries: a new entry (a machine added) makes the comparison anew."""
    from pathlib import Path

    return sorted(
        str(path) for path in Path(ATLAS_FOLDER).glob(f"*{atlas_entries.SUFFIX}")
    )


def findings_quantization_tables(wildcards):
    """The quantized models' tables (against their float models, where their devices part),
    where the config quantizes one."""
    return PLAN.findings_quantization_tables()


def findings_atlas_tables(wildcards):
    """The comparison with the atlas, which the findings quote, where the run makes it."""
    return PLAN.findings_atlas_tables()


def inference_model_file(wildcards):
    return paths.model_file(config, wildcards.model)


def float_model_files(wildcards):
    """A quantized model's float model and its inputs (static quantization calibrates on
    them)."""
    source = config["models"][wildcards.model]["quantize"]["model"]
    return {
        "model": paths.model_file(config, source),
        "inputs": paths.model_inputs_file(config, source),
    }


def quantization_settings(wildcards):
    """The quantizer and its settings of a quantized model, its float model's name left
    out."""
    settings = config["models"][wildcards.model]["quantize"]
    return canonical({key: value for key, value in settings.items() if key != "model"})


def model_quantization(wildcards):
    """How the workflow quantized the model, for its records' fingerprint (None: not)."""
    return canonical(PLAN.quantization(wildcards.model))


def inference_export_inputs(wildcards):
    """TensorFlow's reference and the exported model, for the devices that need them; the
    aarch64 userland, for an emulated Arm CPU."""
    device = config["devices"][wildcards.device]
    # a model of another format than Keras runs as it is: no Keras export, no reference
    inputs = (
        export.inference_inputs(wildcards.model, device["backend"])
        if PLAN.model_format(wildcards.model) == "keras"
        else {}
    )
    if architecture(device.get("emulate") or "") == "aarch64":
        inputs["aarch64"] = paths.aarch64_userland_file()
    return inputs


def device_threads(wildcards):
    return config["devices"][wildcards.device]["threads"] or 1


# ---- resources ----------------------------------------------------------------------------
def _profile_value(key):
    """The profile's plain default-resources value of `key` (bitdrift.plan): None
    without a profile, where it sets none, or sets one Snakemake evaluates per job."""
    defaults = workflow.resource_settings.default_resources  # None without a profile
    default = defaults.get(key) if defaults is not None else None
    if default is None or default.is_evaluable():
        return None
    return default.value


def scheduling_resources(entries, lookup):
    """Rule resources from config entries (bitdrift.plan.scheduling_resources): a key the
    job's own entry (`lookup(wildcards)`) leaves unset falls back to the profile's."""
    return plan_resources(entries, lookup, _profile_value)


device_resources = PLAN.device_resources
INFERENCE_RESOURCES = scheduling_resources(
    [device_resources(device) for device in SCHEDULED_DEVICES],
    lambda wildcards: device_resources(wildcards.device),
)
TRAINING_RESOURCES = scheduling_resources(
    PLAN.training_resources_entries(),
    lambda wildcards: config["models"][wildcards.model]["train"].get("resources", {}),
)
ANALYSIS_RESOURCES = config["analysis"].get("resources", {})
