"""The studies built on bitdrift's core, each a sub-package of its own.

A study uses the core (records, datasets, models, devices, training); the core never
imports a study. Each study package has ``cli.add_commands(subparsers)`` for its
``bitdrift`` subcommands and ``config.check(config)`` for the references its config
section makes (the schema checks the shapes).
"""

STUDIES = ("ablation", "batching", "maxpool", "probes", "variance")
