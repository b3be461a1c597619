import sys

sys.stderr = open(snakemake.log[0], "w", buffering=1)  # noqa: F821

from bitdrift.inference import infer  # noqa: E402

infer(
    model_name=snakemake.wildcards.model,  # noqa: F821
    device_name=snakemake.wildcards.device,  # noqa: F821
    device=snakemake.params.device,  # noqa: F821
    model_path=snakemake.input.model,  # noqa: F821
    dataset_path=snakemake.input.dataset,  # noqa: F821
    samples=snakemake.params.samples,  # noqa: F821
    out=snakemake.output[0],  # noqa: F821
    layers=snakemake.params.layers,  # noqa: F821
    log=sys.stderr,
)
