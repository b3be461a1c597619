import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.cli import main

out_dir = Path(snakemake.output.examples).parent
sys.exit(main(["example-divergence", *snakemake.input, "--out-dir", str(out_dir),
               "--top-k", str(snakemake.params.top_k)]))
