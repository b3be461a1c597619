"""All MaxPool-study rules: the rule name picks the study step or figure."""

import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

from bitdrift.cli import main  # noqa: E402
from bitdrift.maxpool_study import run_step  # noqa: E402

rule, wildcards = snakemake.rule, snakemake.wildcards  # noqa: F821
inputs, out = list(snakemake.input), snakemake.output[0]  # noqa: F821

steps = {
    "maxpool_zero_program": "zero",
    "maxpool_backprop_variation": "variation",
    "maxpool_bifurcation_volume": "volume",
    "maxpool_train": "train",
    "tabulate_bifurcation_volume": "volume-table",
}
if rule not in steps:  # plot_backprop_variation -> `bitdrift plot-backprop-variation`
    sys.exit(main([rule.replace("_", "-"), *inputs, "--out", out]))
run_step(steps[rule], getattr(snakemake.params, "study", None), out,  # noqa: F821
         dataset=inputs[0] if inputs else None, inputs=inputs,
         precision=int(wildcards["precision"]) if "precision" in wildcards.keys() else None,
         setting=wildcards.get("setting"), beta=wildcards.get("beta"),
         seed=wildcards.get("seed"))
