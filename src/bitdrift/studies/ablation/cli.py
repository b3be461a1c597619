"""``bitdrift ablation-tables`` and the ablation figures."""

from __future__ import annotations

import sys

from bitdrift.errors import ConfigError

# Table name (results/tables/NAME.csv) per key of `ablation_tables`.
ABLATION_TABLES = {"layers": "ablation_layers", "activation": "activation_deviations",
                   "effects": "layer_effects", "accuracy": "validation_accuracy",
                   "casting": "precision_casting",
                   "across_frameworks": "activation_deviations_across_frameworks"}


def ablation_inputs(config: dict) -> dict:
    """The files the ablation tables read, from the path registry: per variant model its
    records on the ablation devices (and on the cross-framework devices) and its test
    logits; per base model its records on the precision-casting devices."""
    from bitdrift import paths
    from bitdrift.paths import inference_seed
    from bitdrift.studies.ablation.config import variant_models, variants_of

    section = config["ablation"]
    models = {**config["models"], **variant_models(config)}
    entries = variants_of(config)
    return {
        "variants": entries,
        "records": {entry["model"]: [paths.record_file(entry["model"], device)
                                     for device in section["devices"]] for entry in entries},
        "cross_framework": {entry["model"]: [paths.record_file(entry["model"], device)
                                             for device in section.get("cross_framework", [])]
                            for entry in entries},
        "logits": {entry["model"]: paths.test_logits_file(
            entry["model"], inference_seed(models[entry["model"]])) for entry in entries},
        "casting": {base: [paths.record_file(base, device)
                           for device in casting_devices(config)]
                    for base in section["models"]},
    }


def casting_devices(config: dict) -> list[str]:
    """Every device that has a twin in another precision (the same entry but for
    `precision`, as a device matrix makes them), config order: Figure 6 compares the
    precisions on the same machines."""
    devices = config["devices"]

    def setting(name):
        return {key: value for key, value in devices[name].items() if key != "precision"}

    return [name for name in devices
            if any(other != name and setting(name) == setting(other) for other in devices)]


def ablation_tables(config: dict) -> dict:
    """Every table of the ablation study for a validated config with an `ablation`
    section, from the workflow's files."""
    import pandas as pd

    from bitdrift.record.reader import open_records
    from bitdrift.studies.ablation import tables

    config = in_config_order(config)
    inputs = ablation_inputs(config)
    precision = config["analysis"]["precision"]
    layers = _variant_layers(inputs["variants"], inputs["records"], precision)
    across = tables.activation_deviations(_variant_layers(
        inputs["variants"], inputs["cross_framework"], precision)) \
        if config["ablation"].get("cross_framework") else \
        pd.DataFrame(columns=tables.ACTIVATION_COLUMNS)
    across.insert(0, "devices", ";".join(config["ablation"].get("cross_framework", [])))
    casting = []
    for base, files in inputs["casting"].items():
        group = open_records(files)
        try:
            casting.append(tables.precision_casting(base, group,
                                                    config["ablation"]["precisions"]))
        finally:
            for record in group:
                record.close()
    return {"layers": layers, "activation": tables.activation_deviations(layers),
            "effects": tables.layer_effects(layers),
            "accuracy": tables.validation_accuracy(inputs["variants"], inputs["logits"]),
            "casting": pd.concat(casting, ignore_index=True), "across_frameworks": across}


def _variant_layers(variants, files: dict, precision: str):
    from bitdrift.record.reader import open_records
    from bitdrift.studies.ablation import tables

    records = {model: open_records(paths) for model, paths in files.items()}
    try:
        return tables.ablation_layers(variants, records, precision)
    finally:
        for group in records.values():
            for record in group:
                record.close()


def study_config(config: dict) -> dict:
    """The part of a validated config the ablation tables depend on (the rule's params).

    The workflow compares params with their keys sorted, so that reordering config.yaml
    triggers no rerun; the order of the variants and devices, which orders the tables'
    rows, travels as lists (:func:`in_config_order` restores it)."""
    from bitdrift.studies.ablation.config import ablation_devices

    # Only the devices the tables read: adding another device to the config must not
    # redo the ablation tables.
    read = set(ablation_devices(config)) | set(casting_devices(config))
    used = [name for name in config["devices"] if name in read]
    return {"ablation": config["ablation"], "analysis": {"precision":
                                                         config["analysis"]["precision"]},
            "models": {base: config["models"][base] for base in config["ablation"]["models"]},
            "devices": {name: config["devices"][name] for name in used},
            "order": {"variants": list(config["ablation"]["variants"]), "devices": used}}


def in_config_order(config: dict) -> dict:
    """``config`` with its variants and devices in the order :func:`study_config` noted."""
    order = config.get("order")
    if not order:
        return config
    section = config["ablation"]
    return {**config, "ablation": {**section, "variants": {
                name: section["variants"][name] for name in order["variants"]}},
            "devices": {name: config["devices"][name] for name in order["devices"]}}


def write_ablation_tables(config: dict, out_dir) -> None:
    """Compute and write every ablation table into ``out_dir`` (names: ABLATION_TABLES)."""
    from bitdrift.atomic import write_tables

    tables = ablation_tables(config)
    write_tables(tables, ABLATION_TABLES, out_dir)
    print(f"bitdrift: {tables['layers']['model'].nunique()} models, "
          f"{len(tables['activation'])} activation layers -> {out_dir}", file=sys.stderr)


def cmd_ablation_tables(args) -> None:
    """Per-layer precision of the model variants, activation deviations (Table SUP-8),
    layer effects (SUP-9), validation accuracy (SUP-7) and precision casting (Figure 6)."""
    from bitdrift.config import load_config

    config = load_config(args.config)
    if not config.get("ablation"):
        raise ConfigError(f"{args.config}: no `ablation` section")
    write_ablation_tables(study_config(config), args.out_dir)


def cmd_plot(args) -> None:
    """An ablation figure (PDF) from the tables of `bitdrift ablation-tables`."""
    from bitdrift.atomic import read_table
    from bitdrift.studies.ablation import figures, tables

    if args.command == "plot-ablation-layers":
        figures.plot_ablation_layers(
            read_table(args.table, tables.LAYER_COLUMNS, "bitdrift ablation-tables"), args.out)
    else:
        figures.plot_precision_casting(
            read_table(args.table, tables.CASTING_COLUMNS, "bitdrift ablation-tables"),
            args.out)


def add_commands(sub) -> None:
    """Register the ablation study's subcommands on the `bitdrift` subparsers."""
    p = sub.add_parser("ablation-tables", help="per-layer precision of the model variants "
                       "and precision casting, Tables SUP-7..9",
                       description=cmd_ablation_tables.__doc__)
    p.add_argument("--config", required=True, help="config file with an `ablation` section "
                   "(the records are read from the workflow's results/)")
    p.add_argument("--out-dir", required=True, help="folder for " + ", ".join(
        f"{name}.csv" for name in ABLATION_TABLES.values()))
    p.set_defaults(func=cmd_ablation_tables)
    for name, table in (("plot-ablation-layers", "ablation_layers.csv"),
                        ("plot-precision-casting", "precision_casting.csv")):
        p = sub.add_parser(name, help=f"{name[5:].replace('-', ' ')} figure (PDF) from "
                           f"{table}", description=cmd_plot.__doc__)
        p.add_argument("table", help=table)
        p.add_argument("--out", required=True, help="figure file (PDF)")
        p.set_defaults(func=cmd_plot)
