# The rules of the maxpool study; its helpers are in maxpool_common.smk.


include: "maxpool_common.smk"


rule compute_zero_programs:
    output:
        table=paths.table_file("maxpool_zero_program"),
        html=report(
            paths.table_html("maxpool_zero_program"),
            caption="../workflow/report/maxpool_zero_program.rst",
            category="MaxPool study",
            labels={"kind": "table", "name": "maxpool_zero_program"},
        ),
    log:
        "logs/compute_zero_programs/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/compute_zero_programs.py"


rule compute_backprop_variation:
    input:
        dataset=maxpool_dataset_file,
    output:
        maxpool_paths.maxpool_variation_file(),
    log:
        "logs/compute_backprop_variation/{precision}.log",
    benchmark:
        "results/benchmarks/compute_backprop_variation/{precision}.tsv"
    wildcard_constraints:
        precision="16|32|64",
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **MAXPOOL_RESOURCES,
    params:
        study=maxpool_spec,
    script:
        "../workflow/scripts/compute_backprop_variation.py"


rule compute_bifurcation_volume_draws:
    input:
        dataset=maxpool_dataset_file,
    output:
        maxpool_paths.maxpool_volume_file(),
    log:
        "logs/compute_bifurcation_volume_draws/{setting}.log",
    benchmark:
        "results/benchmarks/compute_bifurcation_volume_draws/{setting}.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **MAXPOOL_RESOURCES,
    params:
        study=maxpool_spec,
    script:
        "../workflow/scripts/compute_bifurcation_volume_draws.py"


rule train_hybrid_maxpool:
    input:
        dataset=maxpool_dataset_file,
    output:
        maxpool_paths.maxpool_training_file(),
    log:
        "logs/train_hybrid_maxpool/beta_{beta}/seed_{seed}.log",
    benchmark:
        "results/benchmarks/train_hybrid_maxpool/beta_{beta}/seed_{seed}.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **MAXPOOL_RESOURCES,
    params:
        study=maxpool_spec,
    script:
        "../workflow/scripts/train_hybrid_maxpool.py"


rule tabulate_bifurcation_volume:
    input:
        maxpool_volume_files,
    output:
        table=paths.table_file("bifurcation_volume"),
        html=report(
            paths.table_html("bifurcation_volume"),
            caption="../workflow/report/bifurcation_volume_table.rst",
            category="MaxPool study",
            labels={"kind": "table", "name": "bifurcation_volume"},
        ),
    log:
        "logs/tabulate_bifurcation_volume/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        study=maxpool_spec,
    script:
        "../workflow/scripts/tabulate_bifurcation_volume.py"


rule plot_backprop_variation:
    input:
        maxpool_variation_files,
    output:
        pdf=paths.figure_file("backprop_variation"),
        png=report(
            paths.figure_png("backprop_variation"),
            caption="../workflow/report/backprop_variation.rst",
            category="MaxPool study",
            labels={"kind": "figure", "name": "backprop_variation"},
        ),
    log:
        "logs/plot_backprop_variation/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        command="plot-backprop-variation",
    script:
        "../workflow/scripts/plot_with_cli.py"


rule plot_bifurcation_volume:
    input:
        rules.tabulate_bifurcation_volume.output.table,
    output:
        pdf=paths.figure_file("bifurcation_volume"),
        png=report(
            paths.figure_png("bifurcation_volume"),
            caption="../workflow/report/bifurcation_volume.rst",
            category="MaxPool study",
            labels={"kind": "figure", "name": "bifurcation_volume"},
        ),
    log:
        "logs/plot_bifurcation_volume/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        command="plot-bifurcation-volume",
    script:
        "../workflow/scripts/plot_with_cli.py"


rule plot_maxpool_training:
    input:
        maxpool_training_files,
    output:
        pdf=paths.figure_file("maxpool_training"),
        png=report(
            paths.figure_png("maxpool_training"),
            caption="../workflow/report/maxpool_training.rst",
            category="MaxPool study",
            labels={"kind": "figure", "name": "maxpool_training"},
        ),
    log:
        "logs/plot_maxpool_training/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        command="plot-maxpool-training",
    script:
        "../workflow/scripts/plot_with_cli.py"
