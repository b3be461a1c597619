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
    dataset = args.dataset_file or paths.dataset_file(spec["dataset"])
    outputs = {"--out-model": args.out_model or paths.trained_model_file(args.model, args.seed),
               "--out-history": args.out_history or paths.training_history_file(args.model,
                                                                               args.seed),
               "--out-logits": args.out_logits or paths.test_logits_file(args.model,
                                                                         args.seed)}
    refuse_overwriting({"--config": args.config, "--dataset-file": dataset}, outputs)
    train_model(spec=spec, seed=args.seed, dataset_path=dataset,
                out_model=outputs["--out-model"], out_history=outputs["--out-history"],
                out_logits=outputs["--out-logits"], threads=args.threads, log=sys.stderr)


def _model_spec(config, model):
    if model not in config["models"]:
        raise ConfigError(f"unknown model {model!r} (config has {sorted(config['models'])})")
    return config["models"][model]


def cmd_infer(args) -> None:
    from pathlib import Path

    from bitdrift.export import inference_inputs
    from bitdrift.inference import infer

    config = _config(args.config)
    spec = _model_spec(config, args.model)
    if args.device not in config["devices"]:
        raise ConfigError(f"unknown device {args.device!r} "
                          f"(config has {sorted(config['devices'])})")
    model_path = args.model_file or paths.model_file(config, args.model)
    dataset_path = args.dataset_file or paths.dataset_file(spec["dataset"])
    out = args.out or paths.record_file(args.model, args.device)
    refuse_overwriting({"--config": args.config, "--model-file": model_path,
                        "--dataset-file": dataset_path}, {"--out": out})
    device = config["devices"][args.device]
    inputs = inference_inputs(args.model, device["backend"])
    reference = args.reference or inputs.get("reference")
    export = args.export or inputs.get("export")
    unchecked = None
    if reference and not args.reference and "export" not in inputs and Path(reference).is_file():
        from bitdrift.models import model_digest
        from bitdrift.reference import read_reference

        if read_reference(reference).model_sha256 != model_digest(model_path):
            # The workflow's reference is of the workflow's model; --model-file ran another.
            unchecked, reference = f"{reference} is of another model", None
    for option, path in (("--reference", reference), ("--export", export)):
        if path and not Path(path).is_file():
            if option == "--reference" and not args.reference and "export" not in inputs:
                # A Keras runtime without TensorFlow's reference: its run is complete, only
                # the argmax check is left out (and the record says unchecked).
                unchecked, reference = f"{path} does not exist", None
                continue
            raise ConfigError(f"{option} {path}: file does not exist (backend "
                              f"{device['backend']!r} needs it; make it with `bitdrift export "
                              f"--config {args.config} --model {args.model}`)")
    infer(model_name=args.model, device_name=args.device, device=device,
          model_path=model_path, dataset_path=dataset_path, samples=config["samples"],
          out=out, layers=config["analysis"]["layers"], reference=reference, export=export,
          kernels=config["analysis"]["kernels"])
    if unchecked:
        print(f"bitdrift: wrote {out} without the argmax check against TensorFlow ({unchecked}; "
              "`bitdrift export` makes one)", file=sys.stderr)


def cmd_export(args) -> None:
    from bitdrift.export import export_model, write_reference
    from bitdrift.reference import FORMATS

    config = _config(args.config)
    spec = _model_spec(config, args.model)
    model_path = args.model_file or paths.model_file(config, args.model)
    dataset_path = args.dataset_file or paths.dataset_file(spec["dataset"])
    reference = paths.export_reference_file(args.model)
    write_reference(model_path, dataset_path, reference)
    written = [reference]
    for name in FORMATS:
        export_model(model_path, name, paths.export_file(args.model, name))
        written.append(paths.export_file(args.model, name))
    print(f"bitdrift: wrote {', '.join(written)}")


