from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.tables import write_precision_table

    write_precision_table(
        list(snakemake.input.records),
        snakemake.output[0],
        precision=snakemake.params.precision,
        significant_bits=True,
        workers=snakemake.threads,
        expect=snakemake.params.expect,
    )
