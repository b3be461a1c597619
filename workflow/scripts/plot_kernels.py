from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.kernels import plot_kernel_figure

    plot_kernel_figure(
        snakemake.input.table,
        snakemake.input.eqc,
        snakemake.input.divergence,
        snakemake.input.coverage,
        snakemake.output.pdf,
    )
