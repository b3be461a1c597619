from pathlib import Path

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.studies.variance.examples import write_example_tables

    write_example_tables(
        list(snakemake.input),
        Path(snakemake.output.examples).parent,
        top_k=snakemake.params.top_k,
    )
