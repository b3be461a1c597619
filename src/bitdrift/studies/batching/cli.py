"""``bitdrift batching`` (one device's run) and ``bitdrift batching-tables``."""

from __future__ import annotations

import sys

from bitdrift.errors import ConfigError


def run_arguments(config: dict, device_name: str) -> dict:
    """The keyword arguments of runs.run_device for a validated config's `batching`
    section and one of its devices (the workflow's model, dataset and exports)."""
    from bitdrift import paths
    from bitdrift.backends.keras.export import command_inputs
    from bitdrift.studies.batching.config import prompt_tokens, studied_model
    from bitdrift.studies.batching.paths import batching_run_file

    section = config.get("batching")
    if not section:
        raise ConfigError("the config has no `batching` section")
    if device_name not in section["devices"]:
        raise ConfigError(f"device {device_name!r} is not one of batching.devices "
                          f"{section['devices']}")
    model_name, model = studied_model(config)
    config = {**config, "models": {**config["models"], model_name: model}}
    device = config["devices"][device_name]
    inputs = command_inputs(model_name, device["backend"])
    return {"model_name": model_name, "device_name": device_name, "device": device,
            "model_path": paths.model_file(config, model_name),
            "dataset_path": paths.dataset_file(model["dataset"]),
            "inputs": section["inputs"], "batch_sizes": section["batch_sizes"],
            "positions": section["positions"], "neighbour_sets": section["neighbour_sets"],
            "padded_length": section["padded_length"] or None,
            "prompts": prompt_tokens(config), "tokens": section["decoding"]["tokens"],
            "reference": inputs.get("reference"), "export": inputs.get("export"),
            "out": batching_run_file(model_name, device_name)}


def cmd_batching(args) -> None:
    """Run the batch-invariance study on one device of the config's `batching` section."""
    from bitdrift.config import load_config
    from bitdrift.studies.batching.runs import run_device

    arguments = run_arguments(load_config(args.config), args.device)
    if args.out:
        arguments["out"] = args.out
    run_device(**arguments, log=sys.stderr)
    print(f"bitdrift: wrote {arguments['out']}", file=sys.stderr)


def cmd_batching_tables(args) -> None:
    """Tables (layers x settings verdicts, decoding, summary) and the figure."""
    from pathlib import Path

    from bitdrift.inputs.datasets import GRAMMAR_VOCABULARY
    from bitdrift.studies.batching.analysis import write_batching
    from bitdrift.studies.batching.paths import BATCHING_TABLES

    tables = {key: Path(args.out_dir) / f"{name}.csv" for key, name in BATCHING_TABLES.items()}
    write_batching(args.runs, args.model_file, tables, args.figure, GRAMMAR_VOCABULARY)


def add_commands(sub) -> None:
    p = sub.add_parser("batching", help="one device's batch-invariance run (the config's "
                       "`batching` section)", description=cmd_batching.__doc__)
    p.add_argument("--config", required=True, help="config file with a `batching` section")
    p.add_argument("--device", required=True, help="a device of batching.devices")
    p.add_argument("--out", help="run file (default results/batching/MODEL/DEVICE.json)")
    p.set_defaults(func=cmd_batching)
    p = sub.add_parser("batching-tables", help="batch-invariance tables and figure from the "
                       "devices' run files", description=cmd_batching_tables.__doc__)
    p.add_argument("runs", nargs="+", help="run files of `bitdrift batching`")
    p.add_argument("--model-file", required=True, help="the studied model (.keras)")
    p.add_argument("--out-dir", required=True, help="folder of the tables")
    p.add_argument("--figure", required=True, help="figure (PDF, and PNG beside it)")
    p.set_defaults(func=cmd_batching_tables)
