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
        "run.provenance", "atomic", "errors", "runtimes", "report.findings",
        "commands.tables", "plan")


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


# -- the import graph: the layout is the architecture ----------------------------------------
# The stages bottom to top (docs/layout.md draws them): a module may import its own stage and
# those below it, never one above. The flat modules are stages of their own.
STAGES = ("errors", "atomic", "jobs", "progress", "paths", "runtimes", "record", "inputs",
          "formats", "analysis", "emulation", "backends", "run", "atlas", "report", "config",
          "commands", "studies", "plan", "cli", "__main__")
# The one import that runs up: the config's validation asks each study to check its own
# section (through the registry bitdrift.studies), and the studies' checks use the config's
# helpers.
UPWARD = {("config", "studies")}


def import_graph() -> dict[str, dict[str, int]]:
    """{module: {imported bitdrift module: line}} of every import in src/bitdrift, those
    inside functions too (most imports are there, for start-up time), read from the source."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "src"
    files = {}
    for path in (root / "bitdrift").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if package else parts)
        files[name] = (path, package)

    def module(name):  # the longest known module a dotted name starts with
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, (path, package) in files.items():
        here = name if package else name.rpartition(".")[0]
        found = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1]
                                    + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                target = module(target)
                if target.startswith("bitdrift") and target != name:
                    found.setdefault(target, node.lineno)
        graph[name] = found
    return graph


def stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "bitdrift"


def test_no_module_imports_a_stage_above_its_own():
    graph = import_graph()
    assert len(graph) > 100 and all(stage(m) in (*STAGES, "bitdrift") for m in graph), \
        sorted({stage(m) for m in graph} - set(STAGES))
    upward = [f"{module}:{line} imports {target}"
              for module, targets in graph.items() for target, line in targets.items()
              if stage(target) != "bitdrift" and stage(module) != "bitdrift"
              and STAGES.index(stage(target)) > STAGES.index(stage(module))
              and (stage(module), stage(target)) not in UPWARD]
    assert upward == [], "\n".join(upward)


def test_no_import_circles_between_modules():
    """Tarjan's strongly connected components of the module graph: each a single module."""
    graph = import_graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert circles == []


def test_the_import_graph_is_read_whole():
    """The graph the two tests above check is the code's: an import inside a function
    counts, and a known circle drawn by hand is found."""
    graph = import_graph()
    # run.inference imports the backends inside its functions only (start-up time)
    assert any(stage(target) == "backends" for target in graph["bitdrift.run.inference"])
    assert "bitdrift.errors" in graph["bitdrift.atomic"]


def test_docs_layout_names_every_stage_and_module():
    """docs/layout.md draws the stages in the order the import test holds them to, and names
    every package and module of the core, so it cannot fall behind the tree."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    docs = (root / "docs" / "layout.md").read_text()
    drawn = re.search(r"```\n(.*?)```", docs[docs.index("## The library"):], re.S).group(1)
    level = {word.rstrip("/"): height  # the bottom line is level 0
             for height, line in enumerate(drawn.splitlines()[::-1])
             for word in line.split("   ")[0].split()}
    assert set(STAGES) - {"__main__"} <= set(level)
    assert all(level[lower] <= level[upper]
               for lower, upper in zip(STAGES[:-2], STAGES[1:-1], strict=True))
    package = root / "src" / "bitdrift"
    missing = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                     if path.parts[len(package.parts)] != "studies"
                     and path.stem not in ("__init__", "__main__")
                     and f"`{path.stem}`" not in docs and f"`{path.stem}/`" not in docs)
    assert missing == []
