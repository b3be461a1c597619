# bitdrift: how neural-network results drift when only the tooling changes.
# Table of contents: config + validation, then one include per stage, then `all`.
import sys

from snakemake.utils import min_version

min_version("9.0")


# A preset given with --configfile is a complete config that replaces config.yaml (it is
# not merged into the default's devices, models and studies); later --configfile files
# still overlay earlier ones.
if not workflow.config_settings.configfiles:

    configfile: "config.yaml"


# A preset runs in a folder of its own (its `workdir` key): it never writes over the
# default run's results/.
if isinstance(config.get("workdir"), str) and config["workdir"]:

    workdir: config["workdir"]


include: "rules/common.smk"


report: "workflow/report/workflow.rst"


include: "rules/datasets.smk"
include: "rules/training.smk"
include: "rules/inference.smk"
include: "rules/analysis.smk"
include: "rules/atlas.smk"
include: "rules/maxpool.smk"
include: "rules/variance.smk"
include: "rules/ablation.smk"
include: "rules/probes.smk"
include: "rules/batching.smk"


# A run of `all` ends by writing results/report.html (write_report), also when a device
# failed: a device that failed left a failure record and the others went on
# (bitdrift.record.failures); the run names each one, removes its failure record so the next run
# retries it, and ends non-zero. When no device ran, findings.md says so in place of an
# earlier run's answer.
onsuccess:
    try:
        write_report()
    finally:
        if end_of_run(scheduled_record_files(), **answer_files()):
            sys.exit(1)


onerror:
    end_of_run(scheduled_record_files(), **answer_files())
    print(
        "bitdrift: a job failed, so results/report.html is not rebuilt; once the run "
        "succeeds, it is (or: snakemake --profile profiles/local --report results/report.html)",
        file=sys.stderr,
    )


rule all:
    default_target: True
    input:
        all_targets(),
    localrule: True
