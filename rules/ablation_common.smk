# The ablation study: its constants, targets, input functions and resources; its rules are
# in ablation.smk (Snakemake's lint keeps functions apart from rules). To remove the
# study, delete both files and its package (src/bitdrift/studies/ablation/), and its
# entries in the registry (bitdrift.studies.STUDIES), the Snakefile's include, the schema
# and config.yaml.
from bitdrift.studies.ablation.cli import ABLATION_TABLES, ablation_inputs, study_config

ABLATION = config.get("ablation")


def ablation_targets():
    if not ABLATION:
        return []
    # Records and trained models as targets too (see bitdrift.plan.Plan.core_targets).
    return (
        ablation_files()
        + [paths.table_file(name) for name in ABLATION_TABLES.values()]
        + [paths.figure_file("ablation_layers"), paths.figure_file("precision_casting")]
    )


STUDY_TARGETS.append(ablation_targets)


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