def _open_checked(args):
    """Open the records; with --expect, check them against the workflow's files."""
    from bitdrift.record import RecordError, open_records

    records = open_records(args.files)
    if not args.expect:
        return records
    # Only here: provenance reads models and datasets (~20 ms of imports).
    from bitdrift.provenance import check_layout, check_provenance

    check_layout(records, [model for model, _, _ in args.expect])
    for model, model_path, dataset_path in args.expect:
        if not check_provenance(records, model, model_path, dataset_path):
            raise RecordError(f"--expect {model}: no record of that model among the files")
        if getattr(args, "recheck", False):
            # The tables that report effective precision recompute it with the model at
            # hand instead of reading what the inference wrote
            for record in records:
                if record.model == model:
                    warning = record.recheck_effective_precision(model_path, dataset_path)
                    if warning:
                        print(f"bitdrift: warning: {warning}", file=sys.stderr)
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
    from bitdrift.eqc import PRECISION_COLUMNS, PRECISION_EXTRA_COLUMNS, precision_rows

    rows = precision_rows(_open_checked(args), precision=args.precision,
                          significant=args.significant_bits, workers=args.workers)
    write_csv(rows, args.out, columns=PRECISION_COLUMNS + PRECISION_EXTRA_COLUMNS)


def cmd_agreement(args) -> None:
    from bitdrift.atomic import write_csv
    from bitdrift.export import AGREEMENT_COLUMNS, agreement_table

    rows = agreement_table(_open_checked(args))
    write_csv(rows, args.out, columns=AGREEMENT_COLUMNS)
    shares = [row["share"] for row in rows if isinstance(row.get("share"), float)]
    print(f"bitdrift: {len(shares)} records checked against TensorFlow's classes"
          + (f"; the lowest agreement {min(shares):.1%}" if shares else "")
          + f"; wrote {args.out}")


def cmd_kernels(args) -> None:
    import pandas as pd

    from bitdrift.atomic import read_table, write_csv
    from bitdrift.eqc import EQC_COLUMNS
    from bitdrift.errors import RecordError
    from bitdrift.explain import COVERAGE_COLUMNS, coverage
    from bitdrift.kernels import TABLE_COLUMNS, kernels_table

    records = _open_checked(args)
    rows, lacking = kernels_table(records)
    if lacking:
        print(f"bitdrift: records without kernels (written before format 3, or with "
              f"analysis.kernels off): {', '.join(lacking)}", file=sys.stderr)
    if not rows:
        raise RecordError(f"no record carries kernels: {', '.join(lacking)}")
    write_csv(rows, args.out, columns=TABLE_COLUMNS)
    if args.coverage_out:
        if not args.eqc or not args.divergence:
            raise ConfigError("--coverage-out needs --eqc and --divergence (the records' "
                              "eqc.csv and divergence.csv)")
        traced = [record for record in records if record.kernels is not None]
        found = coverage(traced, read_table(args.divergence, ["model", "device_a", "device_b",
                                                              "first_layer"],
                                            "bitdrift divergence"),
                         read_table(args.eqc, EQC_COLUMNS, "bitdrift eqc"))
        write_csv(pd.DataFrame(found, columns=COVERAGE_COLUMNS), args.coverage_out)
        for row in found:
            print(f"bitdrift: {row['model']}: {row['first_divergences']} first divergences; "
                  f"kernels differ {row['kernels_differ']}, same kernels but other settings "
                  f"{row['same_kernels_other_settings']}, unexplained {row['unexplained']}, "
                  f"untraced {row['untraced']}; ARI {row['adjusted_rand_index_mean']}")
    print(f"bitdrift: {len(rows)} kernel rows; wrote {args.out}")


