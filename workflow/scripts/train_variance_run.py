import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

from bitdrift.variance_training import train_run  # noqa: E402

wildcards = snakemake.wildcards  # noqa: F821
train_run(
    plan_name=wildcards.plan,
    plan=snakemake.params.plan,  # noqa: F821
    arm=wildcards.arm,
    device_name=wildcards.device,
    device=snakemake.params.device,  # noqa: F821
    run=int(wildcards.run),
    dataset_path=snakemake.input.dataset,  # noqa: F821
    out_dir=Path(snakemake.output.run).parent,  # noqa: F821
    log=sys.stderr,
)
