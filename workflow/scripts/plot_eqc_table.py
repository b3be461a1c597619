import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(
        main(
            ["plot-eqc-table", *snakemake.input.records, "--eqc", snakemake.input.eqc]
            + ["--classes", snakemake.input.classes, "--out", snakemake.output.pdf]
            + ["--table-out", snakemake.output.table]
        )
    )
