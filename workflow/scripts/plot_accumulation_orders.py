import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(
        main(
            ["plot-orders", *snakemake.input.records]
            + ["--divergence", snakemake.input.divergence, "--out", snakemake.output.pdf]
            + snakemake.params.expect
        )
    )
