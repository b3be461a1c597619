from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.figures import plot_eqc_figure

    plot_eqc_figure(
        list(snakemake.input.records),
        snakemake.input.eqc,
        snakemake.output[0],
        precision=snakemake.params.precision,
    )
