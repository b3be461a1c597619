from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.export import export_model

    export_model(snakemake.input.model, snakemake.wildcards.format, snakemake.output[0])
