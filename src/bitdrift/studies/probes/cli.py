"""``bitdrift probe`` (search), ``bitdrift probe-set`` (the evaluation file) and
``bitdrift probe-evaluate`` (tables and figure on the held-out devices)."""

from __future__ import annotations

import sys

from bitdrift.errors import ConfigError


def search_arguments(config: dict, model_path: str | None = None,
                     dataset_path: str | None = None) -> dict:
    """The keyword arguments of search_probes for a validated config's `probes` section
    (the workflow's model and dataset files unless given)."""
    from bitdrift import paths
    from bitdrift.backends.keras.export import command_inputs

    section = config.get("probes")
    if not section:
        raise ConfigError("the config has no `probes` section")
    model = section["model"]
    devices = {name: config["devices"][name] for name in section["search_devices"]}
    return {
        "model_name": model, "devices": devices,
        "model_path": model_path or paths.model_file(config, model),
        "dataset_path": dataset_path or paths.dataset_file(config["models"][model]["dataset"]),
        "inputs": {name: command_inputs(model, device["backend"])
                   for name, device in devices.items()},
        "probes": section["probes"], "seed": section["seed"],
        "generations": section["generations"], "population": section["population"],
        "pool": section.get("natural_pool"), "noise": section["noise"],
    }


def cmd_probe(args) -> None:
    """Search probes on the config's search devices only and write the probe file."""
    from bitdrift.config import load_config
    from bitdrift.studies.probes import paths as probe_paths
    from bitdrift.studies.probes.search import search_probes

    config = load_config(args.config)
    arguments = search_arguments(config, args.model_file, args.dataset_file)
    out = args.out or probe_paths.probe_file(arguments["model_name"])
    provenance = search_probes(**arguments, out=out, log=sys.stderr)
    print(f"bitdrift: wrote {out}: {len(provenance['scores'])} probes, classes on the "
          f"{len(provenance['devices'])} search devices {provenance['scores']}",
          file=sys.stderr)


def cmd_probe_set(args) -> None:
    """The evaluation file: the probes, then the natural test samples."""
    from bitdrift.studies.probes.evaluation import write_evaluation_set

    write_evaluation_set(args.probes, args.dataset, args.out, args.natural_pool)


def cmd_probe_evaluate(args) -> None:
    """Classes per input and identify on the held-out devices; the figure."""
    from pathlib import Path

    from bitdrift.studies.probes import paths as probe_paths
    from bitdrift.studies.probes.evaluation import evaluate_probes

    out = {key: str(Path(args.out_dir) / f"{name}.csv")
           for key, name in probe_paths.PROBE_TABLES.items()}
    out["figure"] = args.figure
    tables = evaluate_probes(args.probes, args.evaluation, args.records, out)
    for row in tables["summary"]:
        print(f"{row['measure']}: {row['classes']}", file=sys.stderr)


def add_commands(sub) -> None:
    """Register the probe study's subcommands on the `bitdrift` subparsers."""
    p = sub.add_parser("probe", help="search inputs that split the search devices into the "
                       "most bitwise classes (the config's `probes` section)",
                       description=cmd_probe.__doc__)
    p.add_argument("--config", required=True, help="config file with a `probes` section")
    p.add_argument("--model-file", help="model (default: the workflow's trained model)")
    p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.add_argument("--out", help="probe file (default results/probes/MODEL/probes.h5)")
    p.set_defaults(func=cmd_probe, writes_data=True)
    p = sub.add_parser("probe-set", help="the probes then the natural test samples, as one "
                       "dataset file every device runs", description=cmd_probe_set.__doc__)
    p.add_argument("probes", help="probe file")
    p.add_argument("--dataset", required=True, help="the model's dataset HDF5")
    p.add_argument("--natural-pool", type=int, help="the first N test samples (default all)")
    p.add_argument("--out", required=True, help="evaluation file (HDF5)")
    p.set_defaults(func=cmd_probe_set, writes_data=True)
    p = sub.add_parser("probe-evaluate", help="classes per input and identify with 1-3 inputs "
                       "on the held-out devices; the probes figure",
                       description=cmd_probe_evaluate.__doc__)
    p.add_argument("records", nargs="+", help="every device's record of the evaluation file")
    p.add_argument("--probes", required=True, help="probe file")
    p.add_argument("--evaluation", required=True, help="evaluation file (bitdrift probe-set)")
    p.add_argument("--out-dir", required=True, help="folder of the tables")
    p.add_argument("--figure", required=True, help="figure (PDF, and PNG beside it)")
    p.set_defaults(func=cmd_probe_evaluate)
