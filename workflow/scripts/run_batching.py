import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.studies.batching.runs import run_device

    run_device(
        **snakemake.params.arguments,
        model_path=snakemake.input.model,
        dataset_path=snakemake.input.dataset,
        reference=snakemake.input.get("reference"),
        export=snakemake.input.get("export"),
        out=snakemake.output[0],
        log=sys.stderr,
    )