def cmd_plot_kernels(args) -> None:
    from bitdrift.atomic import read_table
    from bitdrift.eqc import EQC_COLUMNS
    from bitdrift.explain import COVERAGE_COLUMNS
    from bitdrift.figures import plot_kernels
    from bitdrift.kernels import TABLE_COLUMNS

    plot_kernels(read_table(args.table, TABLE_COLUMNS, "bitdrift kernels"),
                 read_table(args.eqc, EQC_COLUMNS, "bitdrift eqc"),
                 read_table(args.divergence, ["model", "class_a", "class_b", "first_layer"],
                            "bitdrift divergence"),
                 read_table(args.coverage, COVERAGE_COLUMNS, "bitdrift kernels --coverage-out"),
                 args.out)


def cmd_effective_precision(args) -> None:
    from bitdrift.atomic import write_csv
    from bitdrift.effective_precision import TABLE_COLUMNS, effective_precision_table, summary

    records = _open_checked(args)
    rows = effective_precision_table(records)
    write_csv(rows, args.out, columns=TABLE_COLUMNS)
    reduced = [f"{record.device} ({record.model}): {summary(record.effective_precision)}"
               for record in records if summary(record.effective_precision).startswith("red")]
    source = "recomputed from the records and the model files" if args.expect else \
        "as the records say (give --expect MODEL MODEL_FILE DATASET_FILE to recompute)"
    print(f"bitdrift: {len(rows)} layer checks, {source}; computed below the declared "
          f"precision: {'; '.join(reduced) or 'none'} -> {args.out}", file=sys.stderr)


def cmd_failures(args) -> None:
    from bitdrift.atomic import write_csv
    from bitdrift.failures import TABLE_COLUMNS, failure_rows

    rows = failure_rows(args.files)
    write_csv(rows, args.out, columns=TABLE_COLUMNS)
    print(f"bitdrift: {len(rows)} failed device(s) among {len(args.files)} files -> "
          f"{args.out}", file=sys.stderr)


def cmd_findings(args) -> None:
    from pathlib import Path

    from bitdrift.findings import STUDY_TABLES, TABLES, write_findings

    tables = {name: Path(args.tables) / f"{name}.csv" for name in (*TABLES, *STUDY_TABLES)}
    sections = write_findings(tables, args.files, args.out, args.rst_out)
    print(f"bitdrift: {sum(len(lines) for _, lines in sections)} findings in "
          f"{len(sections)} sections -> {args.out}", file=sys.stderr)


def cmd_plot_generations(args) -> None:
    import json

    from bitdrift.atomic import read_table
    from bitdrift.eqc import EQC_COLUMNS
    from bitdrift.figures import plot_generations
    from bitdrift.record import open_records

    devices = {}
    for record in open_records(args.files):
        config = json.loads(record.attr("device_config")) if record.has_attr(
            "device_config") else {}
        devices[record.device] = (record.attr("backend"), config.get("emulate") or "host")
    plot_generations(read_table(args.eqc, EQC_COLUMNS, "bitdrift eqc"), devices, args.out)


def cmd_emulation_check(args) -> int:
    from bitdrift.atomic import write_csv
    from bitdrift.emulation_check import COLUMNS, MismatchError, check

    try:
        rows = check(args.kernels, args.models)
    except MismatchError as error:
        write_csv(error.rows, args.out, columns=COLUMNS)  # the evidence, then the error
        print(f"bitdrift: error: {error}", file=sys.stderr)
        return error.exit_code
    write_csv(rows, args.out, columns=COLUMNS)
    faithful = sum(row["verdict"] == "faithful" for row in rows)
    print(f"bitdrift: emulation check: {faithful} forced kernel(s) faithful, bit for bit; "
          f"{len(rows) - faithful} informational -> {args.out}", file=sys.stderr)
    return 0


def cmd_plot_eqc(args) -> None:
    from bitdrift.atomic import read_table
    from bitdrift.eqc import EQC_COLUMNS
    from bitdrift.figures import plot_eqc
    from bitdrift.record import open_records

    eqc = read_table(args.eqc, EQC_COLUMNS, "bitdrift eqc")
    plot_eqc(eqc, open_records(args.files), args.out, args.precision)


