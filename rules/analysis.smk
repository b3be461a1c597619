rule cluster_equivalence_classes:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
    output:
        final=report(
            paths.table_file("eqc"),
            caption="../workflow/report/eqc_table.rst",
            category="Equivalence classes",
        ),
        layers=report(
            paths.table_file("eqc_layers"),
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
        table=report(
            paths.table_file("precision"),
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
        eqc=rules.cluster_equivalence_classes.output.final,
        records=record_files,
    output:
        report(
            paths.figure_file("eqc"),
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
        rules.compute_remaining_precision.output.table,
    output:
        report(
            paths.figure_file("remaining_precision"),
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
