# The MaxPool study: its constants, targets, input functions and resources; its rules are
# in maxpool.smk (Snakemake's lint keeps functions apart from rules). To remove the study,
# delete both files and its package (src/bitdrift/studies/maxpool/), and its entries in
# the registry (bitdrift.studies.STUDIES), the Snakefile's include, the schema and
# config.yaml.
from bitdrift.studies.maxpool import paths as maxpool_paths

MAXPOOL = config.get("maxpool")


wildcard_constraints:
    setting=_choice((MAXPOOL or {}).get("volume", {}).get("settings", {})),
    beta=_choice((MAXPOOL or {}).get("training", {}).get("betas", {})),


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
    # Intermediate tables as targets too (see bitdrift.plan.Plan.core_targets: deleted ones are made again).
    return (
        targets
        + maxpool_variation_files()
        + maxpool_volume_files()
        + maxpool_training_files()
    )


STUDY_TARGETS.append(maxpool_targets)


def maxpool_dataset_file(wildcards):
    return paths.dataset_file(MAXPOOL["dataset"])


def maxpool_spec(wildcards):
    return canonical(MAXPOOL)


def maxpool_variation_files(wildcards=None):
    return [
        maxpool_paths.maxpool_variation_file(precision)
        for precision in MAXPOOL["variation"]["precisions"]
    ]


def maxpool_volume_files(wildcards=None):
    return [
        maxpool_paths.maxpool_volume_file(name)
        for name in MAXPOOL["volume"]["settings"]
    ]


def maxpool_training_files(wildcards=None):
    training = MAXPOOL["training"]
    return [
        maxpool_paths.maxpool_training_file(beta, seed)
        for beta in training["betas"]
        for seed in training["seeds"]
    ]


MAXPOOL_RESOURCES = (MAXPOOL or {}).get("resources", {})
