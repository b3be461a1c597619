import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.cli import main

out_dir = Path(snakemake.output.summary).parent
sys.exit(main(["training-stats", *snakemake.input, "--out-dir", str(out_dir)]))
