from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.inputs.datasets import GRAMMAR_VOCABULARY
    from bitdrift.studies.batching.analysis import write_batching

    write_batching(
        list(snakemake.input.runs),
        snakemake.input.model,
        {key: snakemake.output[key] for key in ("layers", "decoding", "summary")},
        snakemake.output.figure,
        GRAMMAR_VOCABULARY,
    )
