import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.run.inference import infer
    from bitdrift.studies.probes.evaluation import evaluation_rows

    probe_rows, natural_rows = evaluation_rows(snakemake.input.dataset)
    infer(
        model_name=snakemake.wildcards.model,
        device_name=snakemake.wildcards.device,
        device=snakemake.params.device,
        model_path=snakemake.input.model,
        dataset_path=snakemake.input.dataset,
        samples=probe_rows + natural_rows,
        out=snakemake.output[0],
        # Output only, no kernel trace: the evaluation set holds hundreds of inputs.
        layers=False,
        reference=snakemake.input.get("reference"),
        export=snakemake.input.get("export"),
        kernels=False,
        # Like the search: the outputs alone, without the observer check's second pass
        observe=False,
        log=sys.stderr,
    )
