"""The training-variance figures: plot_churn -> `bitdrift plot-churn TABLES --out PDF`."""

import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

from bitdrift.cli import main  # noqa: E402

command = snakemake.rule.replace("_", "-")  # noqa: F821
sys.exit(main([command, *snakemake.input, "--out", snakemake.output[0]]))  # noqa: F821
