rule train_model:
    input:
        dataset=model_dataset_file,
    output:
        model=protected("results/models/{model}/seed_{seed}/model.keras"),
        history="results/models/{model}/seed_{seed}/history.csv",
        logits="results/models/{model}/seed_{seed}/test_logits.h5",
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