def cmd_plot_precision(args) -> None:
    from bitdrift.atomic import read_table
    from bitdrift.eqc import PRECISION_COLUMNS
    from bitdrift.figures import plot_remaining_precision

    plot_remaining_precision(read_table(args.table, PRECISION_COLUMNS, "bitdrift precision"),
                             args.out)


def cmd_explain(args) -> None:
    from bitdrift.atomic import write_csv
    from bitdrift.explain import explain_table

    explain, flags, classes = explain_table(_open_checked(args), layers=args.layers,
                                            time_budget=args.time_budget)
    write_csv(explain, args.out)
    if args.flags_out:
        write_csv(flags, args.flags_out)
    if args.classes_out:
        write_csv(classes, args.classes_out)


def cmd_divergence(args) -> None:
    from bitdrift.atomic import write_csv
    from bitdrift.divergence import divergence_table

    write_csv(divergence_table(_open_checked(args)), args.out)


def cmd_plot_eqc_table(args) -> None:
    from bitdrift.atomic import read_table, write_csv
    from bitdrift.eqc import EQC_COLUMNS
    from bitdrift.explain import class_table
    from bitdrift.figures import plot_eqc_table
    from bitdrift.record import open_records

    table = class_table(open_records(args.files),
                        read_table(args.eqc, EQC_COLUMNS, "bitdrift eqc"),
                        read_table(args.classes, ["model", "device", "device_class"],
                                   "bitdrift explain --classes-out"))
    if args.table_out:
        write_csv(table, args.table_out)
    plot_eqc_table(table, args.out)


def cmd_plot_divergence(args) -> None:
    from bitdrift.atomic import read_table
    from bitdrift.divergence import pairs_apart
    from bitdrift.eqc import EQC_LAYER_COLUMNS
    from bitdrift.figures import plot_divergence

    layers = read_table(args.eqc_layers, EQC_LAYER_COLUMNS, "bitdrift eqc --layers-out")
    kinds = read_table(args.precision_table, ["model", "layer", "layer_class"],
                       "bitdrift precision")
    plot_divergence(pairs_apart(layers), kinds, args.out)


def cmd_index(args) -> int:
    from bitdrift.atlas import Index
    from bitdrift.record import open_records

    index = Index.build(open_records(args.files), args.layer)
    index.write(args.out)
    print(f"{args.out}: {len(index.labels)} records, {len(index.entries)} keys (model, "
          f"inputs, sample, format) of layer {args.layer!r}")
    return 0


def cmd_identify_indexed(args) -> int:
    from bitdrift.atlas import Index
    from bitdrift.record import Record

    found = Index.read(args.index).identify(Record(args.record))
    if found.matched:
        print(f"{args.record}: matched, bitwise on {found.keys} sample(s): "
              f"{', '.join(found.records)}")
        return 0
    print(f"{args.record}: no match; nearest by remaining precision "
          f"({found.remaining_precision:g} bits over {found.keys} sample(s)): "
          f"{', '.join(found.records)}")
    return 1


