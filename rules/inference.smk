rule export_reference:
    input:
        model=inference_model_file,
        dataset=model_dataset_file,
    output:
        paths.export_reference_file(),
    log:
        "logs/export_reference/{model}.log",
    benchmark:
        "results/benchmarks/export_reference/{model}.tsv"
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/write_export_reference.py"


rule install_aarch64:
    output:
        paths.aarch64_userland_file(),
    log:
        "logs/install_aarch64.log",
    # The userland emulated Arm devices run in (QEMU 10, Debian's arm64 python, aarch64
    # wheels), built once into the environment; its manifest is the output. Downloads run
    # where the internet is: compute nodes often have none.
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        runtimes=PLAN.aarch64_runtimes(),
    script:
        "../workflow/scripts/install_aarch64.py"


rule export_model:
    input:
        model=inference_model_file,
    output:
        export=paths.export_file(),
        deployed=paths.deployed_export_file(),
    log:
        "logs/export_model/{model}/{format}.log",
    benchmark:
        "results/benchmarks/export_model/{model}/{format}.tsv"
    wildcard_constraints:
        format=_choice(EXPORT_FORMATS),
    conda:
        "../envs/bitdrift.yaml"
    script:
        "../workflow/scripts/export_model.py"


rule run_inference:
    input:
        unpack(inference_export_inputs),
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
        samples=model_samples,
        layers=config["analysis"]["layers"],
        kernels=config["analysis"]["kernels"],
        replay=replay_settings(config),
        full_samples=config["analysis"].get("full_samples"),
        layer_select=config["analysis"].get("layer_select"),
        traced_samples=config["analysis"]["traced_samples"],
        quantization=model_quantization,
    script:
        "../workflow/scripts/run_inference.py"


rule example_model:
    output:
        # the model's format is its example's (an ONNX graph, a torch.export program, a
        # Keras archive)
        model=paths.example_model_file(),
        inputs=paths.example_inputs_file(),
    log:
        "logs/example_model/{example}.{suffix}.log",
    # bitdrift's example models (bitdrift.inputs.examples), built here: no download
    wildcard_constraints:
        example=_choice(EXAMPLES),
        suffix="onnx|pt2|keras",
    conda:
        "../envs/bitdrift.yaml"
    params:
        # the samples and whole batches of every device after them
        samples=PLAN.example_samples(),
    script:
        "../workflow/scripts/write_example_model.py"


rule quantize_model:
    input:
        unpack(float_model_files),
    output:
        paths.quantized_model_file(),
    log:
        "logs/quantize_model/{model}.{suffix}.log",
    benchmark:
        "results/benchmarks/quantize_model/{model}.{suffix}.tsv"
    # the quantizer config key models.{model}.quantize.tool names
    # (bitdrift.backends.quantizers), its file's suffix its own
    wildcard_constraints:
        model=_choice(QUANTIZED_MODELS),
        suffix=_choice(QUANTIZED_SUFFIXES),
    conda:
        "../envs/bitdrift.yaml"
    params:
        settings=quantization_settings,
    script:
        "../workflow/scripts/quantize_model.py"
