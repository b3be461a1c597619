from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.kernels import plot_orders_figure

    plot_orders_figure(
        list(snakemake.input.records),
        snakemake.input.divergence,
        snakemake.output.pdf,
        expect=snakemake.params.expect,
    )
