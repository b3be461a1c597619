rule train_model:
    input:
        dataset=model_dataset_file,
    output:
        model=protected(paths.trained_model_file()),
        history=paths.training_history_file(),
        logits=paths.test_logits_file(),
    log:
        "logs/train_model/{model}/seed_{seed}.log",
    benchmark:
        "results/benchmarks/train_model/{model}/seed_{seed}.tsv"
    conda:
        "../envs/bitdrift.yaml"
    threads: 2
    resources:
        **TRAINING_RESOURCES,
    params:
        spec=model_spec,
    script:
        "../workflow/scripts/train_model.py"
