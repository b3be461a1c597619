from pathlib import Path

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.studies.variance.stats import write_training_tables

    write_training_tables(list(snakemake.input), Path(snakemake.output.summary).parent)
