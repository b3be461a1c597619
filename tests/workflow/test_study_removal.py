"""A study is wholly removable: delete its files (its package, its two rule files and the
scripts and report captions only they use) and its four entries (the registry, the
Snakefile's include, the schema's section, config.yaml's section), and the workflow still
plans every other target and the command line still works."""

import argparse
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bitdrift.studies import STUDIES
from tests.utils import ROOT, copy_checkout

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# The config section of each study (its schema property)
SECTIONS = {"ablation": "ablation", "batching": "batching", "maxpool": "maxpool",
            "probes": "probes", "variance": "training_variance"}
def used_files(rule_file: Path) -> set[str]:
    """The scripts and report captions a rule file names (relative to the checkout)."""
    text = rule_file.read_text()
    return {str((rule_file.parent / name).resolve().relative_to(ROOT))
            for name in re.findall(r'"(\.\./workflow/[^"]+)"', text)}


def remove_study(checkout: Path, study: str) -> None:
    rules = [ROOT / "rules" / f"{study}.smk", ROOT / "rules" / f"{study}_common.smk"]
    own = set().union(*(used_files(file) for file in rules))
    others = set().union(*(used_files(file) for file in (ROOT / "rules").glob("*.smk")
                           if file not in rules))
    for name in own - others:  # a script or caption only this study uses
        (checkout / name).unlink()
    for file in rules:
        (checkout / "rules" / file.name).unlink()
    shutil.rmtree(checkout / "src/bitdrift/studies" / study)
    # The four entries
    registry = checkout / "src/bitdrift/studies/__init__.py"
    text = registry.read_text()
    assert f'"{study}", ' in text or f', "{study}"' in text
    registry.write_text(text.replace(f'"{study}", ', "").replace(f', "{study}"', ""))
    snakefile = checkout / "Snakefile"
    include = f'include: "rules/{study}.smk"\n'
    assert include in snakefile.read_text()
    snakefile.write_text(snakefile.read_text().replace(include, ""))
    schema_file = checkout / "src/bitdrift/config.schema.yaml"
    schema = yaml.safe_load(schema_file.read_text())
    del schema["properties"][SECTIONS[study]]
    schema_file.write_text(yaml.safe_dump(schema, sort_keys=False))
    config_file = checkout / "config.yaml"
    config = yaml.safe_load(config_file.read_text())
    config.pop(SECTIONS[study], None)
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))


@pytest.fixture(scope="module")
def pristine_checkout(tmp_path_factory):
    """A copy of the checkout, every study in place, that plans `all` (a dry run): the
    state each test removes its study from. Every copy is alike, so one is planned."""
    checkout = copy_checkout(tmp_path_factory.mktemp("pristine") / "checkout")
    before = subprocess.run([SNAKEMAKE, "-n", "all"], cwd=checkout, capture_output=True,
                            text=True, timeout=300)
    assert before.returncode == 0, before.stderr[-2000:]
    return checkout


@pytest.mark.parametrize("study", STUDIES)
def test_a_study_is_removable_by_its_files_and_four_entries(pristine_checkout, tmp_path,
                                                            study):
    checkout = copy_checkout(tmp_path / "checkout")  # as pristine_checkout was made
    remove_study(checkout, study)
    # The copy's library comes first: the Snakefile puts its src/ on the path, and so do we
    environment = {**os.environ, "PYTHONPATH": str(checkout / "src")}
    after = subprocess.run([SNAKEMAKE, "-n", "all"], cwd=checkout, capture_output=True,
                           text=True, timeout=300, env=environment)
    assert after.returncode == 0, after.stdout[-2000:] + after.stderr[-2000:]
    planned = set(re.findall(r"^rule (\w+):", after.stdout, re.M))
    assert {"run_inference", "cluster_equivalence_classes", "write_findings"} <= planned
    removed = set(re.findall(r"^rule (\w+):",
                             (ROOT / "rules" / f"{study}.smk").read_text(), re.M))
    assert not removed & planned
    commands = subprocess.run(
        [sys.executable, "-c", "from bitdrift.cli import main; main(['--help'])"],
        cwd=checkout, capture_output=True, text=True, timeout=120, env=environment)
    assert commands.returncode == 0, commands.stderr[-2000:]
    registered = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(f"bitdrift.studies.{study}.cli").add_commands(registered)
    study_commands = set(registered.choices)
    # `bitdrift --help` lists a command as a line of its group: two spaces, its name
    listed = set(re.findall(r"^  ([a-z0-9-]+)\s", commands.stdout, re.M))
    assert study_commands and not study_commands & listed
    assert "eqc" in listed
