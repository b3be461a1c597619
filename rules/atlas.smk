rule compare_with_atlas:
    input:
        records=atlas_record_files,
        entries=atlas_entry_files,
    output:
        table=paths.table_file("atlas"),
        html=report(
            paths.table_html("atlas"),
            caption="../workflow/report/atlas_table.rst",
            category="This machine among the machines measured",
            labels={"kind": "table", "name": "atlas"},
        ),
        refused=paths.table_file("atlas_refused"),
        pdf=paths.figure_file("atlas"),
        png=report(
            paths.figure_png("atlas"),
            caption="../workflow/report/atlas_figure.rst",
            category="This machine among the machines measured",
            labels={"kind": "figure", "name": "atlas"},
        ),
    log:
        "logs/compare_with_atlas/all.log",
    localrule: True
    conda:
        "../envs/bitdrift.yaml"
    params:
        atlas=ATLAS_FOLDER,
    script:
        "../workflow/scripts/compare_with_atlas.py"
