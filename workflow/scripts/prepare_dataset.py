from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.datasets import prepare_dataset

    prepare_dataset(snakemake.wildcards.dataset, snakemake.params.spec, snakemake.output[0])
