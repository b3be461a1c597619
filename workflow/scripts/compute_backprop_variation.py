from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.atomic import write_csv
    from bitdrift.studies.maxpool.experiments import backprop_variation

    write_csv(
        backprop_variation(
            snakemake.params.study,
            snakemake.input.dataset,
            int(snakemake.wildcards.precision),
        ),
        snakemake.output[0],
        html=False,  # a part of a table, shown by no report
    )
