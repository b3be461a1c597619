from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.inputs.examples import write_example

    write_example(snakemake.wildcards.example, snakemake.output.model,
                  snakemake.output.inputs, samples=snakemake.params.samples)
