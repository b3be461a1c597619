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

from bitdrift import formats, paths

from bitdrift.atlas import entries as atlas_entries

from bitdrift.backends.keras import export

from bitdrift.run import fork_server as forkserver

from bitdrift.backends.exported import expected as reference

from bitdrift.inputs import reference_set
from bitdrift.config import ConfigError, replay_settings, validate_config
from bitdrift.inputs.datasets import DatasetError, check_samples
from bitdrift.emulation.cpus import architecture
from bitdrift.errors import BitdriftError
from bitdrift.inputs.examples import EXAMPLES
from bitdrift.record.failures import end_of_run
from bitdrift.run.provenance import infer_command
from bitdrift.studies import study_models

# A job run by a cluster's executor (SLURM's, any remote one: its process parses this file
# in remote mode) trains in fresh processes: a fork server started by one job would live in
# that job's allocation (bitdrift.run.fork_server, which also checks for SLURM itself)
if workflow.remote_exec:
    os.environ[forkserver.FRESH] = "1"

# ---- validation and constants: core -------------------------------------------------------
try:
    validate_config(config)
except ConfigError as error:
    raise WorkflowError(str(error)) from None

MODELS = list(config["models"])
DEVICES = list(config["devices"])
SCHEDULED_DEVICES = [d for d in DEVICES if not config["devices"][d]["external"]]
TRAINED_MODELS = [m for m in MODELS if "architecture" in config["models"][m]]
# Each model's format (bitdrift.formats): a device runs the models its runtime can run
MODEL_FORMATS = {
    model: formats.planned_format(paths.model_file(config, model))
    for model in MODELS
    if "file" in config["models"][model]
}


def runs_on(model, device):
    """Whether the device's runtime runs the model's format (a Keras model: every one)."""
    return config["devices"][device]["backend"] in formats.runtimes(
        MODEL_FORMATS.get(model, "keras")
    )


EXPORT_FORMATS = list(reference.FORMATS)

# (model, model file, dataset file) per model: every record, external ones included, is
# checked against the files the workflow itself uses (`bitdrift eqc --expect ...`).
PROVENANCE = [
    (
        model,
        paths.model_file(config, model),
        paths.model_inputs_file(config, model),
    )
    for model in MODELS
]
PROVENANCE_FILES = [file for _, *files in PROVENANCE for file in files]
EXPECT_ARGUMENTS = [arg for triple in PROVENANCE for arg in ("--expect", *triple)]


def _check_external_records():
    """An external device's record comes from elsewhere; if it has not arrived, say so
    now (Snakemake would keep the existing analyses as current and report nothing)."""
    missing = [
        (device, model, paths.record_file(model, device))
        for model, model_file, dataset_file in PROVENANCE
        for device in DEVICES
        if config["devices"][device]["external"]
        and runs_on(model, device)
        and not os.path.exists(paths.record_file(model, device))
    ]
    if missing:
        raise WorkflowError(
            "missing records of external devices (measured elsewhere, never scheduled):\n"
            + "\n".join(
                f"  device {device!r}, model {model!r}: {path}; make it with\n    "
                + infer_command(
                    model,
                    device,
                    paths.model_file(config, model),
                    paths.model_inputs_file(config, model),
                    path,
                )
                for device, model, path in missing
            )
        )


_check_external_records()


def _check_samples():
    """Sample indices against every prepared dataset the devices read, before any job."""
    for dataset in {
        config["models"][model]["dataset"]
        for model in MODELS
        if "dataset" in config["models"][model]
    }:
        if os.path.exists(paths.dataset_file(dataset)):
            try:
                check_samples(paths.dataset_file(dataset), config["samples"])
            except DatasetError as error:
                raise WorkflowError(str(error)) from None


_check_samples()

