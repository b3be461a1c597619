from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.atlas import compare_with_atlas

    compare_with_atlas(
        list(snakemake.input.records),
        atlas=snakemake.params.atlas,
        out=snakemake.output.table,
        refused_out=snakemake.output.refused,
        figure_out=snakemake.output.pdf,
    )
