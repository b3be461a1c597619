"""The ``bitdrift`` command line: every workflow step is a subcommand, so results gathered
outside the scheduler (a cloud VM, a laptop GPU) are produced and analysed with the same
code. The analysis subcommands (eqc, precision, plot-*) never import TensorFlow or torch.
The core's commands live in ``bitdrift.commands.*`` and each study's in
``bitdrift.studies.*.cli``; each module registers its own with ``add_commands``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from bitdrift.commands import MODULES
from bitdrift.commands.common import refuse_overwriting
from bitdrift.errors import EXIT_CODES, BitdriftError, ConfigError
from bitdrift.studies import STUDIES, findings_sections

DESCRIPTION = ("Measure how neural-network results drift when only the tooling changes: run a "
               "model on many devices, record every layer, and find where the results part "
               "ways; plus the MaxPool and training-variance studies.")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bitdrift")
    except PackageNotFoundError:  # run from a checkout without installing
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """--version, looked up only when asked (importlib.metadata costs ~20 ms per command)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog} {_version()}")
        parser.exit()


# `bitdrift --help` lists the core's commands by what a user is doing, in this order, and
# then each study's under its name. A core command missing here is listed under "other
# commands" (tests/unit/test_layout.py fails on it).
HELP_GROUPS = {
    "run and measure (what the workflow's jobs run)": (
        "prepare-dataset", "train", "export", "quantize", "infer"),
    "analyse records: tables and findings": (
        "eqc", "precision", "effective-precision", "divergence", "explain", "kernels",
        "agreement", "observer", "failures", "findings"),
    "figures from the tables (PDF)": (
        "plot-eqc", "plot-eqc-table", "plot-precision", "plot-divergence", "plot-kernels",
        "plot-orders", "plot-generations"),
    "inspect and reproduce records": ("repro", "identify", "index", "atlas", "import-published"),
    "emulated CPUs: check and install": ("emulation-check", "install-qemu", "install-aarch64"),
}
OTHER_COMMANDS = "other commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bitdrift", description=DESCRIPTION, usage="%(prog)s [-h] [--version] COMMAND ...",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction, nargs=0,
                        help="show the installed version and exit")
    # prog: a command's usage reads `bitdrift eqc ...`, not the usage line above
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                prog="bitdrift")
    for module in MODULES:
        importlib.import_module(f"bitdrift.commands.{module}").add_commands(sub)
    study_commands = {}
    for study in STUDIES:
        before = set(sub.choices)
        importlib.import_module(f"bitdrift.studies.{study}.cli").add_commands(sub)
        study_commands[f"the {study} study"] = [n for n in sub.choices if n not in before]
    # The core's `findings` writes the studies' own sections too: given here, where the
    # studies are registered (the core never imports a study)
    sub.choices["findings"].set_defaults(study_sections=findings_sections)
    _group_commands_in_help(parser, sub, {**HELP_GROUPS, **study_commands})
    return parser


def _group_commands_in_help(parser, sub, groups: dict) -> None:
    """One help section per group in place of argparse's one flat list: each command's help
    line (argparse's entry for it) goes into its group's section; the subcommand action
    itself still parses, hidden from the help."""
    entries = {entry.dest: entry for entry in sub._choices_actions}
    placed = {name for names in groups.values() for name in names}
    others = [name for name in entries if name not in placed]
    for title, names in {**groups, **({OTHER_COMMANDS: others} if others else {})}.items():
        section = parser.add_argument_group(title)
        section._group_actions.extend(entries[name] for name in names if name in entries)
    sub.help = argparse.SUPPRESS


# A command whose outputs are records, models, datasets or probe files says so with
# `set_defaults(writes_data=True)` beside its parser (the studies' too); every other
# command writes tables (CSV) or figures (PDF), never over an HDF5 or Keras file.
INPUT_OPTIONS = ("files", "table", "tables", "eqc", "config", "model_file", "dataset_file",
                 "classes", "eqc_layers", "precision_table", "record", "against", "reference",
                 "export", "divergence", "coverage", "index", "probes", "evaluation",
                 "records", "figure", "folder", "inputs")
OUTPUT_OPTIONS = ("out", "rst_out", "layers_out", "out_model", "out_history", "out_logits",
                  "flags_out", "classes_out", "table_out", "coverage_out", "orders_out",
                  "refused_out", "figure_out")


def check_outputs(args) -> None:
    """Outputs are never inputs, nor each other: a shell glob that puts a record after
    --out, or --out naming one of the inputs or another output, must not replace a file;
    an --out-dir must be a folder."""
    from bitdrift.atomic import is_data_file

    inputs = {"--" + option.replace("_", "-"): getattr(args, option, None)
              for option in INPUT_OPTIONS if getattr(args, option, None)}
    outputs = {"--" + option.replace("_", "-"): getattr(args, option, None)
               for option in OUTPUT_OPTIONS if getattr(args, option, None)}
    folders = {"--out"} if getattr(args, "out_folder", False) else set()
    # every output path, a folder's too, passes one check (bitdrift.atomic.check_output)
    refuse_overwriting(inputs, {**outputs, "--out-dir": getattr(args, "out_dir", None)},
                       folders=folders | {"--out-dir"})
    for flag, out in outputs.items():
        if flag not in folders and not getattr(args, "writes_data", False) \
                and is_data_file(out):
            raise ConfigError(f"{flag} {out} is a record, model or dataset file (HDF5/Keras); "
                              "this command writes a table or figure, refusing to overwrite it")


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
