# bitdrift: how neural-network results drift when only the tooling changes.
# Table of contents: config + validation, then one include per stage, then `all`.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config.yaml"


include: "rules/common.smk"


report: "workflow/report/workflow.rst"


include: "rules/datasets.smk"
include: "rules/training.smk"
include: "rules/inference.smk"
include: "rules/analysis.smk"
include: "rules/maxpool.smk"
include: "rules/variance.smk"


rule all:
    default_target: True
    input:
        all_targets(),
    localrule: True
