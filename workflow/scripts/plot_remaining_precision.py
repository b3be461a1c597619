from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.figures import plot_precision_figure

    plot_precision_figure(snakemake.input[0], snakemake.output[0])
