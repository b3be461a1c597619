"""A figure rule: `bitdrift COMMAND INPUTS --out FIGURE` (params.command)."""

import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(main([snakemake.params.command, *snakemake.input, "--out", snakemake.output[0]]))
