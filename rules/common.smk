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

from bitdrift import export, paths, reference
from bitdrift.config import ConfigError, validate_config
from bitdrift.datasets import DatasetError, check_samples
from bitdrift.failures import end_of_run
from bitdrift.provenance import infer_command
from bitdrift.studies.ablation.cli import ABLATION_TABLES, ablation_inputs, study_config
from bitdrift.studies.ablation.config import variant_models
from bitdrift.studies.batching.cli import run_arguments
from bitdrift.studies.batching.config import batching_models
from bitdrift.studies.probes.config import evaluation_devices
from bitdrift.studies.variance.plans import gallery_plan, plan_runs, resolve_plans

# ---- validation and constants: core -------------------------------------------------------
try:
    validate_config(config)
except ConfigError as error:
    raise WorkflowError(str(error)) from None

MODELS = list(config["models"])
DEVICES = list(config["devices"])
SCHEDULED_DEVICES = [d for d in DEVICES if not config["devices"][d]["external"]]
TRAINED_MODELS = [m for m in MODELS if "architecture" in config["models"][m]]
EXPORT_FORMATS = list(reference.FORMATS)

# (model, model file, dataset file) per model: every record, external ones included, is
# checked against the files the workflow itself uses (`bitdrift eqc --expect ...`).
PROVENANCE = [
    (
        model,
        paths.model_file(config, model),
        paths.dataset_file(config["models"][model]["dataset"]),
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
                    paths.dataset_file(config["models"][model]["dataset"]),
                    path,
                )
                for device, model, path in missing
            )
        )


_check_external_records()


def _check_samples():
    """Sample indices against every prepared dataset the devices read, before any job."""
    for dataset in {config["models"][model]["dataset"] for model in MODELS}:
        if os.path.exists(paths.dataset_file(dataset)):
            try:
                check_samples(paths.dataset_file(dataset), config["samples"])
            except DatasetError as error:
                raise WorkflowError(str(error)) from None


_check_samples()

# ---- validation and constants: studies ----------------------------------------------------
# The ablation's model variants join config["models"] after the spine's MODELS are taken:
# the spine's train and inference rules make them, and the spine's tables stay the
# config's own models.
ABLATION = config.get("ablation")
ABLATION_MODELS = variant_models(config)
config["models"].update(ABLATION_MODELS)
# The batching study's own models join the same way (trained and exported by the spine's
# rules, never part of its tables).
BATCHING = config.get("batching") or {}
BATCHING_MODELS = batching_models(config)
config["models"].update(BATCHING_MODELS)
BATCHING_MODEL = BATCHING.get("model")
BATCHING_DEVICES = BATCHING.get("devices", [])
ALL_MODELS = MODELS + list(ABLATION_MODELS) + list(BATCHING_MODELS)
MAXPOOL = config.get("maxpool")
PLANS = resolve_plans(config)
GALLERY_PLAN, GALLERY_ARM, GALLERY_TOP_K = gallery_plan(config, PLANS)
PROBES = config.get("probes") or {}
PROBE_MODEL = PROBES.get("model")
PROBE_DEVICES = evaluation_devices(config) if PROBES else []
VARIANCE_DEVICES = sorted({d for plan in PLANS.values() for d in plan["devices"]})


def _choice(names):
    return "|".join(re.escape(name) for name in names) if names else "(?!)"


wildcard_constraints:
    dataset=_choice(config["datasets"]),
    setting=_choice((MAXPOOL or {}).get("volume", {}).get("settings", {})),
    beta=_choice((MAXPOOL or {}).get("training", {}).get("betas", {})),
    plan=_choice(PLANS),
    arm=_choice(sorted({arm for plan in PLANS.values() for arm in plan["arms"]})),
    run=r"\d+",
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
            paths.table_file("kernels"),
            paths.table_file("kernel_coverage"),
            paths.figure_file("kernels"),
            paths.table_file("flag_groups"),
            paths.table_file("device_classes"),
            paths.table_file("eqc_table"),
            paths.figure_file("eqc_table"),
            paths.figure_file("divergence"),
            paths.table_file("device_failures"),
            paths.findings_file("md"),
        ]
        + (
            # CPU generations: a figure where some devices run on emulated CPUs
            [paths.figure_file("cpu_generations")]
            if any(config["devices"][d].get("emulate") for d in SCHEDULED_DEVICES)
            else []
        )
    )


def maxpool_targets():
    if not MAXPOOL:
        return []
    targets = [
        paths.table_file("maxpool_zero_program"),
        paths.figure_file("backprop_variation"),
        paths.figure_file("maxpool_training"),
    ]
    if MAXPOOL["volume"]["settings"]:
        targets += [
            paths.figure_file("bifurcation_volume"),
            paths.table_file("bifurcation_volume"),
        ]
    # Intermediate tables as targets too (see core_targets: deleted ones are made again).
    return (
        targets
        + maxpool_variation_files()
        + maxpool_volume_files()
        + maxpool_training_files()
    )


