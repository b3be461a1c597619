from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.tables import write_failures_table

    write_failures_table(list(snakemake.input.records), snakemake.output.table)
