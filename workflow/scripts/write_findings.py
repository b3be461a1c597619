import sys
from pathlib import Path

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(
        main(
            ["findings", *snakemake.input.records]
            + ["--tables", str(Path(snakemake.input.eqc).parent)]
            + ["--out", snakemake.output.markdown, "--rst-out", snakemake.output.rst]
            + ["--figure", snakemake.input.eqc_figure]
        )
    )