# ---- the studies' models ------------------------------------------------------------------
# Models a study adds (the ablation's variants, the batching study's own) join
# config["models"] after the spine's MODELS are taken: the spine's train, export and
# inference rules make them, and the spine's tables stay the config's own models.
STUDY_MODELS = study_models(config)
config["models"].update(STUDY_MODELS)
ALL_MODELS = MODELS + list(STUDY_MODELS)
# The atlas: the reference model (bitdrift.inputs.reference_set: committed, never trained) runs on
# the devices of config key atlas.devices as one more model of the spine's inference rule,
# and its records place this machine among the machines measured (bitdrift.atlas.entries).
ATLAS_DEVICES = config["atlas"]["devices"]
if ATLAS_DEVICES:
    try:  # each file checked against the reference set's digests
        config["models"][paths.ATLAS_MODEL] = {
            "file": str(reference_set.model_file()),
            "inputs": str(reference_set.inputs_file()),
        }
    except BitdriftError as error:
        raise WorkflowError(f"config key atlas.devices: {error}") from None
    ALL_MODELS.append(paths.ATLAS_MODEL)
ATLAS_FOLDER = config["atlas"].get("folder") or str(atlas_entries.default_folder())
# What each study's rule file (rules/<study>.smk) adds to `all`, and the summaries of a
# study the findings quote: {name: table path}, where the study has run.
STUDY_TARGETS = []
FINDINGS_TABLES = {}


def _choice(names):
    return "|".join(re.escape(name) for name in names) if names else "(?!)"


wildcard_constraints:
    dataset=_choice(config["datasets"]),
    model=_choice(ALL_MODELS),
    seed=r"\d+",


# ---- target functions ---------------------------------------------------------------------
def training_targets():
    return [
        paths.trained_model_file(model, seed)
        for model in TRAINED_MODELS
        for seed in config["models"][model]["train"]["seeds"]
    ]


def core_targets():
    # The records are targets themselves: Snakemake treats a deleted intermediate file
    # whose downstream tables exist as up to date, so a record lost to an interrupted
    # --forcerun would otherwise never be made again (and the tables never redone).
    scheduled_records = [
        paths.record_file(model, device)
        for model in MODELS
        for device in SCHEDULED_DEVICES
        if runs_on(model, device)
    ]
    return (
        scheduled_records
        + [
            paths.table_file("eqc"),
            paths.table_file("eqc_layers"),
            paths.table_file("precision"),
            paths.figure_file("eqc"),
            paths.figure_file("remaining_precision"),
            paths.table_file("explain"),
            paths.table_file("divergence"),
            paths.table_file("effective_precision"),
            paths.table_file("argmax_agreement"),
            paths.table_file("observer_check"),
            paths.table_file("kernels"),
            paths.table_file("kernel_coverage"),
            paths.table_file("accumulation_orders"),
            paths.figure_file("kernels"),
            paths.figure_file("accumulation_orders"),
            paths.table_file("flag_groups"),
            paths.table_file("device_classes"),
            paths.table_file("eqc_table"),
            paths.figure_file("eqc_table"),
            paths.figure_file("divergence"),
            paths.table_file("device_failures"),
            paths.findings_file("md"),
        ]
        + (
            # this machine among the machines measured: the reference model's records
            [paths.atlas_record_file(device) for device in ATLAS_DEVICES]
            + [paths.table_file("atlas"), paths.figure_file("atlas")]
            if ATLAS_DEVICES
            else []
        )
        + (
            # CPU generations: a figure where some devices run on emulated CPUs
            [paths.figure_file("cpu_generations")]
            if any(config["devices"][d].get("emulate") for d in SCHEDULED_DEVICES)
            else []
        )
    )


