# The rules of the probes study; its helpers are in probes_common.smk.


include: "probes_common.smk"


rule search_probes:
    input:
        unpack(probe_search_inputs),
        model=probe_model_file,
        dataset=probe_dataset_file,
    output:
        probe_paths.probe_file(),
    log:
        "logs/search_probes/{model}.log",
    benchmark:
        "results/benchmarks/search_probes/{model}.tsv"
    wildcard_constraints:
        model=PROBE_MODEL or "(?!)",
    conda:
        "../envs/bitdrift.yaml"
    # The search devices run one after another in this job, each with its own threads.
    threads: probe_search_threads
    resources:
        **PROBE_SEARCH_RESOURCES,
    params:
        section=probe_section,
        devices=probe_search_devices,
    script:
        "../workflow/scripts/search_probes.py"


rule probe_evaluation_set:
    input:
        probes=probe_paths.probe_file(),
        dataset=probe_dataset_file,
    output:
        probe_paths.probe_evaluation_file(),
    log:
        "logs/probe_evaluation_set/{model}.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        natural_pool=lambda wildcards: PROBES.get("natural_pool"),
    script:
        "../workflow/scripts/write_probe_evaluation_set.py"


rule run_probe_inference:
    input:
        unpack(inference_export_inputs),
        model=probe_model_file,
        dataset=probe_paths.probe_evaluation_file(),
    output:
        probe_paths.probe_record_file(),
    log:
        "logs/run_probe_inference/{model}/{device}.log",
    benchmark:
        "results/benchmarks/run_probe_inference/{model}/{device}.tsv"
    wildcard_constraints:
        model=PROBE_MODEL or "(?!)",
        device=_choice(PROBE_DEVICES),
    conda:
        "../envs/bitdrift.yaml"
    threads: device_threads
    resources:
        **INFERENCE_RESOURCES,
    params:
        device=device_spec,
    script:
        "../workflow/scripts/run_probe_inference.py"


rule evaluate_probes:
    input:
        unpack(probe_evaluation_inputs),
    output:
        classes=paths.table_file(probe_paths.PROBE_TABLES["classes"]),
        classes_html=report(
            paths.table_html(probe_paths.PROBE_TABLES["classes"]),
            caption="../workflow/report/probe_classes_table.rst",
            category="Forensic probes",
            labels={"kind": "table", "name": "probe_classes"},
        ),
        summary=paths.table_file(probe_paths.PROBE_TABLES["summary"]),
        summary_html=report(
            paths.table_html(probe_paths.PROBE_TABLES["summary"]),
            caption="../workflow/report/probe_summary_table.rst",
            category="Forensic probes",
            labels={"kind": "table", "name": "probe_summary"},
        ),
        identify=paths.table_file(probe_paths.PROBE_TABLES["identify"]),
        identify_html=report(
            paths.table_html(probe_paths.PROBE_TABLES["identify"]),
            caption="../workflow/report/probe_identify_table.rst",
            category="Forensic probes",
            labels={"kind": "table", "name": "probe_identify"},
        ),
        figure=paths.figure_file("probes"),
        png=report(
            paths.figure_png("probes"),
            caption="../workflow/report/probes_figure.rst",
            category="Forensic probes",
            labels={"kind": "figure", "name": "probes"},
        ),
    log:
        "logs/evaluate_probes/all.log",
    benchmark:
        "results/benchmarks/evaluate_probes/all.tsv"
    conda:
        "../envs/bitdrift.yaml"
    resources:
        **ANALYSIS_RESOURCES,
    script:
        "../workflow/scripts/evaluate_probes.py"


# Not part of `all`: the search runs every search device once per generation.
rule probes:
    input:
        probe_targets(),
    localrule: True
