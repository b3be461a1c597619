import sys
from pathlib import Path

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    out_dir = Path(snakemake.output.summary).parent
    sys.exit(main(["training-stats", *snakemake.input, "--out-dir", str(out_dir)]))
