import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(
        main(
            ["plot-kernels", snakemake.input.table, "--eqc", snakemake.input.eqc]
            + ["--divergence", snakemake.input.divergence]
            + ["--coverage", snakemake.input.coverage, "--out", snakemake.output.pdf]
        )
    )
