"""The ``bitdrift`` command line. Each workflow step is a subcommand, so results gathered
outside the scheduler (a cloud VM, a laptop GPU) are produced and analysed with the same code.

The analysis subcommands (eqc, precision, plot-*) never import TensorFlow or torch.
"""

from __future__ import annotations

import argparse
import sys

from bitdrift import paths


def _config(path):
    from bitdrift.config import load_config

    return load_config(path)


def cmd_prepare_dataset(args) -> None:
    from bitdrift.datasets import prepare_dataset

    config = _config(args.config)
    prepare_dataset(args.dataset, config["datasets"][args.dataset],
                    args.out or paths.dataset_file(args.dataset))


def cmd_train(args) -> None:
    from bitdrift.training import train_model

    config = _config(args.config)
    spec = _model_spec(config, args.model)
    if "architecture" not in spec:
        sys.exit(f"bitdrift: model {args.model!r} is a file used as is; nothing to train")
    prefix = paths.trained_model_file(args.model, args.seed).rsplit("/", 1)[0]
    train_model(spec=spec, seed=args.seed,
                dataset_path=args.dataset_file or paths.dataset_file(spec["dataset"]),
                out_model=args.out_model or f"{prefix}/model.keras",
                out_history=args.out_history or f"{prefix}/history.csv",
                out_logits=args.out_logits or f"{prefix}/test_logits.h5",
                threads=args.threads, log=sys.stderr)


def _model_spec(config, model):
    if model not in config["models"]:
        sys.exit(f"bitdrift: unknown model {model!r} (config has {sorted(config['models'])})")
    return config["models"][model]


def cmd_infer(args) -> None:
    from bitdrift.inference import infer

    config = _config(args.config)
    spec = _model_spec(config, args.model)
    if args.device not in config["devices"]:
        sys.exit(f"bitdrift: unknown device {args.device!r} "
                 f"(config has {sorted(config['devices'])})")
    infer(model_name=args.model, device_name=args.device, device=config["devices"][args.device],
          model_path=args.model_file or paths.model_file(config, args.model),
          dataset_path=args.dataset_file or paths.dataset_file(spec["dataset"]),
          samples=config["samples"], out=args.out or paths.record_file(args.model, args.device),
          layers=config["analysis"]["layers"])


def _open_checked(args):
    """Open the records; with --expect, check them against the workflow's files."""
    from bitdrift.provenance import check_provenance
    from bitdrift.record import RecordError, open_records

    records = open_records(args.files)
    for model, model_path, dataset_path in args.expect or []:
        if not check_provenance(records, model, model_path, dataset_path):
            raise RecordError(f"--expect {model}: no record of that model among the files")
    return records


def cmd_eqc(args) -> None:
    from bitdrift.atomic import write_csv
    from bitdrift.eqc import eqc_tables

    records = _open_checked(args)
    final, layers = eqc_tables(records, layers=args.layers_out is not None)
    write_csv(final, args.out)
    if args.layers_out:
        write_csv(layers, args.layers_out)
    print(f"bitdrift: {final['eqc'].max() if len(final) else 0} classes at most over "
          f"{final['device'].nunique()} devices -> {args.out}", file=sys.stderr)


def cmd_precision(args) -> None:
    from bitdrift.atomic import write_csv
    from bitdrift.eqc import precision_table

    table = precision_table(_open_checked(args), precision=args.precision)
    write_csv(table, args.out)


def cmd_plot_eqc(args) -> None:
    import pandas as pd

    from bitdrift.figures import plot_eqc
    from bitdrift.record import open_records

    plot_eqc(pd.read_csv(args.eqc), open_records(args.files), args.out, args.precision)


def cmd_plot_precision(args) -> None:
    import pandas as pd

    from bitdrift.figures import plot_remaining_precision

    plot_remaining_precision(pd.read_csv(args.table), args.out)


def _maxpool(args):
    from bitdrift import paths
    from bitdrift.config import ConfigError, load_config

    config = load_config(args.config)
    if "maxpool" not in config:
        raise ConfigError(f"{args.config}: no `maxpool` section")
    study = config["maxpool"]
    dataset = getattr(args, "dataset_file", None) or paths.dataset_file(study["dataset"])
    return study, dataset


def cmd_maxpool(args) -> None:
    from bitdrift.maxpool_study import run_step

    step = args.command.removeprefix("maxpool-")
    study, dataset = (None, None) if step == "zero" else _maxpool(args)
    run_step(step, study, args.out, dataset=dataset, inputs=getattr(args, "files", ()),
             precision=getattr(args, "precision", None), setting=getattr(args, "setting", None),
             beta=getattr(args, "beta", None), seed=getattr(args, "seed", None))


