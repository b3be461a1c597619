from pathlib import Path

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.studies.ablation.cli import write_ablation_tables

    write_ablation_tables(snakemake.params.config, Path(snakemake.output.layers).parent)
