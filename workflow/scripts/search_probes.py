import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.studies.probes.search import search_probes

    section = snakemake.params.section
    devices = snakemake.params.devices
    search_probes(
        model_name=snakemake.wildcards.model,
        model_path=snakemake.input.model,
        dataset_path=snakemake.input.dataset,
        devices=devices,
        inputs={
            device: {
                kind: snakemake.input.get(f"{kind}_{device}")
                for kind in ("export", "reference")
                if snakemake.input.get(f"{kind}_{device}")
            }
            for device in devices
        },
        probes=section["probes"],
        seed=section["seed"],
        generations=section["generations"],
        population=section["population"],
        pool=section.get("natural_pool"),
        noise=section["noise"],
        out=snakemake.output[0],
        log=sys.stderr,
    )
