"""The layout the README promises: the core never imports a study; every domain error is a
BitdriftError that the command line reports on one line; every option has help."""

import subprocess
import sys

import pytest

from bitdrift import errors
from bitdrift.cli import build_parser, main

CORE = ("record.hdf5", "record.reader", "record.writer", "record.repeats",
        "analysis.eqc", "analysis.remaining_precision",
        "run.inference", "run.repeat",
        "run.devices", "inputs.models", "inputs.datasets", "run.training", "paths",
        "run.provenance", "atomic", "errors", "runtimes")


@pytest.mark.parametrize("module", CORE)
def test_the_core_imports_no_study(module):
    code = (f"import sys, bitdrift.{module}; "
            "loaded = [m for m in sys.modules if m.startswith('bitdrift.studies')]; "
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_domain_error_is_a_bitdrift_error():
    for name in ("ConfigError", "PlanError", "DatasetError", "RecordError", "StudyError",
                 "AcceleratorMissing", "InferenceError", "TrainingRunError"):
        cls = getattr(errors, name)
        assert issubclass(cls, errors.BitdriftError), name
        assert f"  {cls.exit_code}  " in errors.EXIT_CODES, name


def test_the_documented_exit_statuses_are_those_the_command_line_lists():
    """docs/layout.md's table of exit statuses and `bitdrift --help`'s (errors.EXIT_CODES)
    say the same, status by status, and every error class's status is among them."""
    import re
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "layout.md").read_text()
    table = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", docs, re.MULTILINE))
    listed = dict(re.findall(r"^  (\d+)  (.+)$", errors.EXIT_CODES, re.MULTILINE))
    assert table == listed and len(listed) >= 7
    classes = [value for value in vars(errors).values()
               if isinstance(value, type) and issubclass(value, errors.BitdriftError)]
    assert {str(cls.exit_code) for cls in classes} <= set(listed)


def test_errors_are_one_line_with_their_exit_code(tmp_path, capsys):
    missing = tmp_path / "missing.h5"
    assert main(["eqc", str(missing), "--out", str(tmp_path / "e.csv")]) == 3
    message = capsys.readouterr().err.strip()
    assert message.startswith("bitdrift: error: ") and "missing.h5" in message
    assert "\n" not in message and "Traceback" not in message
    config = tmp_path / "c.yaml"
    config.write_text("datasets: {d: {source: digits}}\n"
                      "models: {n: {architecture: cifar10_small, dataset: d}}\n"
                      "devices: {cpu: {accelerator: cpu, backend: torch}}\n")
    assert main(["infer", "--config", str(config), "--model", "m", "--device", "x"]) == 2
    assert "unknown model 'm'" in capsys.readouterr().err


def test_every_option_has_help_and_the_version_prints(capsys):
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, command in commands.items():
        for action in command._actions:
            if action.dest != "help":
                assert action.help, f"bitdrift {name}: {action.dest} has no help"
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("bitdrift ")


def test_each_command_is_registered_beside_its_handler():
    """The core's commands follow the studies' pattern: a module's add_commands registers
    only handlers of that module, and no command is registered twice."""
    import argparse
    import importlib

    from bitdrift.commands import MODULES
    from bitdrift.studies import STUDIES

    seen = set()
    for package in ([f"bitdrift.commands.{m}" for m in MODULES]
                    + [f"bitdrift.studies.{s}.cli" for s in STUDIES]):
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(package).add_commands(sub)
        assert sub.choices, f"{package} registers no command"
        for name, command in sub.choices.items():
            handler = command.get_default("func")
            assert handler.__module__ == package, (name, handler.__module__, package)
            assert name not in seen, f"{name} registered twice"
            seen.add(name)
    assert seen == set(build_parser()._subparsers._group_actions[0].choices)


def test_every_command_is_listed_under_exactly_one_group_in_the_help(capsys):
    """`bitdrift --help` lists the commands by what a user is doing: every command the
    parser accepts is under one group's heading, once, and none is left to "other"."""
    import re

    from bitdrift.cli import HELP_GROUPS, OTHER_COMMANDS

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    headings = {}  # command -> the headings it is listed under
    heading = None
    for line in text.splitlines():
        if line and not line.startswith(" "):
            heading = line.rstrip(":")
        found = re.match(r"^  ([a-z0-9][a-z0-9-]*)(?:\s|$)", line)
        if found:
            headings.setdefault(found.group(1), []).append(heading)
    commands = set(build_parser()._subparsers._group_actions[0].choices)
    assert len(commands) > 40
    for command in commands:
        assert len(headings.get(command, [])) == 1, (command, headings.get(command))
        assert headings[command][0] != OTHER_COMMANDS, command
    # the core's groups, then one per study, and every heading the help shows is one of them
    assert set(HELP_GROUPS) <= {h for names in headings.values() for h in names}
    assert "options" not in {h for c in commands for h in headings[c]}
    # each command still parses: a bare command asks for its own arguments, by its own name
    for command in sorted(commands):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        assert capsys.readouterr().out.startswith(f"usage: bitdrift {command} ")
