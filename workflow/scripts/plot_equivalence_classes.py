import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.cli import main

sys.exit(
    main(
        ["plot-eqc", *snakemake.input.records, "--eqc", snakemake.input.eqc]
        + ["--out", snakemake.output[0], "--precision", snakemake.params.precision]
    )
)
