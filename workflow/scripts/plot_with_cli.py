"""A figure rule: `bitdrift COMMAND INPUTS --out FIGURE` (params.command)."""

import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.cli import main

sys.exit(main([snakemake.params.command, *snakemake.input, "--out", snakemake.output[0]]))