def cmd_identify(args) -> int:
    from bitdrift.explain import identify
    from bitdrift.record import open_records

    if bool(args.against) == bool(args.index):
        raise ConfigError("identify: give either --against RECORDS or --index ATLAS")
    if args.index:
        return cmd_identify_indexed(args)
    eqc = None
    if args.eqc:
        from bitdrift.atomic import read_table
        from bitdrift.eqc import EQC_COLUMNS

        eqc = read_table(args.eqc, EQC_COLUMNS, "bitdrift eqc")
    unknown, *known = open_records([args.record, *args.against])
    found = identify(unknown, known, eqc)
    shared = ", ".join(f"{k}={v}" for k, v in found.shared.items()) or "none"
    if found.differing:  # what the record's own fingerprint says otherwise
        shared += "; the record itself has " + ", ".join(
            f"{k}={own} (not {theirs})" for k, (own, theirs) in found.differing.items())
    if found.matched:
        print(f"{args.record}: matched, bitwise on every sample: class "
              f"{', '.join(f'{c} (sample {s})' for s, c in found.classes.items())}; devices "
              f"{', '.join(found.devices)}; shared attributes: {shared}")
        return 0
    numbering = "" if args.eqc else " (classes numbered over --against in order)"
    classes = [f"class {', '.join(f'{c} (sample {s})' for s, c in numbers.items())}: "
               f"devices {', '.join(devices)}" for numbers, devices in found.nearest_classes]
    if len(classes) == 1:
        nearest = f"nearest class by remaining precision ({found.remaining_precision:g} bits)"
    else:
        nearest = (f"{len(classes)} classes tied as nearest by remaining precision "
                   f"({found.remaining_precision:g} bits)")
    print(f"{args.record}: no match; {nearest}{numbering}: {'; '.join(classes)}; "
          f"attributes consistent with {'it' if len(classes) == 1 else 'them'}: {shared}")
    return 1


def _expect_option(parser) -> None:
    parser.add_argument(
        "--expect", nargs=3, action="append", metavar=("MODEL", "MODEL_FILE", "DATASET_FILE"),
        help="refuse records of MODEL not produced from this model file and dataset "
             "(repeatable; the workflow passes its own files)")


PRECISIONS = ("float16", "bfloat16", "float32", "float64")
DESCRIPTION = ("Measure how neural-network results drift when only the tooling changes: run a "
               "model on many devices, record every layer, and find where the results part "
               "ways; plus the MaxPool and training-variance studies.")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bitdrift")
    except PackageNotFoundError:  # run from a checkout without installing
        return "unknown (not installed)"


def _default_workers() -> int:
    import os

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cpus or 1, 4))


