import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(
        main(
            ["explain", *snakemake.input.records, "--out", snakemake.output.explain]
            + ["--flags-out", snakemake.output.flags]
            + ["--classes-out", snakemake.output.classes]
            + snakemake.params.expect
        )
    )