def variance_targets():
    if not PLANS:
        return []
    figures = [
        "training_variance",
        "churn",
        "determinism_cost",
        "ensemble_disagreement",
    ]
    # Every table as a target too: a table deleted (an interrupted job's outputs are
    # removed) while the figure after it exists would otherwise never be made again.
    tables = [
        "training_variance",
        "training_runs",
        "training_subgroups",
        "seed_ratio",
        "determinism_cost",
    ]
    if GALLERY_PLAN:
        figures.append("divergent_examples")
        tables += [
            "example_divergence",
            "divergence_overlap",
            "divergence_groups",
            "divergent_subset_accuracy",
        ]
    return (
        variance_run_files()
        + [paths.figure_file(name) for name in figures]
        + [paths.table_file(name) for name in tables]
    )


def ablation_targets():
    if not ABLATION:
        return []
    # Records and trained models as targets too (see core_targets).
    return (
        ablation_files()
        + [paths.table_file(name) for name in ABLATION_TABLES.values()]
        + [paths.figure_file("ablation_layers"), paths.figure_file("precision_casting")]
    )


def probe_targets():
    """The probe study's tables and figure (`snakemake probes`; not part of `all`)."""
    if not PROBES:
        return []
    # Every intermediate file as a target too (see core_targets): a probe file lost to a
    # killed search would otherwise never be made again while the tables exist.
    inputs = probe_evaluation_inputs()
    return (
        inputs["records"]
        + [inputs["probes"], inputs["evaluation"]]
        + [paths.table_file(name) for name in paths.PROBE_TABLES.values()]
        + [paths.figure_file("probes")]
    )


def batching_targets():
    """The batch-invariance runs, tables and figure (`snakemake batching`; not in `all`)."""
    if not BATCHING:
        return []
    return (
        batching_run_files()
        + [paths.table_file(name) for name in paths.BATCHING_TABLES.values()]
        + [paths.figure_file("batching")]
    )


def all_targets():
    return (
        maxpool_targets()
        + variance_targets()
        + ablation_targets()
        + training_targets()
        + core_targets()
    )


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
    """Every record, devices in config order (this order numbers the classes)."""
    return [paths.record_file(model, device) for model in MODELS for device in DEVICES]


def scheduled_record_files():
    """Every record a device job of this workflow may write (the studies' models too):
    where the end of a run looks for failure records."""
    return [
        paths.record_file(model, device)
        for model in ALL_MODELS
        for device in SCHEDULED_DEVICES
    ]


def findings_study_tables(wildcards):
    """The studies' summaries the findings quote, where a study has run (`snakemake probes`,
    `snakemake batching`): a study run later changes the inputs, and the findings are
    written again by the next run."""
    names = {"probe_summary": paths.PROBE_TABLES["summary"]} if PROBES else {}
    if BATCHING:
        names["batching_summary"] = paths.BATCHING_TABLES["summary"]
    return {
        key: paths.table_file(name)
        for key, name in names.items()
        if os.path.exists(paths.table_file(name))
    }


def dataset_source_files(wildcards):
    """A dataset made from a workflow output (a probe file) depends on it."""
    spec = config["datasets"][wildcards.dataset]
    return [spec["path"]] if spec["source"] == "probes" else []


def dataset_spec(wildcards):
    return canonical(config["datasets"][wildcards.dataset])


def dataset_samples(wildcards):
    """The sample indices the devices read from this dataset (none if no model uses it)."""
    models = [m for m in MODELS if config["models"][m]["dataset"] == wildcards.dataset]
    return config["samples"] if models else []


def model_spec(wildcards):
    return canonical(config["models"][wildcards.model])


def device_spec(wildcards):
    return canonical(config["devices"][wildcards.device])


def model_dataset_file(wildcards):
    return paths.dataset_file(config["models"][wildcards.model]["dataset"])


def inference_model_file(wildcards):
    return paths.model_file(config, wildcards.model)


def inference_export_inputs(wildcards):
    """TensorFlow's reference and the exported model, for the devices that need them."""
    return export.inference_inputs(
        wildcards.model, config["devices"][wildcards.device]["backend"]
    )


def device_threads(wildcards):
    return config["devices"][wildcards.device]["threads"] or 1


# ---- input and params functions: probes study ---------------------------------------------
def probe_section(wildcards):
    return canonical(PROBES)


def probe_search_devices(wildcards):
    return {d: canonical(config["devices"][d]) for d in PROBES["search_devices"]}


def probe_model_file(wildcards):
    return paths.model_file(config, PROBE_MODEL)


