"""Kernel provenance: which kernel ran in every layer, and how many first divergences the
kernels explain."""

from __future__ import annotations

import sys

from bitdrift.commands.common import (
    expect_option,
    open_checked,
    outputs_together,
)
from bitdrift.errors import ConfigError


@outputs_together
def write_kernel_tables(files, out, eqc=None, divergence=None, coverage_out=None,
                        orders_out=None, kernels_off=False, expect=None) -> None:
    """kernels.csv; with ``coverage_out`` how many first divergences the kernels explain
    (needs ``eqc`` and ``divergence``), with ``orders_out`` the accumulation orders."""
    import pandas as pd

    from bitdrift.analysis.eqc import EQC_COLUMNS
    from bitdrift.analysis.explain import COVERAGE_COLUMNS, coverage
    from bitdrift.analysis.kernels import TABLE_COLUMNS, kernels_table
    from bitdrift.atomic import read_table, write_csv
    from bitdrift.errors import RecordError

    records = open_checked(files, expect)
    rows, lacking = kernels_table(records)
    if lacking:
        print(f"bitdrift: records without kernels (written before format 3, or with "
              f"analysis.kernels off): {', '.join(lacking)}", file=sys.stderr)
    if not rows and not kernels_off:
        raise RecordError(f"no record carries kernels: {', '.join(lacking)}")
    if not rows:
        print("bitdrift: analysis.kernels is off: the kernel tables are written empty",
              file=sys.stderr)
    write_csv(rows, out, columns=TABLE_COLUMNS)
    if coverage_out:
        if not eqc or not divergence:
            raise ConfigError("--coverage-out needs --eqc and --divergence (the records' "
                              "eqc.csv and divergence.csv)")
        traced = [record for record in records if record.kernels is not None]
        found = coverage(traced, read_table(divergence, ["model", "sample", "device_a",
                                                         "device_b", "class_a", "class_b",
                                                         "first_layer"],
                                            "bitdrift divergence"),
                         read_table(eqc, EQC_COLUMNS, "bitdrift eqc"))
        write_csv(pd.DataFrame(found, columns=COVERAGE_COLUMNS), coverage_out)
        for row in found:
            print(f"bitdrift: {row['model']}: {row['first_divergences']} first divergences; "
                  f"kernels differ {row['kernels_differ']}, same kernels but other settings "
                  f"{row['same_kernels_other_settings']}, unexplained {row['unexplained']}, "
                  f"untraced {row['untraced']}, only at the deployed output "
                  f"{row['deployed_only']}; adjusted Rand index (kernel signature, "
                  f"class) {_rounded(row['adjusted_rand_index_mean'])}")
    if orders_out:
        from bitdrift.analysis.accumulation.tables import TABLE_COLUMNS as ORDER_COLUMNS
        from bitdrift.analysis.accumulation.tables import orders_table

        orders = orders_table(records)
        write_csv(orders, orders_out, columns=ORDER_COLUMNS)
        revealed = sum(row["order"] != "not revealed" for row in orders)
        same = sum(row["replay"].startswith("bit-identical") for row in orders)
        print(f"bitdrift: {len(orders)} (device, Dense or Conv2D layer) pairs, {revealed} "
              f"with a revealed order; the replay in that order is bit-identical for {same}; "
              f"wrote {orders_out}")
    print(f"bitdrift: {len(rows)} kernel rows; wrote {out}")


def cmd_kernels(args) -> None:
    write_kernel_tables(args.files, args.out, args.eqc, args.divergence, args.coverage_out,
                        args.orders_out, args.kernels_off, args.expect)


def _rounded(value) -> str:
    """A table's float for a log line: two decimals; what is no number, as it is."""
    try:
        return f"{float(value):.2f}"
    except (TypeError, ValueError):
        return str(value)


