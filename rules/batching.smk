# The rules of the batching study; its helpers are in batching_common.smk.


include: "batching_common.smk"


rule run_batching:
    input:
        unpack(inference_export_inputs),
        model=batching_model_file,
        dataset=batching_dataset_file,
    output:
        batching_paths.batching_run_file(),
    log:
        "logs/run_batching/{model}/{device}.log",
    benchmark:
        "results/benchmarks/run_batching/{model}/{device}.tsv"
    wildcard_constraints:
        model=BATCHING_MODEL or "(?!)",
        device=_choice(BATCHING_DEVICES),
    conda:
        "../envs/bitdrift.yaml"
    threads: device_threads
    resources:
        **INFERENCE_RESOURCES,
    params:
        arguments=batching_arguments,
    script:
        "../workflow/scripts/run_batching.py"


rule batching_tables:
    input:
        runs=batching_run_files(),
        model=batching_model_file(),
    output:
        layers=paths.table_file(batching_paths.BATCHING_TABLES["layers"]),
        layers_html=report(
            paths.table_html(batching_paths.BATCHING_TABLES["layers"]),
            caption="../workflow/report/batching_layers_table.rst",
            category="Batch invariance",
            labels={"kind": "table", "name": "batching_layers"},
        ),
        decoding=paths.table_file(batching_paths.BATCHING_TABLES["decoding"]),
        decoding_html=report(
            paths.table_html(batching_paths.BATCHING_TABLES["decoding"]),
            caption="../workflow/report/batching_decoding_table.rst",
            category="Batch invariance",
            labels={"kind": "table", "name": "batching_decoding"},
        ),
        summary=paths.table_file(batching_paths.BATCHING_TABLES["summary"]),
        summary_html=report(
            paths.table_html(batching_paths.BATCHING_TABLES["summary"]),
            caption="../workflow/report/batching_summary_table.rst",
            category="Batch invariance",
            labels={"kind": "table", "name": "batching_summary"},
        ),
        figure=paths.figure_file("batching"),
        png=report(
            paths.figure_png("batching"),
            caption="../workflow/report/batching_figure.rst",
            category="Batch invariance",
            labels={"kind": "figure", "name": "batching"},
        ),
    log:
        "logs/batching_tables/all.log",
    benchmark:
        "results/benchmarks/batching_tables/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    script:
        "../workflow/scripts/batching_tables.py"


# Not part of `all`: every device runs every batch setting and decodes in each.
rule batching:
    input:
        batching_targets(),
    localrule: True
