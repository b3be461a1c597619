import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)

from bitdrift.atomic import write_csv
from bitdrift.studies.maxpool.experiments import backprop_variation

write_csv(
    backprop_variation(
        snakemake.params.study,
        snakemake.input.dataset,
        int(snakemake.wildcards.precision),
    ),
    snakemake.output[0],
    html=False,  # a part of a table, shown by no report
)
