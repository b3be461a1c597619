# The rules of the variance study; its helpers are in variance_common.smk.


include: "variance_common.smk"


rule train_variance_run:
    input:
        dataset=variance_dataset_file,
    output:
        model=variance_paths.run_file("model"),
        history=variance_paths.run_file("history"),
        run=variance_paths.run_file("run"),
    log:
        "logs/train_variance_run/{plan}/{arm}/{device}/run_{run}.log",
    benchmark:
        "results/benchmarks/train_variance_run/{plan}/{arm}/{device}/run_{run}.tsv"
    wildcard_constraints:
        device=_choice(VARIANCE_DEVICES),
    conda:
        "../envs/bitdrift.yaml"
    threads: device_threads
    resources:
        # The device's partition/GRES/constraint, then the plan's own (runtime, memory).
        **VARIANCE_RESOURCES,
    params:
        plan=variance_run_plan,
        device=device_spec,
    script:
        "../workflow/scripts/train_variance_run.py"


rule compute_training_statistics:
    input:
        variance_run_files,
    output:
        summary=paths.table_file("training_variance"),
        summary_html=report(
            paths.table_html("training_variance"),
            caption="../workflow/report/training_variance_table.rst",
            category="Training variance",
            labels={"kind": "table", "name": "training_variance"},
        ),
        runs=paths.table_file("training_runs"),
        runs_html=report(
            paths.table_html("training_runs"),
            caption="../workflow/report/training_runs_table.rst",
            category="Training variance",
            labels={"kind": "table", "name": "training_runs"},
        ),
        subgroups=paths.table_file("training_subgroups"),
        subgroups_html=report(
            paths.table_html("training_subgroups"),
            caption="../workflow/report/training_subgroups_table.rst",
            category="Training variance",
            labels={"kind": "table", "name": "training_subgroups"},
        ),
        seed_ratio=paths.table_file("seed_ratio"),
        seed_ratio_html=report(
            paths.table_html("seed_ratio"),
            caption="../workflow/report/seed_ratio_table.rst",
            category="Training variance",
            labels={"kind": "table", "name": "seed_ratio"},
        ),
        determinism_cost=paths.table_file("determinism_cost"),
        determinism_cost_html=report(
            paths.table_html("determinism_cost"),
            caption="../workflow/report/determinism_cost_table.rst",
            category="Training variance",
            labels={"kind": "table", "name": "determinism_cost"},
        ),
    log:
        "logs/compute_training_statistics/all.log",
    benchmark:
        "results/benchmarks/compute_training_statistics/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    script:
        "../workflow/scripts/compute_training_statistics.py"


rule plot_training_variance:
    input:
        rules.compute_training_statistics.output.summary,
        rules.compute_training_statistics.output.seed_ratio,
    output:
        pdf=paths.figure_file("training_variance"),
        png=report(
            paths.figure_png("training_variance"),
            caption="../workflow/report/training_variance_figure.rst",
            category="Training variance",
            labels={"kind": "figure", "name": "training_variance"},
        ),
    log:
        "logs/plot_training_variance/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        command="plot-training-variance",
    script:
        "../workflow/scripts/plot_with_cli.py"


rule plot_churn:
    input:
        rules.compute_training_statistics.output.summary,
    output:
        pdf=paths.figure_file("churn"),
        png=report(
            paths.figure_png("churn"),
            caption="../workflow/report/churn_figure.rst",
            category="Training variance",
            labels={"kind": "figure", "name": "churn"},
        ),
    log:
        "logs/plot_churn/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        command="plot-churn",
    script:
        "../workflow/scripts/plot_with_cli.py"


rule plot_determinism_cost:
    input:
        rules.compute_training_statistics.output.determinism_cost,
    output:
        pdf=paths.figure_file("determinism_cost"),
        png=report(
            paths.figure_png("determinism_cost"),
            caption="../workflow/report/determinism_cost_figure.rst",
            category="Training variance",
            labels={"kind": "figure", "name": "determinism_cost"},
        ),
    log:
        "logs/plot_determinism_cost/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        command="plot-determinism-cost",
    script:
        "../workflow/scripts/plot_with_cli.py"


rule plot_ensemble_disagreement:
    input:
        rules.compute_training_statistics.output.summary,
    output:
        pdf=paths.figure_file("ensemble_disagreement"),
        png=report(
            paths.figure_png("ensemble_disagreement"),
            caption="../workflow/report/ensemble_disagreement_figure.rst",
            category="Training variance",
            labels={"kind": "figure", "name": "ensemble_disagreement"},
        ),
    log:
        "logs/plot_ensemble_disagreement/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        command="plot-ensemble-disagreement",
    script:
        "../workflow/scripts/plot_with_cli.py"


rule compute_example_divergence:
    input:
        variance_run_files,
    output:
        examples=paths.table_file("example_divergence"),
        examples_html=report(
            paths.table_html("example_divergence"),
            caption="../workflow/report/example_divergence_table.rst",
            category="Training variance",
            labels={"kind": "table", "name": "example_divergence"},
        ),
        overlap=paths.table_file("divergence_overlap"),
        overlap_html=report(
            paths.table_html("divergence_overlap"),
            caption="../workflow/report/divergence_overlap_table.rst",
            category="Training variance",
            labels={"kind": "table", "name": "divergence_overlap"},
        ),
        groups=paths.table_file("divergence_groups"),
        groups_html=report(
            paths.table_html("divergence_groups"),
            caption="../workflow/report/divergence_groups_table.rst",
            category="Training variance",
            labels={"kind": "table", "name": "divergence_groups"},
        ),
        subset=paths.table_file("divergent_subset_accuracy"),
        subset_html=report(
            paths.table_html("divergent_subset_accuracy"),
            caption="../workflow/report/divergent_subset_accuracy_table.rst",
            category="Training variance",
            labels={"kind": "table", "name": "divergent_subset_accuracy"},
        ),
    log:
        "logs/compute_example_divergence/all.log",
    benchmark:
        "results/benchmarks/compute_example_divergence/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    params:
        top_k=GALLERY_TOP_K,
    script:
        "../workflow/scripts/compute_example_divergence.py"


rule plot_divergent_examples:
    input:
        table=rules.compute_example_divergence.output.examples,
        dataset=gallery_dataset_file,
    output:
        pdf=paths.figure_file("divergent_examples"),
        png=report(
            paths.figure_png("divergent_examples"),
            caption="../workflow/report/divergent_examples_figure.rst",
            category="Training variance",
            labels={"kind": "figure", "name": "divergent_examples"},
        ),
    log:
        "logs/plot_divergent_examples/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        plan=GALLERY_PLAN,
        arm=GALLERY_ARM,
        top_k=GALLERY_TOP_K,
    script:
        "../workflow/scripts/plot_divergent_examples.py"
