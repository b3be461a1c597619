"""The figures of the analysis tables (PDF, with a PNG beside each)."""

from __future__ import annotations

from bitdrift.commands.common import (
    PRECISIONS,
    outputs_together,
)


@outputs_together
def plot_eqc_figure(files, eqc, out, precision="float32") -> None:
    from bitdrift.analysis.eqc import EQC_COLUMNS
    from bitdrift.atomic import read_table
    from bitdrift.record.reader import open_records
    from bitdrift.report.figures.eqc import plot_eqc

    eqc = read_table(eqc, EQC_COLUMNS, "bitdrift eqc")
    plot_eqc(eqc, open_records(files), out, precision)


def cmd_plot_eqc(args) -> None:
    plot_eqc_figure(args.files, args.eqc, args.out, args.precision)


@outputs_together
def plot_precision_figure(table, out) -> None:
    from bitdrift.analysis.eqc import PRECISION_COLUMNS
    from bitdrift.atomic import read_table
    from bitdrift.report.figures.remaining_precision import plot_remaining_precision

    plot_remaining_precision(read_table(table, PRECISION_COLUMNS, "bitdrift precision"), out)


def cmd_plot_precision(args) -> None:
    plot_precision_figure(args.table, args.out)


@outputs_together
def plot_eqc_table_figure(files, eqc, classes, out, table_out=None) -> None:
    from bitdrift.analysis.eqc import EQC_COLUMNS
    from bitdrift.analysis.explain import class_table
    from bitdrift.atomic import read_table, write_csv
    from bitdrift.record.reader import open_records
    from bitdrift.report.figures.eqc import plot_eqc_table

    table = class_table(open_records(files),
                        read_table(eqc, EQC_COLUMNS, "bitdrift eqc"),
                        read_table(classes, ["model", "device", "device_class"],
                                   "bitdrift explain --classes-out"))
    if table_out:
        write_csv(table, table_out)
    plot_eqc_table(table, out)


def cmd_plot_eqc_table(args) -> None:
    plot_eqc_table_figure(args.files, args.eqc, args.classes, args.out, args.table_out)


@outputs_together
def plot_divergence_figure(eqc_layers, precision_table, out) -> None:
    from bitdrift.analysis.divergence import pairs_apart
    from bitdrift.analysis.eqc import EQC_LAYER_COLUMNS
    from bitdrift.atomic import read_table
    from bitdrift.report.figures.divergence import plot_divergence

    layers = read_table(eqc_layers, EQC_LAYER_COLUMNS, "bitdrift eqc --layers-out")
    kinds = read_table(precision_table, ["model", "layer", "layer_class"],
                       "bitdrift precision")
    plot_divergence(pairs_apart(layers), kinds, out)


def cmd_plot_divergence(args) -> None:
    plot_divergence_figure(args.eqc_layers, args.precision_table, args.out)


@outputs_together
def plot_generations_figure(files, eqc, out) -> None:
    from bitdrift.analysis.eqc import EQC_COLUMNS
    from bitdrift.atomic import read_table
    from bitdrift.record.reader import open_records
    from bitdrift.report.figures.machines import plot_generations

    devices = {}
    for record in open_records(files):
        emulated = record.json_attr("device_config", default={}).get("emulate")
        devices[record.device] = (record.attr("backend"), str(emulated or "host"))
    plot_generations(read_table(eqc, EQC_COLUMNS, "bitdrift eqc"), devices, out)


def cmd_plot_generations(args) -> None:
    plot_generations_figure(args.files, args.eqc, args.out)


def add_commands(sub) -> None:
    """Register these commands on the `bitdrift` subparsers."""
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

    p = sub.add_parser("plot-generations", help="classes by CPU generation (emulated "
                       "models and the host) and runtime (PDF)")
    p.add_argument("files", nargs="+", help="the records the table was made from")
    p.add_argument("--eqc", required=True, help="table from `bitdrift eqc`")
    p.add_argument("--out", required=True, help="figure (PDF, and PNG beside it)")
    p.set_defaults(func=cmd_plot_generations)
