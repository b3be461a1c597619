"""The studies built on bitdrift's core, each a sub-package of its own.

A study uses the core (records, datasets, models, devices, training); the core never
imports a study. Each study package has ``cli.add_commands(subparsers)`` for its
``bitdrift`` subcommands, ``config.check(config)`` for the references its config section
makes (the schema checks the shapes), optionally ``config.models(config)`` for the models
it adds to the workflow's, optionally ``findings.SECTION`` for its own section of the
findings (bitdrift.report.findings.StudySection: its title, the tables it reads, its
sentences), and ``paths`` for its files. Its rules, targets and input functions are in
``rules/<study>.smk``. A new study touches, outside its own files, only this registry, the
Snakefile's include, the schema and config.yaml.
"""

import importlib
import importlib.util

STUDIES = ("ablation", "batching", "maxpool", "probes", "variance")


def study_models(config: dict) -> dict[str, dict]:
    """{model name: spec} of the models the studies add to the workflow's (trained,
    exported and run by the core's rules, never part of the core's tables)."""
    models = {}
    for study in STUDIES:
        module = importlib.import_module(f"bitdrift.studies.{study}.config")
        if hasattr(module, "models"):
            models.update(module.models(config))
    return models


def findings_sections() -> list:
    """The studies' own sections of the findings (bitdrift.report.findings.StudySection),
    in their place: what the writer of the findings (the `findings` command, the workflow's
    write_findings job) passes the core, which knows no study."""
    sections = []
    for study in STUDIES:
        if importlib.util.find_spec(f"bitdrift.studies.{study}.findings") is not None:
            sections.append(importlib.import_module(f"bitdrift.studies.{study}.findings")
                            .SECTION)
    return sorted(sections, key=lambda section: section.place)