def _concat_csv(files):
    import pandas as pd

    return pd.concat([pd.read_csv(path) for path in files], ignore_index=True)


def cmd_plot_backprop_variation(args) -> None:
    from bitdrift.maxpool_figures import plot_backprop_variation

    plot_backprop_variation(_concat_csv(args.files), args.out)


def cmd_plot_bifurcation_volume(args) -> None:
    from bitdrift.maxpool_figures import plot_bifurcation_volume

    plot_bifurcation_volume(_concat_csv([args.table]), args.out)


def cmd_plot_maxpool_training(args) -> None:
    from bitdrift.maxpool_figures import plot_maxpool_training

    plot_maxpool_training(_concat_csv(args.files), args.out)


TRAINING_TABLES = {"summary": "training_variance.csv", "runs": "training_runs.csv",
                   "subgroups": "training_subgroups.csv", "seed_ratio": "seed_ratio.csv",
                   "determinism_cost": "determinism_cost.csv"}


def cmd_train_run(args) -> None:
    from bitdrift.variance_plans import resolve_plans, run_directory
    from bitdrift.variance_training import train_run

    config = _config(args.config)
    plans = resolve_plans(config)
    if args.plan not in plans:
        sys.exit(f"bitdrift: unknown plan {args.plan!r} (config has {sorted(plans)})")
    plan = plans[args.plan]
    if args.device not in config["devices"]:
        sys.exit(f"bitdrift: unknown device {args.device!r} "
                 f"(config has {sorted(config['devices'])})")
    dataset = config["training_variance"]["models"][plan["model"]]["dataset"]
    train_run(plan_name=args.plan, plan=plan, arm=args.arm, device_name=args.device,
              device=config["devices"][args.device], run=args.run,
              dataset_path=args.dataset_file or paths.dataset_file(dataset),
              out_dir=args.out_dir or run_directory(args.plan, args.arm, args.device, args.run))


def cmd_training_stats(args) -> None:
    from pathlib import Path

    from bitdrift.atomic import write_csv
    from bitdrift.variance_stats import training_tables

    tables = training_tables(args.files)
    for key, name in TRAINING_TABLES.items():
        write_csv(tables[key], Path(args.out_dir) / name)
    summary = tables["summary"]
    print(f"bitdrift: {len(tables['runs'])} runs in {len(summary)} groups -> {args.out_dir}",
          file=sys.stderr)


def cmd_plot_training(args) -> None:
    import pandas as pd

    from bitdrift import variance_figures

    tables = [pd.read_csv(path) for path in args.tables]
    plot = {"plot-training-variance": variance_figures.plot_training_variance,
            "plot-churn": variance_figures.plot_churn,
            "plot-determinism-cost": variance_figures.plot_determinism_cost,
            "plot-ensemble-disagreement": variance_figures.plot_ensemble_disagreement,
            }[args.command]
    plot(*tables, args.out)


