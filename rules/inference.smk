rule run_inference:
    input:
        model=inference_model_file,
        dataset=model_dataset_file,
    output:
        paths.record_file(),
    log:
        "logs/run_inference/{model}/{device}.log",
    benchmark:
        "results/benchmarks/run_inference/{model}/{device}.tsv"
    wildcard_constraints:
        # External devices are measured off-cluster with `bitdrift infer`; never scheduled.
        device=_choice(SCHEDULED_DEVICES),
    conda:
        "../envs/bitdrift.yaml"
    threads: device_threads
    resources:
        # Partition, GRES, constraint, runtime, memory: the device's config entry.
        **INFERENCE_RESOURCES,
    params:
        device=device_spec,
        samples=config["samples"],
        layers=config["analysis"]["layers"],
    script:
        "../workflow/scripts/run_inference.py"
