import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(
        main(
            ["plot-generations", *snakemake.input.records]
            + ["--eqc", snakemake.input.eqc, "--out", snakemake.output.pdf]
        )
    )
