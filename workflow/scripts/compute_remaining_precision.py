import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.cli import main

sys.exit(
    main(
        ["precision", *snakemake.input.records, "--out", snakemake.output[0]]
        + ["--precision", snakemake.params.precision, "--significant-bits"]
        + ["--workers", str(snakemake.threads)]
        + snakemake.params.expect
    )
)