def all_targets():
    """The core's targets, then what each study registered in STUDY_TARGETS."""
    return (
        training_targets()
        + core_targets()
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
    """Every record, devices in config order (this order numbers the classes); a model
    has records of the devices whose runtime runs its format."""
    return [
        paths.record_file(model, device)
        for model in MODELS
        for device in DEVICES
        if runs_on(model, device)
    ]


def scheduled_record_files():
    """Every record a device job of this workflow may write (the studies' models too):
    where the end of a run looks for failure records."""
    return [
        paths.record_file(model, device)
        for model in ALL_MODELS
        for device in SCHEDULED_DEVICES
        if runs_on(model, device)
    ]


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
    models = [
        m for m in MODELS if config["models"][m].get("dataset") == wildcards.dataset
    ]
    return config["samples"] if models else []


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
    return [paths.atlas_record_file(device) for device in ATLAS_DEVICES]


def atlas_entry_files(wildcards=None):
    """The atlas's entries: a new entry (a machine added) makes the comparison anew."""
    from pathlib import Path

    return sorted(
        str(path) for path in Path(ATLAS_FOLDER).glob(f"*{atlas_entries.SUFFIX}")
    )


def findings_atlas_tables(wildcards):
    """The comparison with the atlas, which the findings quote, where the run makes it."""
    if not ATLAS_DEVICES:
        return {}
    return {
        "atlas": paths.table_file("atlas"),
        "atlas_refused": paths.table_file("atlas_refused"),
    }


def inference_model_file(wildcards):
    return paths.model_file(config, wildcards.model)


def inference_export_inputs(wildcards):
    """TensorFlow's reference and the exported model, for the devices that need them; the
    aarch64 userland, for an emulated Arm CPU."""
    device = config["devices"][wildcards.device]
    # a model of another format than Keras runs as it is: no Keras export, no reference
    inputs = (
        export.inference_inputs(wildcards.model, device["backend"])
        if MODEL_FORMATS.get(wildcards.model, "keras") == "keras"
        else {}
    )
    if architecture(device.get("emulate") or "") == "aarch64":
        inputs["aarch64"] = paths.aarch64_userland_file()
    return inputs


def aarch64_runtimes():
    """The runtimes of the emulated Arm devices: what the aarch64 userland must hold."""
    return sorted(
        {
            device["backend"]
            for device in config["devices"].values()
            if architecture(device.get("emulate") or "") == "aarch64"
        }
    )


def device_threads(wildcards):
    return config["devices"][wildcards.device]["threads"] or 1


# ---- resources ----------------------------------------------------------------------------
# Resources whose values are names; every other resource is a number.
TEXT_RESOURCES = {
    "slurm_partition",
    "slurm_account",
    "constraint",
    "gres",
    "gpu_model",
    "qos",
}


def _profile_default(key):
    """The profile's plain default-resources value of `key`. Without a profile, or where
    it sets none: an empty name or 0, which no local run constrains on (Snakemake refuses
    a resource function that returns None)."""
    defaults = workflow.resource_settings.default_resources  # None without a profile
    default = defaults.get(key) if defaults is not None else None
    if default is None or default.is_evaluable():
        return "" if key in TEXT_RESOURCES else 0
    return default.value


def scheduling_resources(entries, lookup):
    """Rule resources taken from config entries: `entries` are every entry the rule can
    run (to declare only the keys some entry sets, so the profile's defaults stay in
    force otherwise), `lookup(wildcards)` the job's own resources. A key the job's entry
    leaves unset falls back to the profile's default-resources."""
    keys = sorted({key for entry in entries for key in entry})

    def resource(key):
        def value(wildcards):
            own = lookup(wildcards)
            return own[key] if key in own else _profile_default(key)

        return value

    return {key: resource(key) for key in keys}


def device_resources(device):
    """A device's scheduling: its `resources`, plus one GPU for a GPU device that asks
    for none (so `gpu` devices land on GPU nodes without extra config)."""
    entry = config["devices"][device]
    own = dict(entry.get("resources", {}))
    if entry["accelerator"] == "gpu" and "gpu" not in own and "gres" not in own:
        own["gpu"] = 1
    return own


INFERENCE_RESOURCES = scheduling_resources(
    [device_resources(device) for device in SCHEDULED_DEVICES],
    lambda wildcards: device_resources(wildcards.device),
)
TRAINING_RESOURCES = scheduling_resources(
    [
        config["models"][model]["train"].get("resources", {})
        for model in TRAINED_MODELS + list(STUDY_MODELS)
    ],
    lambda wildcards: config["models"][wildcards.model]["train"].get("resources", {}),
)
ANALYSIS_RESOURCES = config["analysis"].get("resources", {})
