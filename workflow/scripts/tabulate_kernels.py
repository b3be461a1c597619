from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.kernels import write_kernel_tables

    write_kernel_tables(
        list(snakemake.input.records),
        snakemake.output.table,
        eqc=snakemake.input.eqc,
        divergence=snakemake.input.divergence,
        coverage_out=snakemake.output.coverage,
        orders_out=snakemake.output.orders,
        kernels_off=not snakemake.params.kernels,
        expect=snakemake.params.expect,
    )
