import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.studies.ablation.cli import write_ablation_tables

write_ablation_tables(snakemake.params.config, Path(snakemake.output.layers).parent)