class _VersionAction(argparse.Action):
    """--version, looked up only when asked (importlib.metadata costs ~20 ms per command)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bitdrift", description=DESCRIPTION,
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="show the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("prepare-dataset", help="load a dataset source into HDF5")
    p.add_argument("--config", required=True, help="config file (config.yaml or a preset)")
    p.add_argument("--dataset", required=True, help="a key of datasets")
    p.add_argument("--out", help="dataset HDF5 (default results/datasets/DATASET.h5)")
    p.set_defaults(func=cmd_prepare_dataset, writes_data=True)

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
    p.set_defaults(func=cmd_train, writes_data=True)

    p = sub.add_parser("infer", help="run one device: all repeats, every layer, one record")
    p.add_argument("--config", required=True, help="config file (config.yaml or a preset)")
    p.add_argument("--model", required=True, help="a key of models")
    p.add_argument("--device", required=True, help="a key of devices")
    p.add_argument("--out", help="record path (default results/inference/MODEL/DEVICE.h5)")
    p.add_argument("--model-file", help="model to run (default: the workflow's trained model)")
    p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.add_argument("--reference", help="TensorFlow's reference of the model (default: the "
                   "workflow's results/exports/MODEL/reference.npz)")
    p.add_argument("--export", help="the exported model an exported runtime runs (default: "
                   "the workflow's results/exports/MODEL/model.onnx or .tflite)")
    p.set_defaults(func=cmd_infer, writes_data=True)

    p = sub.add_parser("export", help="export a model for the exported runtimes (ONNX, "
                       "LiteRT) and write TensorFlow's reference, at the workflow's paths")
    p.add_argument("--config", required=True, help="config file (config.yaml or a preset)")
    p.add_argument("--model", required=True, help="a key of models")
    p.add_argument("--model-file", help="model to export (default: the workflow's trained model)")
    p.add_argument("--dataset-file", help="dataset HDF5 (default: the workflow's)")
    p.set_defaults(func=cmd_export, writes_data=True)

    p = sub.add_parser("eqc", help="equivalence classes of inference records")
    p.add_argument("files", nargs="+", help="records; devices are ordered as given")
    p.add_argument("--out", required=True, help="final-output table (CSV)")
    p.add_argument("--layers-out", help="per-layer table (CSV)")
    _expect_option(p)
    p.set_defaults(func=cmd_eqc, recheck=True)

    p = sub.add_parser("precision", help="remaining precision per layer")
    p.add_argument("files", nargs="+", help="records of one model and sample set")
    p.add_argument("--out", required=True, help="table (CSV)")
    _expect_option(p)
    p.add_argument("--precision", choices=list(PRECISIONS),
                   help="devices of this precision enter (default: the one all records share)")
    p.add_argument("--significant-bits", action="store_true",
                   help="add the statistical significant bits the devices share per layer "
                   "(significantdigits: CNH, relative error, base 2) against the model's "
                   "float64 device where there is one, else the devices' mean")
    p.add_argument("--workers", type=int, default=_default_workers(),
                   help="processes analysing layers in parallel, each holding one layer over "
                   "all devices (default: the CPUs available, at most 4)")
    p.set_defaults(func=cmd_precision, recheck=True)

    p = sub.add_parser("effective-precision", help="did each device compute in its declared "
                       "precision: every Dense/Conv layer recomputed from the record")
    p.add_argument("files", nargs="+", help="records")
    p.add_argument("--out", required=True, help="effective_precision.csv")
    _expect_option(p)
    p.set_defaults(func=cmd_effective_precision, recheck=True)

    p = sub.add_parser("kernels", help="which kernel ran in every layer (the traced "
                       "repeats): one row per device, layer and kernel call")
    p.add_argument("files", nargs="+", help="records")
    p.add_argument("--out", required=True, help="kernels.csv")
    p.add_argument("--eqc", help="eqc.csv of the records (needed with --coverage-out)")
    p.add_argument("--divergence", help="divergence.csv of the records (needed with "
                   "--coverage-out)")
    p.add_argument("--coverage-out", help="kernel_coverage.csv: how many first divergences "
                   "the kernels explain")
    _expect_option(p)
    p.set_defaults(func=cmd_kernels)

    p = sub.add_parser("plot-kernels", help="devices x layers coloured by kernel (PDF)")
    p.add_argument("table", help="kernels.csv")
    p.add_argument("--eqc", required=True, help="eqc.csv")
    p.add_argument("--divergence", required=True, help="divergence.csv")
    p.add_argument("--coverage", required=True, help="kernel_coverage.csv")
    p.add_argument("--out", required=True, help="kernels.pdf (and .png beside it)")
    p.set_defaults(func=cmd_plot_kernels)

    p = sub.add_parser("agreement", help="does each runtime class the test images as "
                       "TensorFlow does (the argmax check), and which layers it exposes")
    p.add_argument("files", nargs="+", help="records")
    p.add_argument("--out", required=True, help="argmax_agreement.csv")
    _expect_option(p)
    p.set_defaults(func=cmd_agreement)

    p = sub.add_parser("failures", help="the devices that did not run: their failure "
                       "records' reasons (device_failures.csv)")
    p.add_argument("files", nargs="+", help="the record paths (failure records among them)")
    p.add_argument("--out", required=True, help="device_failures.csv")
    p.set_defaults(func=cmd_failures)

    p = sub.add_parser("findings", help="what this machine showed, in sentences generated "
                       "from the tables (findings.md)")
    p.add_argument("files", nargs="+", help="records (the first that ran names the machine)")
    p.add_argument("--tables", required=True, help="the folder of the run's tables "
                   "(results/tables)")
    p.add_argument("--out", required=True, help="findings.md")
    p.add_argument("--rst-out", help="the same as reStructuredText (the report's first "
                   "section)")
    p.set_defaults(func=cmd_findings)

    p = sub.add_parser("plot-generations", help="classes by CPU generation (emulated "
                       "models and the host) and runtime (PDF)")
    p.add_argument("files", nargs="+", help="the records the table was made from")
    p.add_argument("--eqc", required=True, help="table from `bitdrift eqc`")
    p.add_argument("--out", required=True, help="figure (PDF, and PNG beside it)")
    p.set_defaults(func=cmd_plot_generations)

    from bitdrift.emulation_check import CLASSES, KERNELS

    p = sub.add_parser("emulation-check", help="are emulated CPUs faithful: small kernels "
                       "under QEMU against the host forced to that CPU class's kernels")
    p.add_argument("--kernels", nargs="+", choices=list(KERNELS), default=list(KERNELS),
                   help="default: all")
    p.add_argument("--models", nargs="+", choices=list(CLASSES), default=list(CLASSES),
                   help="emulated CPU models (default: all)")
    p.add_argument("--out", required=True, help="the table (CSV)")
    p.set_defaults(func=cmd_emulation_check)

    p = sub.add_parser("plot-eqc", help="EQC grid and dendrogram (PDF)")
    p.add_argument("files", nargs="+", help="the records the table was made from")
    p.add_argument("--eqc", required=True, help="table from `bitdrift eqc`")
    p.add_argument("--out", required=True, help="figure (PDF)")
    p.add_argument("--precision", default="float32", choices=list(PRECISIONS),
                   help="precision whose devices the dendrogram joins (default float32)")
    p.set_defaults(func=cmd_plot_eqc)

    p = sub.add_parser("plot-precision", help="remaining precision per layer (PDF)")
    p.add_argument("table", help="table from `bitdrift precision`")
    p.add_argument("--out", required=True, help="figure (PDF)")
    p.set_defaults(func=cmd_plot_precision)

    p = sub.add_parser("explain", help="which device attributes determine the classes")
    p.add_argument("files", nargs="+", help="records (any tool's; missing keys are fine)")
    p.add_argument("--out", required=True, help="explain.csv: smallest determining "
                   "attribute set per (model, sample[, layer])")
    p.add_argument("--flags-out", help="flag_groups.csv: CPU flags and their groups")
    p.add_argument("--classes-out", help="device_classes.csv: each device's class under "
                   "the attributes used anywhere")
    p.add_argument("--layers", action="store_true", help="explain every layer, not only "
                   "the final output")
    p.add_argument("--time-budget", type=float, default=10.0,
                   help="seconds for the exact search per class pattern, greedy beyond")
    _expect_option(p)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("divergence", help="first layer where two classes differ")
    p.add_argument("files", nargs="+", help="records with per-layer outputs")
    p.add_argument("--out", required=True, help="divergence.csv")
    _expect_option(p)
    p.set_defaults(func=cmd_divergence)

    p = sub.add_parser("plot-eqc-table", help="paper-style class table (PDF and CSV)")
    p.add_argument("files", nargs="+", help="the records the tables were made from")
    p.add_argument("--eqc", required=True, help="table from `bitdrift eqc`")
    p.add_argument("--classes", required=True, help="table from `bitdrift explain "
                   "--classes-out`")
    p.add_argument("--out", required=True, help="figure (PDF)")
    p.add_argument("--table-out", help="the same table as CSV")
    p.set_defaults(func=cmd_plot_eqc_table)

    p = sub.add_parser("plot-divergence", help="share of device pairs apart per layer (PDF)")
    p.add_argument("eqc_layers", help="table from `bitdrift eqc --layers-out`")
    p.add_argument("precision_table", help="table from `bitdrift precision` (layer classes)")
    p.add_argument("--out", required=True, help="figure (PDF)")
    p.set_defaults(func=cmd_plot_divergence)

    p = sub.add_parser("identify", help="which known class a record of unknown origin is in "
                       "(exit 0: matched, 1: no match)")
    p.add_argument("record", help="the record to identify (same model and inputs)")
    p.add_argument("--against", nargs="+", help="known records")
    p.add_argument("--index", help="an atlas index of known records (`bitdrift index`): "
                   "exact match by look-up, nearest by a vectorised search")
    p.add_argument("--eqc", help="eqc.csv of the known records: its class numbers are used "
                   "(default: numbered by first appearance over --against)")
    p.set_defaults(func=cmd_identify)

    p = sub.add_parser("index", help="an atlas index of records for `identify --index`")
    p.add_argument("files", nargs="+", help="the records")
    p.add_argument("--layer", default="output", help="the layer indexed (default: the "
                   "final output)")
    p.add_argument("--out", required=True, help="the index (HDF5)")
    p.set_defaults(func=cmd_index, writes_data=True)
    for study in STUDIES:
        importlib.import_module(f"bitdrift.studies.{study}.cli").add_commands(sub)
    return parser


# A command whose outputs are records, models, datasets or probe files says so with
# `set_defaults(writes_data=True)` beside its parser (the studies' too); every other
# command writes tables (CSV) or figures (PDF), never over an HDF5 or Keras file.
INPUT_OPTIONS = ("files", "table", "tables", "eqc", "config", "model_file", "dataset_file",
                 "classes", "eqc_layers", "precision_table", "record", "against", "reference",
                 "export", "divergence", "coverage", "index", "probes", "evaluation",
                 "records")
OUTPUT_OPTIONS = ("out", "rst_out", "layers_out", "out_model", "out_history", "out_logits",
                  "flags_out", "classes_out", "table_out", "coverage_out")


def refuse_overwriting(inputs: dict, outputs: dict) -> None:
    """No output may be an input (named or defaulted) or another output: `infer --out`
    equal to the default model file replaced the model with a record, and `eqc --out X
    --layers-out X` wrote one table over the other. Both maps: flag -> path."""
    from pathlib import Path

    seen = {}
    for flag, path in inputs.items():
        for one in path if isinstance(path, list) else [path]:
            if one:
                seen.setdefault(Path(one).resolve(), flag)
    for flag, path in outputs.items():
        if not path:
            continue
        resolved = Path(path).resolve()
        if resolved in seen:
            other = seen[resolved]
            what = "also an input" if other in inputs else f"also the output of {other}"
            raise ConfigError(f"{flag} {path} is {what} ({other}); refusing to overwrite it")
        seen[resolved] = flag


def check_outputs(args) -> None:
    """Outputs are never inputs, nor each other: a shell glob that puts a record after
    --out, or --out naming one of the inputs or another output, must not replace a file;
    an --out-dir must be a folder."""
    from pathlib import Path

    from bitdrift.atomic import is_data_file

    inputs = {"--" + option.replace("_", "-"): getattr(args, option, None)
              for option in INPUT_OPTIONS if getattr(args, option, None)}
    outputs = {"--" + option.replace("_", "-"): getattr(args, option, None)
               for option in OUTPUT_OPTIONS if getattr(args, option, None)}
    refuse_overwriting(inputs, outputs)
    for flag, out in outputs.items():
        if not getattr(args, "writes_data", False) and is_data_file(out):
            raise ConfigError(f"{flag} {out} is a record, model or dataset file (HDF5/Keras); "
                              "this command writes a table or figure, refusing to overwrite it")
    out_dir = getattr(args, "out_dir", None)
    if out_dir and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ConfigError(f"--out-dir {out_dir} is a file, not a folder")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from bitdrift.atomic import output_group

    try:
        check_outputs(args)
        # A command's outputs appear together or not at all (a full disk at the last one)
        with output_group():
            status = args.func(args)
    except BitdriftError as error:
        # One line naming the file or key; anything else is a bug and keeps its traceback.
        message = " ".join(str(error).split())
        print(f"bitdrift: error: {message}", file=sys.stderr)
        return error.exit_code
    return status or 0


if __name__ == "__main__":
    sys.exit(main())
