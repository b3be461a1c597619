import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.cli import main

sys.exit(
    main(
        ["eqc", *snakemake.input.records, "--out", snakemake.output.final]
        + ["--layers-out", snakemake.output.layers]
        + snakemake.params.expect
    )
)
