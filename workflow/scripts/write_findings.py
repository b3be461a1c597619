from bitdrift.jobs import workflow_job

with workflow_job(snakemake.log[0]):
    from bitdrift.commands.tables import write_findings_of_run
    from bitdrift.studies import findings_sections

    # the studies' own sections, from their registry: the core's findings know no study
    write_findings_of_run(
        list(snakemake.input.records),
        # the tables this run made, by their input names: never a table an earlier run
        # left in the folder
        {name: path for name, path in snakemake.input.items() if str(path).endswith(".csv")},
        snakemake.output.markdown,
        rst_out=snakemake.output.rst,
        figure=snakemake.input.eqc_figure,
        study_sections=findings_sections(),
        planned=snakemake.params.planned,
    )
