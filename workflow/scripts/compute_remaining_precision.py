import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

from bitdrift.cli import main  # noqa: E402

sys.exit(
    main(
        ["precision", *snakemake.input.records, "--out", snakemake.output[0]]  # noqa: F821
        + ["--precision", snakemake.params.precision]  # noqa: F821
        + snakemake.params.expect  # noqa: F821
    )
)
