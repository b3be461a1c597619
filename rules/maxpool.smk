rule maxpool_zero_program:
    output:
        report(
            "results/tables/maxpool_zero_program.csv",
            caption="../workflow/report/maxpool_zero_program.rst",
            category="MaxPool study",
        ),
    log:
        "logs/maxpool_zero_program/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/maxpool.py"


rule maxpool_backprop_variation:
    input:
        dataset=maxpool_dataset_file,
    output:
        "results/maxpool/variation/{precision}.csv",
    log:
        "logs/maxpool_backprop_variation/{precision}.log",
    benchmark:
        "results/benchmarks/maxpool_backprop_variation/{precision}.tsv"
    wildcard_constraints:
        precision="16|32|64",
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **MAXPOOL_RESOURCES,
    params:
        study=maxpool_spec,
    script:
        "../workflow/scripts/maxpool.py"


rule maxpool_bifurcation_volume:
    input:
        dataset=maxpool_dataset_file,
    output:
        "results/maxpool/volume/{setting}.csv",
    log:
        "logs/maxpool_bifurcation_volume/{setting}.log",
    benchmark:
        "results/benchmarks/maxpool_bifurcation_volume/{setting}.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **MAXPOOL_RESOURCES,
    params:
        study=maxpool_spec,
    script:
        "../workflow/scripts/maxpool.py"


rule maxpool_train:
    input:
        dataset=maxpool_dataset_file,
    output:
        "results/maxpool/training/beta_{beta}/seed_{seed}.csv",
    log:
        "logs/maxpool_train/beta_{beta}/seed_{seed}.log",
    benchmark:
        "results/benchmarks/maxpool_train/beta_{beta}/seed_{seed}.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **MAXPOOL_RESOURCES,
    params:
        study=maxpool_spec,
    script:
        "../workflow/scripts/maxpool.py"


rule tabulate_bifurcation_volume:
    input:
        maxpool_volume_files,
    output:
        report(
            "results/tables/bifurcation_volume.csv",
            caption="../workflow/report/bifurcation_volume_table.rst",
            category="MaxPool study",
        ),
    log:
        "logs/tabulate_bifurcation_volume/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        study=maxpool_spec,
    script:
        "../workflow/scripts/maxpool.py"


rule plot_backprop_variation:
    input:
        maxpool_variation_files,
    output:
        report(
            "results/figures/backprop_variation.pdf",
            caption="../workflow/report/backprop_variation.rst",
            category="MaxPool study",
        ),
    log:
        "logs/plot_backprop_variation/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/maxpool.py"


rule plot_bifurcation_volume:
    input:
        "results/tables/bifurcation_volume.csv",
    output:
        report(
            "results/figures/bifurcation_volume.pdf",
            caption="../workflow/report/bifurcation_volume.rst",
            category="MaxPool study",
        ),
    log:
        "logs/plot_bifurcation_volume/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/maxpool.py"


rule plot_maxpool_training:
    input:
        maxpool_training_files,
    output:
        report(
            "results/figures/maxpool_training.pdf",
            caption="../workflow/report/maxpool_training.rst",
            category="MaxPool study",
        ),
    log:
        "logs/plot_maxpool_training/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/maxpool.py"
