import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

from bitdrift.cli import main  # noqa: E402

sys.exit(
    main(
        ["plot-eqc", *snakemake.input.records, "--eqc", snakemake.input.eqc]  # noqa: F821
        + ["--out", snakemake.output[0], "--precision", snakemake.params.precision]  # noqa: F821
    )
)
