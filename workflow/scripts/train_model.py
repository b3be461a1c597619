import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

from bitdrift.training import train_model  # noqa: E402

train_model(
    spec=snakemake.params.spec,  # noqa: F821
    seed=int(snakemake.wildcards.seed),  # noqa: F821
    dataset_path=snakemake.input.dataset,  # noqa: F821
    out_model=snakemake.output.model,  # noqa: F821
    out_history=snakemake.output.history,  # noqa: F821
    out_logits=snakemake.output.logits,  # noqa: F821
    threads=snakemake.threads,  # noqa: F821
    log=sys.stderr,
)
