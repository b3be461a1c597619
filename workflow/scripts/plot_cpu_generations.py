from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.figures import plot_generations_figure

    plot_generations_figure(
        list(snakemake.input.records), snakemake.input.eqc, snakemake.output.pdf
    )
