"""``bitdrift train-run``, ``training-stats`` and the training-variance figures."""

from __future__ import annotations

from bitdrift.errors import ConfigError


def cmd_train_run(args) -> None:
    """One run of a training-variance plan on a device, in a process of its own."""
    from bitdrift import paths
    from bitdrift.config import load_config
    from bitdrift.studies.variance.paths import run_directory
    from bitdrift.studies.variance.plans import resolve_plans
    from bitdrift.studies.variance.runs import train_run

    config = load_config(args.config)
    plans = resolve_plans(config)
    if args.plan not in plans:
        raise ConfigError(f"unknown plan {args.plan!r} (config has {sorted(plans)})")
    plan = plans[args.plan]
    if args.device not in config["devices"]:
        raise ConfigError(f"unknown device {args.device!r} "
                          f"(config has {sorted(config['devices'])})")
    train_run(plan_name=args.plan, plan=plan, arm=args.arm, device_name=args.device,
              device=config["devices"][args.device], run=args.run,
              dataset_path=args.dataset_file or paths.dataset_file(plan["spec"]["dataset"]),
              out_dir=args.out_dir or run_directory(args.plan, args.arm, args.device,
                                                          args.run))


def cmd_training_stats(args) -> None:
    """Spread, churn, weight distance, sub-groups and determinism cost from run files."""
    from bitdrift.studies.variance.stats import write_training_tables

    write_training_tables(args.files, args.out_dir)


def cmd_example_divergence(args) -> None:
    """Per-example divergence, its overlap between arms/devices/plans, its share per class
    and sub-group, and the runs' accuracy on the most divergent examples, from run files."""
    from bitdrift.studies.variance.examples import write_example_tables

    write_example_tables(args.files, args.out_dir, args.top_k)


def cmd_plot_divergent_examples(args) -> None:
    """The gallery of the most divergent test images of a plan, with the labels the runs
    predicted, and divergence against the majority's confidence."""
    from bitdrift.studies.variance.figures import plot_divergent_examples_figure

    plot_divergent_examples_figure(args.table, args.dataset_file, args.plan, args.out,
                                   args.arm, args.top_k)


# Columns a table must have to be the one a figure reads.
TABLE_COLUMNS = {"training_variance.csv": ("plan", "arm", "scope", "study", "sd_accuracy",
                                           "sd_loss", "churn", "disagreement"),
                 "seed_ratio.csv": ("plan", "scope", "ratio_accuracy", "ratio_loss"),
                 "determinism_cost.csv": ("plan", "device", "epoch_percent_of_default",
                                          "step_percent_of_default")}
FIGURES = {  # command: (plotting function, the tables it reads)
    "plot-training-variance": ("plot_training_variance", ("training_variance.csv",
                                                          "seed_ratio.csv")),
    "plot-churn": ("plot_churn", ("training_variance.csv",)),
    "plot-determinism-cost": ("plot_determinism_cost", ("determinism_cost.csv",)),
    "plot-ensemble-disagreement": ("plot_ensemble_disagreement", ("training_variance.csv",)),
}


def cmd_plot(args) -> None:
    """A training-variance figure (PDF) from the tables of `bitdrift training-stats`."""
    from bitdrift.atomic import read_table
    from bitdrift.studies.variance import figures

    function, names = FIGURES[args.command]
    tables = [read_table(path, TABLE_COLUMNS[name], "bitdrift training-stats")
              for path, name in zip(args.tables, names, strict=True)]
    getattr(figures, function)(*tables, args.out)


def add_commands(sub) -> None:
    """Register the training-variance study's subcommands on the `bitdrift` subparsers."""
    from bitdrift.studies.variance.paths import TRAINING_TABLES

    p = sub.add_parser("train-run", help="one run of a training-variance plan on a device",
                       description=cmd_train_run.__doc__)
    p.add_argument("--config", required=True, help="config file with `training_variance`")
    p.add_argument("--plan", required=True, help="a plan of training_variance.plans (or an "
                   "ensemble plan ensemble_lr_RATE_momentum_MOMENTUM)")
    p.add_argument("--arm", required=True, help="an arm of the plan")
    p.add_argument("--device", required=True, help="a key of devices")
    p.add_argument("--run", type=int, required=True, help="run index, 0..runs-1")
    p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.add_argument("--out-dir", help="default results/training/PLAN/ARM/DEVICE/run_RUN")
    p.set_defaults(func=cmd_train_run, writes_data=True)

    p = sub.add_parser("training-stats", help="spread, churn, weight distance, sub-groups and "
                       "determinism cost from run files (run.h5)",
                       description=cmd_training_stats.__doc__)
    p.add_argument("files", nargs="+", help="run.h5 files, from this workflow or elsewhere")
    p.add_argument("--out-dir", required=True, help="folder for " + ", ".join(
        f"{name}.csv" for name in TRAINING_TABLES.values()))
    p.set_defaults(func=cmd_training_stats)

    from bitdrift.studies.variance.paths import EXAMPLE_TABLES

    p = sub.add_parser("example-divergence", help="which test examples the runs disagree on: "
                       "per-example divergence, overlap, per-class share, subset accuracy",
                       description=cmd_example_divergence.__doc__)
    p.add_argument("files", nargs="+", help="run.h5 files, from this workflow or elsewhere")
    p.add_argument("--out-dir", required=True, help="folder for " + ", ".join(
        f"{name}.csv" for name in EXAMPLE_TABLES.values()))
    p.add_argument("--top-k", type=int, default=16,
                   help="how many of the most divergent examples form the affected subset")
    p.set_defaults(func=cmd_example_divergence)

    p = sub.add_parser("plot-divergent-examples", help="gallery of the most divergent test "
                       "images of a plan (PDF) from example_divergence.csv",
                       description=cmd_plot_divergent_examples.__doc__)
    p.add_argument("table", help="example_divergence.csv")
    p.add_argument("--dataset-file", required=True, help="the plan's dataset HDF5 (the "
                   "images are its test images at the recorded indices)")
    p.add_argument("--plan", required=True, help="the plan to show")
    p.add_argument("--arm", help="the arm (default: the one with the most divergent examples)")
    p.add_argument("--top-k", type=int, default=16, help="how many images")
    p.add_argument("--out", required=True, help="figure file (PDF)")
    p.set_defaults(func=cmd_plot_divergent_examples)

    for name, (_, tables) in FIGURES.items():
        p = sub.add_parser(name, help=f"{name[5:].replace('-', ' ')} figure (PDF) from "
                           f"{' '.join(tables)}", description=cmd_plot.__doc__)
        p.add_argument("tables", nargs=len(tables), help=" ".join(tables))
        p.add_argument("--out", required=True, help="figure file (PDF)")
        p.set_defaults(func=cmd_plot)
