from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.backends.quantizers import quantize_model

    quantize_model(
        snakemake.input.model,
        snakemake.output[0],
        snakemake.params.settings,
        inputs_path=snakemake.input.inputs,
        named=lambda key: f"config key models.{snakemake.wildcards.model}.quantize.{key}",
    )