def probe_dataset_file(wildcards):
    return paths.dataset_file(config["models"][PROBE_MODEL]["dataset"])


def probe_search_inputs(wildcards):
    """The exported models and TensorFlow's reference the search devices need, as
    KIND_DEVICE (the rule's script gives them back per device)."""
    return {
        f"{kind}_{device}": path
        for device in PROBES["search_devices"]
        for kind, path in export.inference_inputs(
            PROBE_MODEL, config["devices"][device]["backend"]
        ).items()
    }


def probe_search_threads(wildcards):
    return max(config["devices"][d]["threads"] or 1 for d in PROBES["search_devices"])


def probe_evaluation_inputs(wildcards=None):
    return {
        "records": [paths.probe_record_file(PROBE_MODEL, d) for d in PROBE_DEVICES],
        "probes": paths.probe_file(PROBE_MODEL),
        "evaluation": paths.probe_evaluation_file(PROBE_MODEL),
    }


# ---- input and params functions: ablation study -------------------------------------------
def batching_run_files(wildcards=None):
    return [
        paths.batching_run_file(BATCHING_MODEL, device) for device in BATCHING_DEVICES
    ]


def batching_model_file(wildcards=None):
    return paths.model_file(config, BATCHING_MODEL) if BATCHING else []


def batching_dataset_file(wildcards):
    return paths.dataset_file(config["models"][BATCHING_MODEL]["dataset"])


def batching_arguments(wildcards):
    """run_device's settings for the device (the files come from the rule's input)."""
    arguments = run_arguments(config, wildcards.device)
    for key in ("model_path", "dataset_path", "reference", "export", "out"):
        arguments.pop(key)
    return arguments


def ablation_files(wildcards=None):
    """Every record and test-logits file the ablation tables read."""
    inputs = ablation_inputs(config)
    return sorted(
        {file for files in inputs["records"].values() for file in files}
        | {file for files in inputs["cross_framework"].values() for file in files}
        | {file for files in inputs["casting"].values() for file in files}
        | set(inputs["logits"].values())
    )


def ablation_config(wildcards):
    return canonical(study_config(config))


# ---- input and params functions: MaxPool study --------------------------------------------
def maxpool_dataset_file(wildcards):
    return paths.dataset_file(MAXPOOL["dataset"])


def maxpool_spec(wildcards):
    return canonical(MAXPOOL)


def maxpool_variation_files(wildcards=None):
    return [
        paths.maxpool_variation_file(precision)
        for precision in MAXPOOL["variation"]["precisions"]
    ]


def maxpool_volume_files(wildcards=None):
    return [paths.maxpool_volume_file(name) for name in MAXPOOL["volume"]["settings"]]


def maxpool_training_files(wildcards=None):
    training = MAXPOOL["training"]
    return [
        paths.maxpool_training_file(beta, seed)
        for beta in training["betas"]
        for seed in training["seeds"]
    ]


# ---- input and params functions: training-variance study ----------------------------------
def variance_run_files(wildcards=None):
    """run.h5 of every training-variance run: one job each, so runs spread over a cluster."""
    return [paths.run_file("run", *run) for run in plan_runs(PLANS)]


def variance_run_plan(wildcards):
    """What one run depends on: its arm's switches, not the plan's other arms, devices or
    run count (adding runs or devices must not retrain the existing ones)."""
    plan = PLANS[wildcards.plan]
    return canonical(
        {
            "study": plan["study"],
            "model": plan["model"],
            "spec": plan["spec"],
            "seed": plan["seed"],
            "arms": {wildcards.arm: plan["arms"][wildcards.arm]},
        }
    )


def variance_dataset_file(wildcards):
    return paths.dataset_file(PLANS[wildcards.plan]["spec"]["dataset"])


def gallery_dataset_file(wildcards):
    """The dataset of the gallery's plan: its images are the test images shown."""
    return paths.dataset_file(PLANS[GALLERY_PLAN]["spec"]["dataset"])


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
        for model in TRAINED_MODELS + list(ABLATION_MODELS) + list(BATCHING_MODELS)
    ],
    lambda wildcards: config["models"][wildcards.model]["train"].get("resources", {}),
)
ANALYSIS_RESOURCES = config["analysis"].get("resources", {})
# The probe search runs its devices in one job: the node of its first device (the config
# check makes every search device ask for the same one).
PROBE_SEARCH_RESOURCES = device_resources(PROBES["search_devices"][0]) if PROBES else {}
MAXPOOL_RESOURCES = (MAXPOOL or {}).get("resources", {})
VARIANCE_RESOURCES = scheduling_resources(
    [
        {**device_resources(device), **plan["resources"]}
        for plan in PLANS.values()
        for device in plan["devices"]
    ],
    lambda wildcards: {
        **device_resources(wildcards.device),
        **PLANS[wildcards.plan]["resources"],
    },
)
