rule cluster_equivalence_classes:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
    output:
        final=paths.table_file("eqc"),
        final_html=report(
            paths.table_html("eqc"),
            caption="../workflow/report/eqc_table.rst",
            category="Equivalence classes",
            labels={"kind": "table", "name": "eqc"},
        ),
        layers=paths.table_file("eqc_layers"),
        layers_html=report(
            paths.table_html("eqc_layers"),
            caption="../workflow/report/eqc_layers_table.rst",
            category="Equivalence classes",
            labels={"kind": "table", "name": "eqc_layers"},
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
        # Config order numbers the classes: reordering devices must redo the tables.
        devices=DEVICES,
        expect=EXPECT_ARGUMENTS,
    script:
        "../workflow/scripts/cluster_equivalence_classes.py"


rule compute_remaining_precision:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
    output:
        table=paths.table_file("precision"),
        table_html=report(
            paths.table_html("precision"),
            caption="../workflow/report/precision_table.rst",
            category="Remaining precision",
            labels={"kind": "table", "name": "precision"},
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
        devices=DEVICES,
        precision=config["analysis"]["precision"],
        expect=EXPECT_ARGUMENTS,
    script:
        "../workflow/scripts/compute_remaining_precision.py"


rule plot_equivalence_classes:
    input:
        eqc=rules.cluster_equivalence_classes.output.final,
        records=record_files,
    output:
        pdf=paths.figure_file("eqc"),
        png=report(
            paths.figure_png("eqc"),
            caption="../workflow/report/eqc_figure.rst",
            category="Equivalence classes",
            labels={"kind": "figure", "name": "eqc"},
        ),
    log:
        "logs/plot_equivalence_classes/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        devices=DEVICES,
        precision=config["analysis"]["precision"],
    script:
        "../workflow/scripts/plot_equivalence_classes.py"


rule plot_remaining_precision:
    input:
        rules.compute_remaining_precision.output.table,
    output:
        pdf=paths.figure_file("remaining_precision"),
        png=report(
            paths.figure_png("remaining_precision"),
            caption="../workflow/report/precision_figure.rst",
            category="Remaining precision",
            labels={"kind": "figure", "name": "remaining_precision"},
        ),
    log:
        "logs/plot_remaining_precision/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/plot_remaining_precision.py"


rule explain_equivalence_classes:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
    output:
        explain=paths.table_file("explain"),
        explain_html=report(
            paths.table_html("explain"),
            caption="../workflow/report/explain_table.rst",
            category="Why devices differ",
            labels={"kind": "table", "name": "explain"},
        ),
        flags=paths.table_file("flag_groups"),
        flags_html=report(
            paths.table_html("flag_groups"),
            caption="../workflow/report/flag_groups_table.rst",
            category="Why devices differ",
            labels={"kind": "table", "name": "flag_groups"},
        ),
        classes=paths.table_file("device_classes"),
        classes_html=report(
            paths.table_html("device_classes"),
            caption="../workflow/report/device_classes_table.rst",
            category="Why devices differ",
            labels={"kind": "table", "name": "device_classes"},
        ),
    log:
        "logs/explain_equivalence_classes/all.log",
    benchmark:
        "results/benchmarks/explain_equivalence_classes/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        devices=DEVICES,
        expect=EXPECT_ARGUMENTS,
    script:
        "../workflow/scripts/explain_equivalence_classes.py"


rule locate_divergence:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
    output:
        table=paths.table_file("divergence"),
        html=report(
            paths.table_html("divergence"),
            caption="../workflow/report/divergence_table.rst",
            category="Why devices differ",
            labels={"kind": "table", "name": "divergence"},
        ),
    log:
        "logs/locate_divergence/all.log",
    benchmark:
        "results/benchmarks/locate_divergence/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        devices=DEVICES,
        expect=EXPECT_ARGUMENTS,
    script:
        "../workflow/scripts/locate_divergence.py"


rule check_effective_precision:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
    output:
        table=paths.table_file("effective_precision"),
        html=report(
            paths.table_html("effective_precision"),
            caption="../workflow/report/effective_precision_table.rst",
            # Snakemake's report breaks on a category of exactly two results (its
            # toggle guess pairs them as one result's two versions, and the category
            # opens blank): this one joins the remaining precision's two
            category="Remaining precision",
            labels={"kind": "table", "name": "effective_precision"},
        ),
    log:
        "logs/check_effective_precision/all.log",
    benchmark:
        "results/benchmarks/check_effective_precision/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        expect=EXPECT_ARGUMENTS,
    script:
        "../workflow/scripts/check_effective_precision.py"


rule tabulate_quantization_error:
    input:
        records=[path for pair in QUANTIZATION_ERROR_PAIRS for path in pair[1:3]],
        models=[pair[3] for pair in QUANTIZATION_ERROR_PAIRS],
    output:
        table=paths.table_file(paths.QUANTIZATION_ERROR_TABLE),
        html=report(
            paths.table_html(paths.QUANTIZATION_ERROR_TABLE),
            caption="../workflow/report/quantization_error_table.rst",
            category="Findings",
            labels={"kind": "table", "name": paths.QUANTIZATION_ERROR_TABLE},
        ),
    log:
        "logs/tabulate_quantization_error/all.log",
    benchmark:
        "results/benchmarks/tabulate_quantization_error/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        pairs=QUANTIZATION_ERROR_PAIRS,
    script:
        "../workflow/scripts/tabulate_quantization_error.py"


rule plot_quantization_error:
    input:
        table=rules.tabulate_quantization_error.output.table,
    output:
        pdf=paths.figure_file(paths.QUANTIZATION_ERROR_FIGURE),
        png=report(
            paths.figure_png(paths.QUANTIZATION_ERROR_FIGURE),
            caption="../workflow/report/quantization_error_figure.rst",
            category="Findings",
            labels={"kind": "figure", "name": paths.QUANTIZATION_ERROR_FIGURE},
        ),
    log:
        "logs/plot_quantization_error/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/plot_quantization_error.py"


rule tabulate_quantized_parting:
    input:
        records=[path for entry in QUANTIZED_PARTING_MODELS for path in entry[2]],
        models=[entry[1] for entry in QUANTIZED_PARTING_MODELS],
    output:
        table=paths.table_file(paths.QUANTIZED_PARTING_TABLE),
        html=report(
            paths.table_html(paths.QUANTIZED_PARTING_TABLE),
            caption="../workflow/report/quantized_parting_table.rst",
            category="Findings",
            labels={"kind": "table", "name": paths.QUANTIZED_PARTING_TABLE},
        ),
    log:
        "logs/tabulate_quantized_parting/all.log",
    benchmark:
        "results/benchmarks/tabulate_quantized_parting/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        models=QUANTIZED_PARTING_MODELS,
    script:
        "../workflow/scripts/tabulate_quantized_parting.py"


rule tabulate_argmax_agreement:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
    output:
        table=paths.table_file("argmax_agreement"),
        html=report(
            paths.table_html("argmax_agreement"),
            caption="../workflow/report/argmax_agreement_table.rst",
            # with findings.md and the device failures: no category of exactly two
            # results (see effective_precision)
            category="Findings",
            labels={"kind": "table", "name": "argmax_agreement"},
        ),
    log:
        "logs/tabulate_argmax_agreement/all.log",
    benchmark:
        "results/benchmarks/tabulate_argmax_agreement/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        expect=EXPECT_ARGUMENTS,
    script:
        "../workflow/scripts/tabulate_argmax_agreement.py"


rule tabulate_observer_check:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
    output:
        table=paths.table_file("observer_check"),
        html=report(
            paths.table_html("observer_check"),
            caption="../workflow/report/observer_check_table.rst",
            # beside the classes it decides (they are the deployed outputs')
            category="Equivalence classes",
            labels={"kind": "table", "name": "observer_check"},
        ),
    log:
        "logs/tabulate_observer_check/all.log",
    benchmark:
        "results/benchmarks/tabulate_observer_check/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        expect=EXPECT_ARGUMENTS,
    script:
        "../workflow/scripts/tabulate_observer_check.py"


rule plot_eqc_table:
    input:
        records=record_files,
        eqc=rules.cluster_equivalence_classes.output.final,
        classes=rules.explain_equivalence_classes.output.classes,
    output:
        pdf=paths.figure_file("eqc_table"),
        png=report(
            paths.figure_png("eqc_table"),
            caption="../workflow/report/eqc_table_figure.rst",
            category="Why devices differ",
            labels={"kind": "figure", "name": "eqc_table"},
        ),
        table=paths.table_file("eqc_table"),
        table_html=report(
            paths.table_html("eqc_table"),
            caption="../workflow/report/eqc_table_csv.rst",
            category="Why devices differ",
            labels={"kind": "table", "name": "eqc_table"},
        ),
    log:
        "logs/plot_eqc_table/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/plot_eqc_table.py"


rule plot_divergence:
    input:
        rules.cluster_equivalence_classes.output.layers,
        rules.compute_remaining_precision.output.table,
    output:
        pdf=paths.figure_file("divergence"),
        png=report(
            paths.figure_png("divergence"),
            caption="../workflow/report/divergence_figure.rst",
            category="Why devices differ",
            labels={"kind": "figure", "name": "divergence"},
        ),
    log:
        "logs/plot_divergence/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        command="plot-divergence",
    script:
        "../workflow/scripts/plot_with_cli.py"


rule tabulate_kernels:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
        eqc=rules.cluster_equivalence_classes.output.final,
        divergence=rules.locate_divergence.output.table,
    output:
        table=paths.table_file("kernels"),
        html=report(
            paths.table_html("kernels"),
            caption="../workflow/report/kernels_table.rst",
            category="Why devices differ",
            labels={"kind": "table", "name": "kernels"},
        ),
        coverage=paths.table_file("kernel_coverage"),
        coverage_html=report(
            paths.table_html("kernel_coverage"),
            caption="../workflow/report/kernel_coverage_table.rst",
            category="Why devices differ",
            labels={"kind": "table", "name": "kernel_coverage"},
        ),
        orders=paths.table_file("accumulation_orders"),
        orders_html=report(
            paths.table_html("accumulation_orders"),
            caption="../workflow/report/accumulation_orders_table.rst",
            category="Why devices differ",
            labels={"kind": "table", "name": "accumulation_orders"},
        ),
    log:
        "logs/tabulate_kernels/all.log",
    benchmark:
        "results/benchmarks/tabulate_kernels/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        expect=EXPECT_ARGUMENTS,
        kernels=config["analysis"]["kernels"],
    script:
        "../workflow/scripts/tabulate_kernels.py"


rule plot_kernels:
    input:
        table=rules.tabulate_kernels.output.table,
        eqc=rules.cluster_equivalence_classes.output.final,
        divergence=rules.locate_divergence.output.table,
        coverage=rules.tabulate_kernels.output.coverage,
    output:
        pdf=paths.figure_file("kernels"),
        png=report(
            paths.figure_png("kernels"),
            caption="../workflow/report/kernels_figure.rst",
            category="Why devices differ",
            labels={"kind": "figure", "name": "kernels"},
        ),
    log:
        "logs/plot_kernels/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/plot_kernels.py"


rule plot_accumulation_orders:
    input:
        records=record_files,
        provenance=PROVENANCE_FILES,
        divergence=rules.locate_divergence.output.table,
    output:
        pdf=paths.figure_file("accumulation_orders"),
        png=report(
            paths.figure_png("accumulation_orders"),
            caption="../workflow/report/accumulation_orders_figure.rst",
            category="Why devices differ",
            labels={"kind": "figure", "name": "accumulation_orders"},
        ),
    log:
        "logs/plot_accumulation_orders/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        expect=EXPECT_ARGUMENTS,
    script:
        "../workflow/scripts/plot_accumulation_orders.py"


rule tabulate_device_failures:
    input:
        records=record_files,
    output:
        table=paths.table_file("device_failures"),
        html=report(
            paths.table_html("device_failures"),
            caption="../workflow/report/device_failures_table.rst",
            category="Findings",
            labels={"kind": "table", "name": "device_failures"},
        ),
    log:
        "logs/tabulate_device_failures/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/tabulate_device_failures.py"


rule write_findings:
    input:
        unpack(findings_study_tables),
        unpack(findings_atlas_tables),
        unpack(findings_quantization_tables),
        records=record_files,
        eqc=rules.cluster_equivalence_classes.output.final,
        eqc_layers=rules.cluster_equivalence_classes.output.layers,
        explain=rules.explain_equivalence_classes.output.explain,
        # each device's values of the explaining settings: the answer's one setting
        device_classes=rules.explain_equivalence_classes.output.classes,
        divergence=rules.locate_divergence.output.table,
        kernel_coverage=rules.tabulate_kernels.output.coverage,
        accumulation_orders=rules.tabulate_kernels.output.orders,
        effective_precision=rules.check_effective_precision.output.table,
        argmax_agreement=rules.tabulate_argmax_agreement.output.table,
        observer_check=rules.tabulate_observer_check.output.table,
        device_failures=rules.tabulate_device_failures.output.table,
        # shown after the classes on the report's first screen
        eqc_figure=rules.plot_equivalence_classes.output.png,
    output:
        markdown=report(
            paths.findings_file("md"),
            caption="../workflow/report/findings.rst",
            category="Findings",
            labels={"kind": "text", "name": "findings"},
        ),
        rst=paths.findings_file("rst"),
    log:
        "logs/write_findings/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        # devices left out of a model (their runtime cannot run its format), a model of
        # one device: the plan's notes, which the findings say ({}: nothing to say)
        planned=PLAN.device_plan(),
    script:
        "../workflow/scripts/write_findings.py"


rule plot_cpu_generations:
    input:
        records=record_files,
        eqc=rules.cluster_equivalence_classes.output.final,
    output:
        pdf=paths.figure_file("cpu_generations"),
        png=report(
            paths.figure_png("cpu_generations"),
            caption="../workflow/report/cpu_generations_figure.rst",
            category="Equivalence classes",
            labels={"kind": "figure", "name": "cpu_generations"},
        ),
    log:
        "logs/plot_cpu_generations/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/plot_cpu_generations.py"
