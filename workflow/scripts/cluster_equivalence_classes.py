from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.tables import write_eqc_tables

    write_eqc_tables(
        list(snakemake.input.records),
        snakemake.output.final,
        layers_out=snakemake.output.layers,
        expect=snakemake.params.expect,
    )