def _add_training_commands(sub) -> None:
    p = sub.add_parser("train-run", help="one run of a training-variance plan on a device")
    p.add_argument("--config", required=True)
    p.add_argument("--plan", required=True)
    p.add_argument("--arm", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--run", type=int, required=True)
    p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.add_argument("--out-dir", help="default results/training/PLAN/ARM/DEVICE/run_RUN")
    p.set_defaults(func=cmd_train_run)

    p = sub.add_parser("training-stats", help="spread, churn, weight distance, sub-groups and "
                       "determinism cost from run files (run.h5)")
    p.add_argument("files", nargs="+", help="run.h5 files, from this workflow or elsewhere")
    p.add_argument("--out-dir", required=True,
                   help=f"folder for {', '.join(TRAINING_TABLES.values())}")
    p.set_defaults(func=cmd_training_stats)

    for name, tables in (("plot-training-variance", "training_variance.csv seed_ratio.csv"),
                         ("plot-churn", "training_variance.csv"),
                         ("plot-determinism-cost", "determinism_cost.csv"),
                         ("plot-ensemble-disagreement", "training_variance.csv")):
        p = sub.add_parser(name, help=f"{name[5:].replace('-', ' ')} figure (PDF) from {tables}")
        p.add_argument("tables", nargs=len(tables.split()), help=tables)
        p.add_argument("--out", required=True)
        p.set_defaults(func=cmd_plot_training)


def _expect_option(parser) -> None:
    parser.add_argument(
        "--expect", nargs=3, action="append", metavar=("MODEL", "MODEL_FILE", "DATASET_FILE"),
        help="refuse records of MODEL not produced from this model file and dataset "
             "(repeatable; the workflow passes its own files)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bitdrift", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare-dataset", help="load a dataset source into HDF5")
    p.add_argument("--config", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--out")
    p.set_defaults(func=cmd_prepare_dataset)

    p = sub.add_parser("train", help="train one model with one seed")
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--threads", type=int)
    for name in ("dataset-file", "out-model", "out-history", "out-logits"):
        p.add_argument(f"--{name}")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("infer", help="run one device: all repeats, every layer, one record")
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--device", required=True)
    p.add_argument("--out", help="record path (default results/inference/MODEL/DEVICE.h5)")
    p.add_argument("--model-file", help="model to run (default: the workflow's trained model)")
    p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.set_defaults(func=cmd_infer)

    p = sub.add_parser("eqc", help="equivalence classes of inference records")
    p.add_argument("files", nargs="+", help="records; devices are ordered as given")
    p.add_argument("--out", required=True, help="final-output table (CSV)")
    p.add_argument("--layers-out", help="per-layer table (CSV)")
    _expect_option(p)
    p.set_defaults(func=cmd_eqc)

    p = sub.add_parser("precision", help="remaining precision per layer")
    p.add_argument("files", nargs="+")
    p.add_argument("--out", required=True)
    _expect_option(p)
    p.add_argument("--precision", choices=["float16", "bfloat16", "float32", "float64"],
                   help="devices of this precision enter (default: the one all records share)")
    p.set_defaults(func=cmd_precision)

    p = sub.add_parser("plot-eqc", help="EQC grid and dendrogram (PDF)")
    p.add_argument("files", nargs="+")
    p.add_argument("--eqc", required=True, help="table from `bitdrift eqc`")
    p.add_argument("--out", required=True)
    p.add_argument("--precision", default="float32")
    p.set_defaults(func=cmd_plot_eqc)

    p = sub.add_parser("plot-precision", help="remaining precision per layer (PDF)")
    p.add_argument("table", help="table from `bitdrift precision`")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_plot_precision)
    _add_maxpool_commands(sub)
    _add_training_commands(sub)
    return parser


def _study_parser(sub, name: str, help_text: str, *, dataset=True):
    """A `maxpool-*` subcommand: it reads the study from --config and writes --out."""
    p = sub.add_parser(name, help=help_text)
    p.add_argument("--config", required=True)
    if dataset:
        p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_maxpool)
    return p


def _add_maxpool_commands(sub) -> None:
    p = sub.add_parser("maxpool-zero", help="zero programs of Tables 1 and 3 at 16/32/64 bits")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_maxpool)
    p = _study_parser(sub, "maxpool-variation", "backprop variation D at one precision")
    p.add_argument("--precision", type=int, choices=[16, 32, 64], required=True)
    p = _study_parser(sub, "maxpool-volume", "D over draws x mini-batches for one setting")
    p.add_argument("--setting", required=True, help="a key of maxpool.volume.settings")
    p = _study_parser(sub, "maxpool-train", "train with hybrid-beta MaxPool, one seed")
    p.add_argument("--beta", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p = _study_parser(sub, "maxpool-volume-table", "Table 2: share of draws/batches in S",
                      dataset=False)
    p.add_argument("files", nargs="+", help="tables from `bitdrift maxpool-volume`")
    for name, func, inputs in (
        ("plot-backprop-variation", cmd_plot_backprop_variation, "files"),
        ("plot-bifurcation-volume", cmd_plot_bifurcation_volume, "table"),
        ("plot-maxpool-training", cmd_plot_maxpool_training, "files"),
    ):
        p = sub.add_parser(name, help=f"{name[5:].replace('-', ' ')} figure (PDF)")
        p.add_argument(inputs, nargs="+" if inputs == "files" else None)
        p.add_argument("--out", required=True)
        p.set_defaults(func=func)


def main(argv=None) -> int:
    from bitdrift.config import ConfigError
    from bitdrift.datasets import DatasetError
    from bitdrift.errors import StudyError
    from bitdrift.record import RecordError
    from bitdrift.variance_training import TrainingRunError

    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ConfigError, RecordError, DatasetError, StudyError, TrainingRunError) as error:
        print(f"bitdrift: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
