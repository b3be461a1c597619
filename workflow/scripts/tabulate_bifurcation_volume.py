import sys

import pandas as pd

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.atomic import write_csv
from bitdrift.studies.maxpool.experiments import volume_summary

draws = [pd.read_csv(path) for path in snakemake.input]
write_csv(volume_summary(snakemake.params.study, draws), snakemake.output[0])
