import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.cli import main

sys.exit(main(["plot-precision", snakemake.input[0], "--out", snakemake.output[0]]))
