import sys
from pathlib import Path

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    out_dir = Path(snakemake.output.examples).parent
    sys.exit(main(["example-divergence", *snakemake.input, "--out-dir", str(out_dir),
                   "--top-k", str(snakemake.params.top_k)]))