@outputs_together
def plot_kernel_figure(table, eqc, divergence, coverage, out) -> None:
    from bitdrift.analysis.eqc import EQC_COLUMNS
    from bitdrift.analysis.explain import COVERAGE_COLUMNS
    from bitdrift.analysis.kernels import TABLE_COLUMNS
    from bitdrift.atomic import read_table
    from bitdrift.report.figures.kernels import plot_kernels

    plot_kernels(read_table(table, TABLE_COLUMNS, "bitdrift kernels"),
                 read_table(eqc, EQC_COLUMNS, "bitdrift eqc"),
                 read_table(divergence, ["model", "class_a", "class_b", "first_layer"],
                            "bitdrift divergence"),
                 read_table(coverage, COVERAGE_COLUMNS, "bitdrift kernels --coverage-out"),
                 out)


def cmd_plot_kernels(args) -> None:
    plot_kernel_figure(args.table, args.eqc, args.divergence, args.coverage, args.out)


@outputs_together
def plot_orders_figure(files, divergence, out, expect=None) -> None:
    from bitdrift.analysis.accumulation.tables import contrasting_pair
    from bitdrift.analysis.divergence import DIVERGENCE_COLUMNS
    from bitdrift.atomic import read_table
    from bitdrift.report.figures.orders import plot_orders

    records = open_checked(files, expect)
    divergence = read_table(divergence, DIVERGENCE_COLUMNS, "bitdrift divergence")
    # One pair per model (a row each), so a second model never hides the first
    models = list(dict.fromkeys(record.model for record in records))
    pairs = [(model, contrasting_pair(divergence, records, model)) for model in models]
    plot_orders(pairs, out)
    said = "; ".join(f"{model}: no two revealed orders differ" if pair is None else
                     f"{pair['devices'][0]} vs {pair['devices'][1]} at {model}/{pair['layer']}"
                     for model, pair in pairs)
    print(f"bitdrift: the summation trees of {said}; wrote {out}")


def cmd_plot_orders(args) -> None:
    plot_orders_figure(args.files, args.divergence, args.out, args.expect)


def add_commands(sub) -> None:
    """Register these commands on the `bitdrift` subparsers."""
    p = sub.add_parser("kernels", help="which kernel ran in every layer (the traced "
                       "repeats): one row per device, layer and kernel call")
    p.add_argument("files", nargs="+", help="records")
    p.add_argument("--out", required=True, help="kernels.csv")
    p.add_argument("--kernels-off", action="store_true", help="the records were made with "
                   "analysis.kernels off: write the tables empty instead of failing")
    p.add_argument("--eqc", help="eqc.csv of the records (needed with --coverage-out)")
    p.add_argument("--divergence", help="divergence.csv of the records (needed with "
                   "--coverage-out)")
    p.add_argument("--coverage-out", help="kernel_coverage.csv: how many first divergences "
                   "the kernels explain")
    p.add_argument("--orders-out", help="accumulation_orders.csv: the order each Dense and "
                   "Conv2D layer summed in and whether numpy replaying it gives the record's "
                   "bits")
    expect_option(p)
    p.set_defaults(func=cmd_kernels)

    p = sub.add_parser("plot-kernels", help="devices x layers coloured by kernel (PDF)")
    p.add_argument("table", help="kernels.csv")
    p.add_argument("--eqc", required=True, help="eqc.csv")
    p.add_argument("--divergence", required=True, help="divergence.csv")
    p.add_argument("--coverage", required=True, help="kernel_coverage.csv")
    p.add_argument("--out", required=True, help="kernels.pdf (and .png beside it)")
    p.set_defaults(func=cmd_plot_kernels)

    p = sub.add_parser("plot-orders", help="the summation trees of two devices at a Dense "
                       "or Conv2D layer whose revealed orders differ: the first divergent "
                       "layer of a class pair where there is one, else the first layer where "
                       "the two largest groups of devices sum differently (PDF)")
    p.add_argument("files", nargs="+", help="records (with revealed orders)")
    p.add_argument("--divergence", required=True, help="divergence.csv of the records")
    p.add_argument("--out", required=True, help="accumulation_orders.pdf (and .png beside it)")
    expect_option(p)
    p.set_defaults(func=cmd_plot_orders)
