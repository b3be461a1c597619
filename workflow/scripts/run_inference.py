import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.inference import infer

    infer(
        model_name=snakemake.wildcards.model,
        device_name=snakemake.wildcards.device,
        device=snakemake.params.device,
        model_path=snakemake.input.model,
        dataset_path=snakemake.input.dataset,
        samples=snakemake.params.samples,
        out=snakemake.output[0],
        layers=snakemake.params.layers,
        reference=snakemake.input.get("reference"),
        export=snakemake.input.get("export"),
        kernels=snakemake.params.kernels,
        log=sys.stderr,
    )
