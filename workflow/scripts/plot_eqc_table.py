import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.cli import main

sys.exit(
    main(
        ["plot-eqc-table", *snakemake.input.records, "--eqc", snakemake.input.eqc]
        + ["--classes", snakemake.input.classes, "--out", snakemake.output.pdf]
        + ["--table-out", snakemake.output.table]
    )
)
