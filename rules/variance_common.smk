# The training-variance study: its constants, targets, input functions and resources; its
# rules are in variance.smk (Snakemake's lint keeps functions apart from rules). To remove
# the study, delete both files and its package (src/bitdrift/studies/variance/), and its
# entries in the registry (bitdrift.studies.STUDIES), the Snakefile's include, the schema
# and config.yaml.
from bitdrift.studies.variance import paths as variance_paths
from bitdrift.studies.variance.plans import gallery_plan, plan_runs, resolve_plans

PLANS = resolve_plans(config)
GALLERY_PLAN, GALLERY_ARM, GALLERY_TOP_K = gallery_plan(config, PLANS)
VARIANCE_DEVICES = sorted({d for plan in PLANS.values() for d in plan["devices"]})


wildcard_constraints:
    plan=_choice(PLANS),
    arm=_choice(sorted({arm for plan in PLANS.values() for arm in plan["arms"]})),
    run=r"\d+",


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


STUDY_TARGETS.append(variance_targets)


def variance_run_files(wildcards=None):
    """run.h5 of every training-variance run: one job each, so runs spread over a cluster."""
    return [variance_paths.run_file("run", *run) for run in plan_runs(PLANS)]


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
