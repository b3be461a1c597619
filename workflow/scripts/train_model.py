import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift import backends

    # A job of one Keras backend: Keras without the optional modules it would load and
    # this job never uses (bitdrift.backends.keras.common.preimport), seconds less start-up
    backends.get(snakemake.params.spec["train"]["backend"]).preimport()
    from bitdrift.run.training import train_model

    train_model(
        spec=snakemake.params.spec,
        seed=int(snakemake.wildcards.seed),
        dataset_path=snakemake.input.dataset,
        out_model=snakemake.output.model,
        out_history=snakemake.output.history,
        out_logits=snakemake.output.logits,
        threads=snakemake.threads,
        log=sys.stderr,
    )
