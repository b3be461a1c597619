from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.atomic import write_csv
    from bitdrift.studies.maxpool.experiments import zero_programs

    write_csv(zero_programs(), snakemake.output[0])
