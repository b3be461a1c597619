import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.cli import main

sys.exit(
    main(
        ["explain", *snakemake.input.records, "--out", snakemake.output.explain]
        + ["--flags-out", snakemake.output.flags]
        + ["--classes-out", snakemake.output.classes]
        + snakemake.params.expect
    )
)
