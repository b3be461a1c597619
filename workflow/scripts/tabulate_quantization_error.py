from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.analysis.quantization_error import write_quantization_error_table

    write_quantization_error_table(
        [tuple(pair) for pair in snakemake.params.pairs], snakemake.output.table
    )
