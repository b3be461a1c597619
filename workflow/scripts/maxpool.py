"""All MaxPool-study rules: the rule name picks the study step or figure."""

import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

import pandas as pd  # noqa: E402

from bitdrift import maxpool_figures  # noqa: E402
from bitdrift.maxpool_study import run_step  # noqa: E402

rule, wildcards = snakemake.rule, snakemake.wildcards  # noqa: F821
inputs, out = list(snakemake.input), snakemake.output[0]  # noqa: F821
study = getattr(snakemake.params, "study", {"accelerator": "cpu", "deterministic": True})  # noqa: F821

steps = {
    "maxpool_zero_program": "zero",
    "maxpool_backprop_variation": "variation",
    "maxpool_bifurcation_volume": "volume",
    "maxpool_train": "train",
    "tabulate_bifurcation_volume": "volume-table",
}
figures = {
    "plot_backprop_variation": maxpool_figures.plot_backprop_variation,
    "plot_bifurcation_volume": maxpool_figures.plot_bifurcation_volume,
    "plot_maxpool_training": maxpool_figures.plot_maxpool_training,
}
if rule in figures:
    figures[rule](pd.concat([pd.read_csv(path) for path in inputs], ignore_index=True), out)
else:
    run_step(steps[rule], study, out, dataset=inputs[0] if inputs else None, inputs=inputs,
             precision=int(wildcards["precision"]) if "precision" in wildcards.keys() else None,
             setting=wildcards.get("setting"), beta=wildcards.get("beta"),
             seed=wildcards.get("seed"))
