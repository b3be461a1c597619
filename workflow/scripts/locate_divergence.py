from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.tables import write_divergence_table

    write_divergence_table(
        list(snakemake.input.records), snakemake.output[0], expect=snakemake.params.expect
    )
