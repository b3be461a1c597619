import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(
        main(
            ["eqc", *snakemake.input.records, "--out", snakemake.output.final]
            + ["--layers-out", snakemake.output.layers]
            + snakemake.params.expect
        )
    )
