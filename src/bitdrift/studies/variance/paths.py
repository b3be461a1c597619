"""Where the training-variance study puts its files (on top of bitdrift.paths)."""

from __future__ import annotations

from bitdrift.paths import RESULTS


def run_directory(plan="{plan}", arm="{arm}", device="{device}", run="{run}") -> str:
    return f"{RESULTS}/training/{plan}/{arm}/{device}/run_{run}"


# The files of one training run, inside its run_directory.
RUN_FILES = {"model": "model.keras", "history": "history.csv", "run": "run.h5"}


def run_file(kind: str, plan="{plan}", arm="{arm}", device="{device}", run="{run}") -> str:
    """``kind`` is a key of RUN_FILES."""
    return f"{run_directory(plan, arm, device, run)}/{RUN_FILES[kind]}"


# The tables `bitdrift training-stats` writes, by key of its result.
TRAINING_TABLES = {"summary": "training_variance", "runs": "training_runs",
                   "subgroups": "training_subgroups", "seed_ratio": "seed_ratio",
                   "determinism_cost": "determinism_cost"}
# Tables of `bitdrift example-divergence`: which test examples the noise hits.
EXAMPLE_TABLES = {"examples": "example_divergence", "overlap": "divergence_overlap",
                  "groups": "divergence_groups", "subset": "divergent_subset_accuracy"}
