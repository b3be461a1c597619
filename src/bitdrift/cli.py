"""The ``bitdrift`` command line: every workflow step is a subcommand, so results gathered
outside the scheduler (a cloud VM, a laptop GPU) are produced and analysed with the same
code. The analysis subcommands (eqc, precision, plot-*) never import TensorFlow or torch.
Each study registers its own subcommands (``bitdrift.studies.*.cli.add_commands``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from bitdrift import paths
from bitdrift.errors import EXIT_CODES, BitdriftError, ConfigError
from bitdrift.studies import STUDIES


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
        raise ConfigError(f"model {args.model!r} is a file used as is; nothing to train")
    train_model(spec=spec, seed=args.seed,
                dataset_path=args.dataset_file or paths.dataset_file(spec["dataset"]),
                out_model=args.out_model or paths.trained_model_file(args.model, args.seed),
                out_history=args.out_history or paths.training_history_file(args.model,
                                                                           args.seed),
                out_logits=args.out_logits or paths.test_logits_file(args.model, args.seed),
                threads=args.threads, log=sys.stderr)


def _model_spec(config, model):
    if model not in config["models"]:
        raise ConfigError(f"unknown model {model!r} (config has {sorted(config['models'])})")
    return config["models"][model]


def cmd_infer(args) -> None:
    from bitdrift.inference import infer

    config = _config(args.config)
    spec = _model_spec(config, args.model)
    if args.device not in config["devices"]:
        raise ConfigError(f"unknown device {args.device!r} "
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


def _expect_option(parser) -> None:
    parser.add_argument(
        "--expect", nargs=3, action="append", metavar=("MODEL", "MODEL_FILE", "DATASET_FILE"),
        help="refuse records of MODEL not produced from this model file and dataset "
             "(repeatable; the workflow passes its own files)")


DESCRIPTION = ("Measure how neural-network results drift when only the tooling changes: run a "
               "model on many devices, record every layer, and find where the results part "
               "ways; plus the MaxPool and training-variance studies.")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bitdrift")
    except PackageNotFoundError:  # run from a checkout without installing
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bitdrift", description=DESCRIPTION,
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("prepare-dataset", help="load a dataset source into HDF5")
    p.add_argument("--config", required=True, help="config file (config.yaml or a preset)")
    p.add_argument("--dataset", required=True, help="a key of datasets")
    p.add_argument("--out", help="dataset HDF5 (default results/datasets/DATASET.h5)")
    p.set_defaults(func=cmd_prepare_dataset)

    p = sub.add_parser("train", help="train one model with one seed")
    p.add_argument("--config", required=True, help="config file (config.yaml or a preset)")
    p.add_argument("--model", required=True, help="a key of models with an architecture")
    p.add_argument("--seed", type=int, required=True, help="seed of every source of randomness")
    p.add_argument("--threads", type=int, help="framework threads (default: its own)")
    p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.add_argument("--out-model", help="default results/models/MODEL/seed_SEED/model.keras")
    p.add_argument("--out-history", help="default results/models/MODEL/seed_SEED/history.csv")
    p.add_argument("--out-logits",
                   help="default results/models/MODEL/seed_SEED/test_logits.h5")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("infer", help="run one device: all repeats, every layer, one record")
    p.add_argument("--config", required=True, help="config file (config.yaml or a preset)")
    p.add_argument("--model", required=True, help="a key of models")
    p.add_argument("--device", required=True, help="a key of devices")
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
    p.add_argument("files", nargs="+", help="records of one model and sample set")
    p.add_argument("--out", required=True, help="table (CSV)")
    _expect_option(p)
    p.add_argument("--precision", choices=["float16", "bfloat16", "float32", "float64"],
                   help="devices of this precision enter (default: the one all records share)")
    p.set_defaults(func=cmd_precision)

    p = sub.add_parser("plot-eqc", help="EQC grid and dendrogram (PDF)")
    p.add_argument("files", nargs="+", help="the records the table was made from")
    p.add_argument("--eqc", required=True, help="table from `bitdrift eqc`")
    p.add_argument("--out", required=True, help="figure (PDF)")
    p.add_argument("--precision", default="float32",
                   help="precision whose devices the dendrogram joins (default float32)")
    p.set_defaults(func=cmd_plot_eqc)

    p = sub.add_parser("plot-precision", help="remaining precision per layer (PDF)")
    p.add_argument("table", help="table from `bitdrift precision`")
    p.add_argument("--out", required=True, help="figure (PDF)")
    p.set_defaults(func=cmd_plot_precision)
    for study in STUDIES:
        importlib.import_module(f"bitdrift.studies.{study}.cli").add_commands(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except BitdriftError as error:
        # One line naming the file or key; anything else is a bug and keeps its traceback.
        message = " ".join(str(error).split())
        print(f"bitdrift: error: {message}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
