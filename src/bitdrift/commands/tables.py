"""The analysis tables of a set of records (classes, precision, where devices part, what
explains them, the argmax check, failures, findings). None imports TensorFlow or torch."""

from __future__ import annotations

import sys

from bitdrift.commands.common import (
    PRECISIONS,
    default_workers,
    expect_option,
    open_checked,
    outputs_together,
)


# Each table is a library function of plain arguments, which a workflow script calls with
# its job's files; the command's handler (cmd_*) calls it with the command line's.
@outputs_together
def write_eqc_tables(files, out, layers_out=None, expect=None) -> None:
    """eqc.csv, the classes of the final output (and with ``layers_out``, every layer's)."""
    from bitdrift.analysis.eqc import eqc_tables
    from bitdrift.atomic import write_csv

    records = open_checked(files, expect, recheck=True)
    final, layers = eqc_tables(records, layers=layers_out is not None)
    write_csv(final, out)
    if layers_out:
        write_csv(layers, layers_out)
    print(f"bitdrift: {final['eqc'].max() if len(final) else 0} classes at most over "
          f"{final['device'].nunique()} devices -> {out}", file=sys.stderr)


def cmd_eqc(args) -> None:
    write_eqc_tables(args.files, args.out, args.layers_out, args.expect)


@outputs_together
def write_precision_table(files, out, precision=None, significant_bits=False,
                          workers=None, expect=None) -> None:
    from bitdrift.analysis.eqc import PRECISION_COLUMNS, PRECISION_EXTRA_COLUMNS, precision_rows
    from bitdrift.atomic import write_csv

    rows = precision_rows(open_checked(files, expect, recheck=True), precision=precision,
                          significant=significant_bits,
                          workers=workers if workers is not None else default_workers())
    write_csv(rows, out, columns=PRECISION_COLUMNS + PRECISION_EXTRA_COLUMNS)


def cmd_precision(args) -> None:
    write_precision_table(args.files, args.out, args.precision, args.significant_bits,
                          args.workers, args.expect)


@outputs_together
def write_effective_precision_table(files, out, expect=None) -> None:
    from bitdrift.analysis.effective_precision import (
        TABLE_COLUMNS,
        effective_precision_table,
        summary,
    )
    from bitdrift.atomic import write_csv

    records = open_checked(files, expect, recheck=True)
    rows = effective_precision_table(records)
    write_csv(rows, out, columns=TABLE_COLUMNS)
    reduced = [f"{record.device} ({record.model}): {summary(record.effective_precision)}"
               for record in records if summary(record.effective_precision).startswith("red")]
    source = "recomputed from the records and the model files" if expect else \
        "as the records say (give --expect MODEL MODEL_FILE DATASET_FILE to recompute)"
    print(f"bitdrift: {len(rows)} layer checks, {source}; computed below the declared "
          f"precision: {'; '.join(reduced) or 'none'} -> {out}", file=sys.stderr)


def cmd_effective_precision(args) -> None:
    write_effective_precision_table(args.files, args.out, args.expect)


@outputs_together
def write_divergence_table(files, out, expect=None) -> None:
    from bitdrift.analysis.divergence import divergence_table
    from bitdrift.atomic import write_csv

    write_csv(divergence_table(open_checked(files, expect)), out)


def cmd_divergence(args) -> None:
    write_divergence_table(args.files, args.out, args.expect)


@outputs_together
def write_explain_tables(files, out, flags_out=None, classes_out=None, layers=False,
                         time_budget=10.0, expect=None) -> None:
    from bitdrift.analysis.explain import explain_table
    from bitdrift.atomic import write_csv

    explain, flags, classes = explain_table(open_checked(files, expect), layers=layers,
                                            time_budget=time_budget)
    write_csv(explain, out)
    if flags_out:
        write_csv(flags, flags_out)
    if classes_out:
        write_csv(classes, classes_out)


def cmd_explain(args) -> None:
    write_explain_tables(args.files, args.out, args.flags_out, args.classes_out,
                         args.layers, args.time_budget, args.expect)


@outputs_together
def write_agreement_table(files, out, expect=None) -> None:
    from bitdrift.atomic import write_csv
    from bitdrift.backends.keras.export import AGREEMENT_COLUMNS, agreement_table

    rows = agreement_table(open_checked(files, expect))
    write_csv(rows, out, columns=AGREEMENT_COLUMNS)
    shares = [row["share"] for row in rows if isinstance(row.get("share"), float)]
    print(f"bitdrift: {len(shares)} records' predicted labels checked against TensorFlow's"
          + (f"; the lowest share agreeing {min(shares):.2%}" if shares else "")
          + f"; wrote {out}")


def cmd_agreement(args) -> None:
    write_agreement_table(args.files, args.out, args.expect)


