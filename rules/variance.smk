rule train_variance_run:
    input:
        dataset=variance_dataset_file,
    output:
        model="results/training/{plan}/{arm}/{device}/run_{run}/model.keras",
        history="results/training/{plan}/{arm}/{device}/run_{run}/history.csv",
        run="results/training/{plan}/{arm}/{device}/run_{run}/run.h5",
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


rule training_statistics:
    input:
        variance_run_files,
    output:
        summary=report(
            "results/tables/training_variance.csv",
            caption="../workflow/report/training_variance_table.rst",
            category="Training variance",
        ),
        runs=report(
            "results/tables/training_runs.csv",
            caption="../workflow/report/training_runs_table.rst",
            category="Training variance",
        ),
        subgroups=report(
            "results/tables/training_subgroups.csv",
            caption="../workflow/report/training_subgroups_table.rst",
            category="Training variance",
        ),
        seed_ratio=report(
            "results/tables/seed_ratio.csv",
            caption="../workflow/report/seed_ratio_table.rst",
            category="Training variance",
        ),
        determinism_cost=report(
            "results/tables/determinism_cost.csv",
            caption="../workflow/report/determinism_cost_table.rst",
            category="Training variance",
        ),
    log:
        "logs/training_statistics/all.log",
    benchmark:
        "results/benchmarks/training_statistics/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    script:
        "../workflow/scripts/training_statistics.py"


rule plot_training_variance:
    input:
        "results/tables/training_variance.csv",
        "results/tables/seed_ratio.csv",
    output:
        report(
            "results/figures/training_variance.pdf",
            caption="../workflow/report/training_variance_figure.rst",
            category="Training variance",
        ),
    log:
        "logs/plot_training_variance/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/plot_training.py"


rule plot_churn:
    input:
        "results/tables/training_variance.csv",
    output:
        report(
            "results/figures/churn.pdf",
            caption="../workflow/report/churn_figure.rst",
            category="Training variance",
        ),
    log:
        "logs/plot_churn/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/plot_training.py"


rule plot_determinism_cost:
    input:
        "results/tables/determinism_cost.csv",
    output:
        report(
            "results/figures/determinism_cost.pdf",
            caption="../workflow/report/determinism_cost_figure.rst",
            category="Training variance",
        ),
    log:
        "logs/plot_determinism_cost/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/plot_training.py"


rule plot_ensemble_disagreement:
    input:
        "results/tables/training_variance.csv",
    output:
        report(
            "results/figures/ensemble_disagreement.pdf",
            caption="../workflow/report/ensemble_disagreement_figure.rst",
            category="Training variance",
        ),
    log:
        "logs/plot_ensemble_disagreement/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/plot_training.py"
