from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.report.figures.quantization import plot_quantization_error_file

    plot_quantization_error_file(snakemake.input.table, snakemake.output.pdf)
