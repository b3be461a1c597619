import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.cli import main

sys.exit(
    main(
        ["effective-precision", *snakemake.input.records, "--out", snakemake.output[0]]
        + snakemake.params.expect
    )
)
