# The batching study (`snakemake batching`; not part of `all`): its constants, targets,
# input functions and resources; its rules are in batching.smk (Snakemake's lint keeps
# functions apart from rules). To remove the study, delete both files and its package
# (src/bitdrift/studies/batching/), and its entries in the registry
# (bitdrift.studies.STUDIES), the Snakefile's include, the schema and config.yaml.
from bitdrift.studies.batching import paths as batching_paths
from bitdrift.studies.batching.cli import run_arguments

BATCHING = config.get("batching") or {}
BATCHING_MODEL = BATCHING.get("model")
BATCHING_DEVICES = BATCHING.get("devices", [])


def batching_targets():
    """The batch-invariance runs, tables and figure (`snakemake batching`; not in `all`)."""
    if not BATCHING:
        return []
    return (
        batching_run_files()
        + [paths.table_file(name) for name in batching_paths.BATCHING_TABLES.values()]
        + [paths.figure_file("batching")]
    )


if BATCHING:
    FINDINGS_TABLES["batching_summary"] = paths.table_file(
        batching_paths.BATCHING_TABLES["summary"]
    )


def batching_run_files(wildcards=None):
    return [
        batching_paths.batching_run_file(BATCHING_MODEL, device)
        for device in BATCHING_DEVICES
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
