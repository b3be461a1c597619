"""``bitdrift maxpool-*`` and the MaxPool figures: one subcommand per step of the study,
each writing one table (or figure). A command's parser sits beside its handler."""

from __future__ import annotations

from bitdrift.errors import ConfigError


def _study(args) -> tuple[dict, str]:
    """The validated `maxpool` section of --config, and the dataset file to read (None for
    a command that reads no dataset)."""
    from bitdrift import paths
    from bitdrift.config import load_config

    config = load_config(args.config)
    if "maxpool" not in config:
        raise ConfigError(f"{args.config}: no `maxpool` section")
    study = config["maxpool"]
    if not hasattr(args, "dataset_file"):  # maxpool-volume-table reads tables only
        return study, None
    return study, args.dataset_file or paths.dataset_file(study["dataset"])


def _concat_csv(files, columns, producer):
    import pandas as pd

    from bitdrift.atomic import read_table

    return pd.concat([read_table(path, columns, producer) for path in files],
                     ignore_index=True)


def _write(table, out) -> None:
    from bitdrift.atomic import write_csv

    write_csv(table, out)


def cmd_zero(args) -> None:
    """Zero programs of Tables 1 and 3 at 16/32/64 bits."""
    from bitdrift.studies.maxpool.experiments import zero_programs

    _write(zero_programs(), args.out)


def cmd_variation(args) -> None:
    """Backprop variation D of the `variation` network at one precision (Figures 1-3)."""
    from bitdrift.studies.maxpool.experiments import backprop_variation

    study, dataset = _study(args)
    _write(backprop_variation(study, dataset, args.precision), args.out)


def cmd_volume(args) -> None:
    """D over draws x mini-batches for one setting of maxpool.volume (Table 2 raw)."""
    from bitdrift.studies.maxpool.experiments import volume_draws

    study, dataset = _study(args)
    _write(volume_draws(study, dataset, args.setting), args.out)


def cmd_volume_table(args) -> None:
    """Table 2: share of draws and mini-batches in the bifurcation zone, per setting."""
    from bitdrift.atomic import read_table
    from bitdrift.studies.maxpool.experiments import volume_summary

    study, _ = _study(args)
    tables = [read_table(path, ("setting", "comparison", "precision", "draw", "batch",
                                "variation"), "bitdrift maxpool-volume") for path in args.files]
    _write(volume_summary(study, tables), args.out)


def cmd_train(args) -> None:
    """Train with hybrid-beta MaxPool, one seed (Figure 5)."""
    from bitdrift.studies.maxpool.experiments import hybrid_training

    study, dataset = _study(args)
    _write(hybrid_training(study, dataset, args.beta, args.seed), args.out)


def cmd_plot_backprop_variation(args) -> None:
    """Backprop variation figure (PDF) from `maxpool-variation` tables."""
    from bitdrift.studies.maxpool.figures import plot_backprop_variation

    plot_backprop_variation(_concat_csv(args.files, ("comparison", "precision", "variation"),
                                        "bitdrift maxpool-variation"), args.out)


def cmd_plot_bifurcation_volume(args) -> None:
    """Bifurcation volume figure (PDF) from the `maxpool-volume-table` table."""
    from bitdrift.studies.maxpool.figures import plot_bifurcation_volume

    plot_bifurcation_volume(_concat_csv([args.table], ("setting", "share_theta",
                                                       "share_batches"),
                                        "bitdrift maxpool-volume-table"), args.out)


def cmd_plot_maxpool_training(args) -> None:
    """Hybrid-beta training figure (PDF) from `maxpool-train` tables."""
    from bitdrift.studies.maxpool.figures import plot_maxpool_training

    plot_maxpool_training(_concat_csv(args.files, ("beta", "seed", "epoch", "test_accuracy"),
                                      "bitdrift maxpool-train"), args.out)


def _parser(sub, name, handler, *, config=True, dataset=True):
    summary = handler.__doc__.rstrip(".")
    p = sub.add_parser(name, help=summary[0].lower() + summary[1:], description=handler.__doc__)
    if config:
        p.add_argument("--config", required=True, help="config file with a `maxpool` section")
    if dataset:
        p.add_argument("--dataset-file",
                       help="dataset HDF5 (default: the workflow's file of maxpool.dataset)")
    p.add_argument("--out", required=True, help="output file (CSV table or PDF figure)")
    p.set_defaults(func=handler)
    return p


def add_commands(sub) -> None:
    """Register the MaxPool study's subcommands on the `bitdrift` subparsers."""
    _parser(sub, "maxpool-zero", cmd_zero, config=False, dataset=False)
    p = _parser(sub, "maxpool-variation", cmd_variation)
    p.add_argument("--precision", type=int, choices=[16, 32, 64], required=True,
                   help="float width in bits")
    p = _parser(sub, "maxpool-volume", cmd_volume)
    p.add_argument("--setting", required=True, help="a key of maxpool.volume.settings")
    p = _parser(sub, "maxpool-train", cmd_train)
    p.add_argument("--beta", type=float, required=True,
                   help="hybrid MaxPool beta, a key of maxpool.training.betas")
    p.add_argument("--seed", type=int, required=True, help="seed of init and data order")
    p = _parser(sub, "maxpool-volume-table", cmd_volume_table, dataset=False)
    p.add_argument("files", nargs="+", help="tables from `bitdrift maxpool-volume`")
    p = _parser(sub, "plot-backprop-variation", cmd_plot_backprop_variation, config=False,
                dataset=False)
    p.add_argument("files", nargs="+", help="tables from `bitdrift maxpool-variation`")
    p = _parser(sub, "plot-bifurcation-volume", cmd_plot_bifurcation_volume, config=False,
                dataset=False)
    p.add_argument("table", help="table from `bitdrift maxpool-volume-table`")
    p = _parser(sub, "plot-maxpool-training", cmd_plot_maxpool_training, config=False,
                dataset=False)
    p.add_argument("files", nargs="+", help="tables from `bitdrift maxpool-train`")
