from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.analysis.quantized_parting import write_parting_table

    write_parting_table(
        [(model, path, list(records)) for model, path, records in snakemake.params.models],
        snakemake.output.table,
    )
