from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.tables import write_explain_tables

    write_explain_tables(
        list(snakemake.input.records),
        snakemake.output.explain,
        flags_out=snakemake.output.flags,
        classes_out=snakemake.output.classes,
        expect=snakemake.params.expect,
    )
