from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.export import write_reference

    write_reference(snakemake.input.model, snakemake.input.dataset, snakemake.output[0])
