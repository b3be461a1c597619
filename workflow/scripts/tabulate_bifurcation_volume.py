import pandas as pd

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.atomic import write_csv
    from bitdrift.studies.maxpool.experiments import volume_summary

    draws = [pd.read_csv(path) for path in snakemake.input]
    write_csv(volume_summary(snakemake.params.study, draws), snakemake.output[0])