@outputs_together
def write_observer_table(files, out, expect=None) -> None:
    from bitdrift.analysis.observer import OBSERVER_COLUMNS, changed_devices, observer_table
    from bitdrift.atomic import write_csv

    rows = observer_table(open_checked(files, expect))
    write_csv(rows, out, columns=OBSERVER_COLUMNS)
    checked = [row for row in rows if row["observer_equal"] != "unchecked"]
    changed = changed_devices(rows)
    print(f"bitdrift: the deployed model's final output equals the instrumented run's on "
          f"{len(checked) - len(changed)} of {len(checked)} checked records"
          + (f"; instrumentation changed it on {', '.join(r['device'] for r in changed)}"
             if changed else "") + f"; wrote {out}", file=sys.stderr)


def cmd_observer(args) -> None:
    write_observer_table(args.files, args.out, args.expect)


@outputs_together
def write_failures_table(files, out) -> None:
    from bitdrift.atomic import write_csv
    from bitdrift.record.failures import TABLE_COLUMNS, failure_rows

    rows = failure_rows(files)
    write_csv(rows, out, columns=TABLE_COLUMNS)
    print(f"bitdrift: {len(rows)} failed device(s) among {len(files)} files -> "
          f"{out}", file=sys.stderr)


def cmd_failures(args) -> None:
    write_failures_table(args.files, args.out)


@outputs_together
def write_findings_of_run(files, tables, out, rst_out=None, figure=None,
                          study_sections=(), planned=None) -> None:
    """findings.md (and the report's .rst) from the records and the run's tables: the
    folder ``tables`` (each table there by its name), or {name: CSV path} (the workflow's
    inputs: a table the run did not make is absent, never an older run's file left in the
    folder); the studies' own sections (bitdrift.report.findings.StudySection,
    which the caller gathers from the studies' registry: the core knows no study); the
    workflow's notes on the devices of each model (``planned``: bitdrift.plan)."""
    from pathlib import Path

    from bitdrift.report.findings import TABLES, write_findings

    names = (*TABLES, *(name for section in study_sections for name in section.tables))
    found = {name: tables[name] for name in names if name in tables} \
        if isinstance(tables, dict) else {name: Path(tables) / f"{name}.csv" for name in names}
    sections = write_findings(found, files, out, rst_out, figure, study_sections, planned)
    print(f"bitdrift: {sum(len(lines) for _, lines in sections)} findings in "
          f"{len(sections)} sections -> {out}", file=sys.stderr)


def cmd_findings(args) -> None:
    # the studies' sections: bitdrift.cli, which registers the studies, gives them
    write_findings_of_run(args.files, args.tables, args.out, args.rst_out, args.figure,
                          args.study_sections())


def add_commands(sub) -> None:
    """Register these commands on the `bitdrift` subparsers."""
    p = sub.add_parser("eqc", help="equivalence classes of inference records")
    p.add_argument("files", nargs="+", help="records; devices are ordered as given")
    p.add_argument("--out", required=True, help="final-output table (CSV)")
    p.add_argument("--layers-out", help="per-layer table (CSV)")
    expect_option(p)
    p.set_defaults(func=cmd_eqc, recheck=True)

    p = sub.add_parser("precision", help="remaining precision per layer")
    p.add_argument("files", nargs="+", help="records of one model and sample set")
    p.add_argument("--out", required=True, help="table (CSV)")
    expect_option(p)
    p.add_argument("--precision", choices=list(PRECISIONS),
                   help="devices of this precision enter (default: the one all records share)")
    p.add_argument("--significant-bits", action="store_true",
                   help="add the statistical significant bits the devices share per layer "
                   "(significantdigits: CNH, relative error, base 2) against the model's "
                   "float64 device where there is one, else the devices' mean")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="processes analysing layers in parallel, each holding one layer over "
                   "all devices (default: the CPUs available, at most 4)")
    p.set_defaults(func=cmd_precision, recheck=True)

    p = sub.add_parser("effective-precision", help="did each device compute in its declared "
                       "precision: every Dense/Conv layer recomputed from the record")
    p.add_argument("files", nargs="+", help="records")
    p.add_argument("--out", required=True, help="effective_precision.csv")
    expect_option(p)
    p.set_defaults(func=cmd_effective_precision, recheck=True)

    p = sub.add_parser("divergence", help="first layer where two classes differ")
    p.add_argument("files", nargs="+", help="records with per-layer outputs")
    p.add_argument("--out", required=True, help="divergence.csv")
    expect_option(p)
    p.set_defaults(func=cmd_divergence)

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
    expect_option(p)
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("agreement", help="does each runtime class the test images as "
                       "TensorFlow does (the argmax check), and which layers it exposes")
    p.add_argument("files", nargs="+", help="records")
    p.add_argument("--out", required=True, help="argmax_agreement.csv")
    expect_option(p)
    p.set_defaults(func=cmd_agreement)

    p = sub.add_parser("observer", help="the observer check: does each device's deployed "
                       "model (final output only) give the instrumented run's final output, "
                       "bit for bit (observer_check.csv)")
    p.add_argument("files", nargs="+", help="records")
    p.add_argument("--out", required=True, help="observer_check.csv")
    expect_option(p)
    p.set_defaults(func=cmd_observer)

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
    p.add_argument("--figure", help="the EQC figure's PNG, shown after the classes (linked "
                   "in findings.md, inline in the report)")
    p.set_defaults(func=cmd_findings, study_sections=list)
