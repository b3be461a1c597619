rule prepare_dataset:
    input:
        dataset_source_files,
    output:
        paths.dataset_file(),
    log:
        "logs/prepare_dataset/{dataset}.log",
    benchmark:
        "results/benchmarks/prepare_dataset/{dataset}.tsv"
    # Downloads run where the internet is: compute nodes often have none.
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        spec=dataset_spec,
        # Checked as soon as the test set is known, not after training.
        samples=dataset_samples,
    script:
        "../workflow/scripts/prepare_dataset.py"
