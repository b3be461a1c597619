import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(
        main(
            ["atlas", "compare", *snakemake.input.records]
            + ["--atlas", snakemake.params.atlas, "--out", snakemake.output.table]
            + ["--refused-out", snakemake.output.refused]
            + ["--figure-out", snakemake.output.pdf]
        )
    )
