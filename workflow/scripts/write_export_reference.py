from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift import backends

    # A job of one Keras backend: Keras without the optional modules it would load and
    # this job never uses (bitdrift.backends.keras.common.preimport), seconds less start-up
    backends.get("tensorflow").preimport()
    from bitdrift.backends.keras.export import write_reference

    write_reference(snakemake.input.model, snakemake.input.dataset, snakemake.output[0])
