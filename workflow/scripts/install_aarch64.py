from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.emulation.aarch64 import ensure

    ensure(snakemake.output[0], runtimes=snakemake.params.runtimes)
