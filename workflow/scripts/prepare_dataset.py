import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

from bitdrift.datasets import prepare_dataset  # noqa: E402

prepare_dataset(snakemake.wildcards.dataset, snakemake.params.spec, snakemake.output[0])  # noqa: F821
