"""A figure rule: `bitdrift COMMAND INPUTS --out FIGURE` (params.command).

The one script that goes through the command line: the figure rules of the core and of
the studies name their figure by its command (params.command), and the command line's
parser is where the studies register theirs (bitdrift.cli.build_parser), so the core's
scripts need not know a study's figures. Every other script calls its library function.
"""

import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    sys.exit(main([snakemake.params.command, *snakemake.input, "--out", snakemake.output[0]]))
