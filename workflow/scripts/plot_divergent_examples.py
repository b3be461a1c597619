from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.studies.variance.figures import plot_divergent_examples_figure

    plot_divergent_examples_figure(
        snakemake.input.table,
        snakemake.input.dataset,
        snakemake.params.plan,
        snakemake.output.pdf,
        arm=snakemake.params.arm or None,
        top_k=snakemake.params.top_k,
    )
