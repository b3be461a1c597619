from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.inputs.datasets import check_samples, prepare_dataset

    prepare_dataset(snakemake.wildcards.dataset, snakemake.params.spec, snakemake.output[0])
    check_samples(snakemake.output[0], snakemake.params.samples)
