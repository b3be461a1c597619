import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.atomic import write_csv
from bitdrift.studies.maxpool.experiments import zero_programs

write_csv(zero_programs(), snakemake.output[0])
