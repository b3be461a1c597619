# The probe study (`snakemake probes`; not part of `all`): its constants, targets, input
# functions and resources; its rules are in probes.smk (Snakemake's lint keeps functions
# apart from rules). To remove the study, delete both files and its package
# (src/bitdrift/studies/probes/), and its entries in the registry
# (bitdrift.studies.STUDIES), the Snakefile's include, the schema and config.yaml.
from bitdrift.studies.probes import paths as probe_paths
from bitdrift.studies.probes.config import evaluation_devices

PROBES = config.get("probes") or {}
PROBE_MODEL = PROBES.get("model")
PROBE_DEVICES = evaluation_devices(config) if PROBES else []


def probe_targets():
    """The probe study's tables and figure (`snakemake probes`; not part of `all`)."""
    if not PROBES:
        return []
    # Every intermediate file as a target too (see Plan.core_targets): a probe file lost to a
    # killed search would otherwise never be made again while the tables exist.
    inputs = probe_evaluation_inputs()
    return (
        inputs["records"]
        + [inputs["probes"], inputs["evaluation"]]
        + [paths.table_file(name) for name in probe_paths.PROBE_TABLES.values()]
        + [paths.figure_file("probes")]
    )


if PROBES:
    FINDINGS_TABLES["probe_summary"] = paths.table_file(
        probe_paths.PROBE_TABLES["summary"]
    )


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
        "records": [
            probe_paths.probe_record_file(PROBE_MODEL, d) for d in PROBE_DEVICES
        ],
        "probes": probe_paths.probe_file(PROBE_MODEL),
        "evaluation": probe_paths.probe_evaluation_file(PROBE_MODEL),
    }


# The probe search runs its devices in one job: the node of its first device (the config
# check makes every search device ask for the same one).
PROBE_SEARCH_RESOURCES = device_resources(PROBES["search_devices"][0]) if PROBES else {}
