from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.tables import write_effective_precision_table

    write_effective_precision_table(
        list(snakemake.input.records), snakemake.output[0], expect=snakemake.params.expect
    )
