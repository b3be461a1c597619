from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.studies.probes.evaluation import write_evaluation_set

    write_evaluation_set(
        snakemake.input.probes,
        snakemake.input.dataset,
        snakemake.output[0],
        snakemake.params.natural_pool,
    )
