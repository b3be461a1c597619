from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.studies.probes.evaluation import evaluate_probes

    evaluate_probes(
        snakemake.input.probes,
        snakemake.input.evaluation,
        list(snakemake.input.records),
        {key: snakemake.output[key] for key in ("classes", "summary", "identify", "figure")},
    )
