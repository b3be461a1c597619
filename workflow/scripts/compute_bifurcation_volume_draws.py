from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.atomic import write_csv
    from bitdrift.studies.maxpool.experiments import volume_draws

    write_csv(
        volume_draws(
            snakemake.params.study, snakemake.input.dataset, snakemake.wildcards.setting
        ),
        snakemake.output[0],
        html=False,  # a part of a table, shown by no report
    )
