import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

from bitdrift.cli import main  # noqa: E402

sys.exit(
    main(
        ["eqc", *snakemake.input.records, "--out", snakemake.output.final]  # noqa: F821
        + ["--layers-out", snakemake.output.layers]  # noqa: F821
        + snakemake.params.expect  # noqa: F821
    )
)
