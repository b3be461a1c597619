import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

from bitdrift.cli import main  # noqa: E402

out_dir = Path(snakemake.output.summary).parent  # noqa: F821
sys.exit(main(["training-stats", *snakemake.input, "--out-dir", str(out_dir)]))  # noqa: F821
