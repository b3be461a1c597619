from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.figures import plot_eqc_table_figure

    plot_eqc_table_figure(
        list(snakemake.input.records),
        snakemake.input.eqc,
        snakemake.input.classes,
        snakemake.output.pdf,
        table_out=snakemake.output.table,
    )
