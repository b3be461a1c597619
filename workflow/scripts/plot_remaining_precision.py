import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(main(["plot-precision", snakemake.input[0], "--out", snakemake.output[0]]))
