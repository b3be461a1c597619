import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(
        main(
            ["observer", *snakemake.input.records, "--out", snakemake.output[0]]
            + snakemake.params.expect
        )
    )
