rule cluster_equivalence_classes:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
    output:
        final=report(
            "results/tables/eqc.csv",
            caption="../workflow/report/eqc_table.rst",
            category="Equivalence classes",
        ),
        layers=report(
            "results/tables/eqc_layers.csv",
            caption="../workflow/report/eqc_layers_table.rst",
            category="Equivalence classes",
        ),
    log:
        "logs/cluster_equivalence_classes/all.log",
    benchmark:
        "results/benchmarks/cluster_equivalence_classes/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        expect=EXPECT_ARGUMENTS,
    script:
        "../workflow/scripts/cluster_equivalence_classes.py"


rule compute_remaining_precision:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
    output:
        report(
            "results/tables/precision.csv",
            caption="../workflow/report/precision_table.rst",
            category="Remaining precision",
        ),
    log:
        "logs/compute_remaining_precision/all.log",
    benchmark:
        "results/benchmarks/compute_remaining_precision/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        precision=config["analysis"]["precision"],
        expect=EXPECT_ARGUMENTS,
    script:
        "../workflow/scripts/compute_remaining_precision.py"


rule plot_equivalence_classes:
    input:
        eqc="results/tables/eqc.csv",
        records=record_files,
    output:
        report(
            "results/figures/eqc.pdf",
            caption="../workflow/report/eqc_figure.rst",
            category="Equivalence classes",
        ),
    log:
        "logs/plot_equivalence_classes/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        precision=config["analysis"]["precision"],
    script:
        "../workflow/scripts/plot_equivalence_classes.py"


rule plot_remaining_precision:
    input:
        "results/tables/precision.csv",
    output:
        report(
            "results/figures/remaining_precision.pdf",
            caption="../workflow/report/precision_figure.rst",
            category="Remaining precision",
        ),
    log:
        "logs/plot_remaining_precision/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/plot_remaining_precision.py"
