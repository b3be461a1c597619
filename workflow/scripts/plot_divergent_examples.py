import sys

from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.cli import main

    arm = ["--arm", snakemake.params.arm] if snakemake.params.arm else []
    sys.exit(main(["plot-divergent-examples", snakemake.input.table, "--dataset-file",
                   snakemake.input.dataset, "--plan", snakemake.params.plan, *arm,
                   "--top-k", str(snakemake.params.top_k), "--out", snakemake.output.pdf]))
