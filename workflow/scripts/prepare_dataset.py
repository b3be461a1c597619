import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.datasets import prepare_dataset

prepare_dataset(snakemake.wildcards.dataset, snakemake.params.spec, snakemake.output[0])
