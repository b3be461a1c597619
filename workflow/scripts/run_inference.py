import sys

from bitdrift.jobs import workflow_job
from bitdrift.record.failures import failure_recorder

# A device that fails leaves a failure record, and the other devices go on
# (bitdrift.record.failures)
on_failure = failure_recorder(
    snakemake.output[0],
    snakemake.wildcards.model,
    snakemake.wildcards.device,
    snakemake.params.device["backend"],
    snakemake.log[0],
)
with workflow_job(snakemake.log[0], on_failure=on_failure):
    from bitdrift.run.inference import infer

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
        deployed_export=snakemake.input.get("deployed_export"),
        kernels=snakemake.params.kernels,
        replay=snakemake.params.replay,
        full_samples=snakemake.params.full_samples,
        layer_select=snakemake.params.layer_select,
        traced_samples=snakemake.params.traced_samples,
        quantization=snakemake.params.quantization,
        log=sys.stderr,
    )
