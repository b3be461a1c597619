from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.atomic import write_csv
    from bitdrift.studies.maxpool.experiments import hybrid_training

    write_csv(
        hybrid_training(
            snakemake.params.study,
            snakemake.input.dataset,
            beta=float(snakemake.wildcards.beta),
            seed=int(snakemake.wildcards.seed),
        ),
        snakemake.output[0],
        html=False,  # a part of a table, shown by no report
    )
