# The rules of the ablation study; its helpers are in ablation_common.smk.


include: "ablation_common.smk"


rule tabulate_ablation:
    input:
        ablation_files,
    output:
        layers=paths.table_file("ablation_layers"),
        layers_html=report(
            paths.table_html("ablation_layers"),
            caption="../workflow/report/ablation_layers_table.rst",
            category="Ablation",
            labels={"kind": "table", "name": "ablation_layers"},
        ),
        activation=paths.table_file("activation_deviations"),
        activation_html=report(
            paths.table_html("activation_deviations"),
            caption="../workflow/report/activation_deviations_table.rst",
            category="Ablation",
            labels={"kind": "table", "name": "activation_deviations"},
        ),
        effects=paths.table_file("layer_effects"),
        effects_html=report(
            paths.table_html("layer_effects"),
            caption="../workflow/report/layer_effects_table.rst",
            category="Ablation",
            labels={"kind": "table", "name": "layer_effects"},
        ),
        accuracy=paths.table_file("validation_accuracy"),
        accuracy_html=report(
            paths.table_html("validation_accuracy"),
            caption="../workflow/report/validation_accuracy_table.rst",
            category="Ablation",
            labels={"kind": "table", "name": "validation_accuracy"},
        ),
        casting=paths.table_file("precision_casting"),
        casting_html=report(
            paths.table_html("precision_casting"),
            caption="../workflow/report/precision_casting_table.rst",
            category="Ablation",
            labels={"kind": "table", "name": "precision_casting"},
        ),
        across_frameworks=paths.table_file("activation_deviations_across_frameworks"),
        across_frameworks_html=report(
            paths.table_html("activation_deviations_across_frameworks"),
            caption="../workflow/report/activation_deviations_across_frameworks_table.rst",
            category="Ablation",
            labels={
                "kind": "table",
                "name": "activation_deviations_across_frameworks",
            },
        ),
    log:
        "logs/tabulate_ablation/all.log",
    benchmark:
        "results/benchmarks/tabulate_ablation/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        config=ablation_config,
    script:
        "../workflow/scripts/tabulate_ablation.py"


rule plot_ablation_layers:
    input:
        rules.tabulate_ablation.output.layers,
    output:
        pdf=paths.figure_file("ablation_layers"),
        png=report(
            paths.figure_png("ablation_layers"),
            caption="../workflow/report/ablation_layers_figure.rst",
            category="Ablation",
            labels={"kind": "figure", "name": "ablation_layers"},
        ),
    log:
        "logs/plot_ablation_layers/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        command="plot-ablation-layers",
    script:
        "../workflow/scripts/plot_with_cli.py"


rule plot_precision_casting:
    input:
        rules.tabulate_ablation.output.casting,
    output:
        pdf=paths.figure_file("precision_casting"),
        png=report(
            paths.figure_png("precision_casting"),
            caption="../workflow/report/precision_casting_figure.rst",
            category="Ablation",
            labels={"kind": "figure", "name": "precision_casting"},
        ),
    log:
        "logs/plot_precision_casting/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        command="plot-precision-casting",
    script:
        "../workflow/scripts/plot_with_cli.py"
