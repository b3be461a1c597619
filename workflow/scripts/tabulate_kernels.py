import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(
        main(
            ["kernels", *snakemake.input.records, "--out", snakemake.output.table]
            + ["--eqc", snakemake.input.eqc, "--divergence", snakemake.input.divergence]
            + ["--coverage-out", snakemake.output.coverage]
            + ["--orders-out", snakemake.output.orders]
            + snakemake.params.expect
            + ([] if snakemake.params.kernels else ["--kernels-off"])
        )
    )
