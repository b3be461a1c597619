"""Where the workflow puts things: the one place every path is spelled.

Each function returns a concrete path when given values and the Snakemake wildcard
pattern when called without them (``record_file()`` is
``results/inference/{model}/{device}.h5``), so rules, input functions, the command line and
the studies share one spelling: renaming a file is one edit here.
"""

from __future__ import annotations

RESULTS = "results"
TABLES = f"{RESULTS}/tables"
FIGURES = f"{RESULTS}/figures"


# -- core -----------------------------------------------------------------------------------
def dataset_file(dataset="{dataset}") -> str:
    return f"{RESULTS}/datasets/{dataset}.h5"


def trained_model_directory(model="{model}", seed="{seed}") -> str:
    return f"{RESULTS}/models/{model}/seed_{seed}"


def trained_model_file(model="{model}", seed="{seed}") -> str:
    return f"{trained_model_directory(model, seed)}/model.keras"


def training_history_file(model="{model}", seed="{seed}") -> str:
    return f"{trained_model_directory(model, seed)}/history.csv"


def test_logits_file(model="{model}", seed="{seed}") -> str:
    return f"{trained_model_directory(model, seed)}/test_logits.h5"


def model_file(config: dict, model: str) -> str:
    """The model the devices run: a bring-your-own file as is, else the inference seed's."""
    from bitdrift.config import inference_seed

    spec = config["models"][model]
    if "file" in spec:
        return spec["file"]
    return trained_model_file(model, inference_seed(spec))


def export_file(model="{model}", format="{format}") -> str:
    """The model exported for the runtimes that read ``format`` (bitdrift.reference.FORMATS)."""
    return f"{RESULTS}/exports/{model}/model.{format}"


def export_reference_file(model="{model}") -> str:
    return f"{RESULTS}/exports/{model}/reference.npz"


def record_file(model="{model}", device="{device}") -> str:
    return f"{RESULTS}/inference/{model}/{device}.h5"


def findings_file(suffix: str = "md") -> str:
    """What this machine showed, in sentences generated from the tables (bitdrift.findings):
    findings.md, and findings.rst for the report's first section."""
    return f"{RESULTS}/findings.{suffix}"


def table_file(name: str) -> str:
    """A table of the results (CSV), by its name without extension."""
    return f"{TABLES}/{name}.csv"


def table_html(name: str) -> str:
    """The same table as HTML, written beside the CSV; the HTML report shows it inline."""
    return f"{TABLES}/{name}.html"


def figure_file(name: str) -> str:
    """A figure of the results (PDF), by its name without extension."""
    return f"{FIGURES}/{name}.pdf"


def figure_png(name: str) -> str:
    """The same figure as PNG, written beside the PDF; the HTML report embeds it."""
    return f"{FIGURES}/{name}.png"


# -- probes study ----------------------------------------------------------------------------
def probe_file(model="{model}") -> str:
    """The probes of a model: a dataset file whose test set is the probes."""
    return f"{RESULTS}/probes/{model}/probes.h5"


def probe_evaluation_file(model="{model}") -> str:
    """The probes, then the natural test samples: what every device runs to judge them."""
    return f"{RESULTS}/probes/{model}/evaluation.h5"


def probe_record_file(model="{model}", device="{device}") -> str:
    return f"{RESULTS}/probes/{model}/records/{device}.h5"


# The tables `bitdrift probe-evaluate` writes, by key; its figure is `probes`.
PROBE_TABLES = {"classes": "probe_classes", "summary": "probe_summary",
                "identify": "probe_identify"}


# -- MaxPool study ----------------------------------------------------------------------------
def batching_run_file(model="{model}", device="{device}") -> str:
    """One device's batch-invariance run (JSON)."""
    return f"{RESULTS}/batching/{model}/{device}.json"


BATCHING_TABLES = {"layers": "batching_layers", "decoding": "batching_decoding",
                   "summary": "batching_summary"}


def maxpool_variation_file(precision="{precision}") -> str:
    return f"{RESULTS}/maxpool/variation/{precision}.csv"


def maxpool_volume_file(setting="{setting}") -> str:
    return f"{RESULTS}/maxpool/volume/{setting}.csv"


def maxpool_training_file(beta="{beta}", seed="{seed}") -> str:
    return f"{RESULTS}/maxpool/training/beta_{beta}/seed_{seed}.csv"


# -- training-variance study ------------------------------------------------------------------
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
