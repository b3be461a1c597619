import sys
from pathlib import Path

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.studies.variance.runs import train_run

    wildcards = snakemake.wildcards
    train_run(
        plan_name=wildcards.plan,
        plan=snakemake.params.plan,
        arm=wildcards.arm,
        device_name=wildcards.device,
        device=snakemake.params.device,
        run=int(wildcards.run),
        dataset_path=snakemake.input.dataset,
        out_dir=Path(snakemake.output.run).parent,
        log=sys.stderr,
    )
