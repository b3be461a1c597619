"""README's "Add your model" command, run as a user types it from the checkout's profile:
`snakemake --profile profiles/local all --configfile mine.yaml`. A config file given so
replaces config.yaml (a second one overlays it key by key), the run writes into its
`workdir`, and relative paths in it are relative to that folder. A target written after
`--configfile`, or a config file that is not there, is one line, not Snakemake's
traceback (Snakemake reads config files before the Snakefile; the local profile's logger
says it: snakemake_logger_plugin_bitdrift.missing_config_file)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bitdrift.inputs.examples import onnx_cnn
from tests.utils import ROOT

pytestmark = pytest.mark.workflow
SNAKEMAKE = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
             "--profile", str(ROOT / "profiles/local")]
DEVICE = {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1}


def snakemake_in(folder: Path, *arguments: str) -> tuple[int, list[str]]:
    """Exit status and output lines, without Snakemake's line naming the profiles it read
    (printed before any logger exists)."""
    done = subprocess.run([*SNAKEMAKE, *arguments], cwd=folder, capture_output=True,
                          text=True, timeout=600)
    lines = (done.stdout + done.stderr).splitlines()
    return done.returncode, [line for line in lines if not line.startswith("Using profile")]


def planned_devices(lines: list[str]) -> set[str]:
    """The devices of a dry run's run_inference jobs."""
    return {match.group(1) for line in lines
            if (match := re.search(r"wildcards: model=\w+, device=(\w+)", line))}


def user_config(folder: Path) -> Path:
    """mine.yaml: a user's ONNX model in the run's own folder, named relative to it."""
    workdir = folder / "runs/mine"
    workdir.mkdir(parents=True)
    onnx_cnn.write(workdir / "model.onnx", workdir / "inputs.npy", samples=4)
    config = {"workdir": "runs/mine", "samples": [0, 1],
              "models": {"mine": {"file": "model.onnx", "inputs": "inputs.npy"}},
              "devices": {"ort": DEVICE}}
    (folder / "mine.yaml").write_text(yaml.safe_dump(config))
    return folder / "mine.yaml"


def test_a_target_after_configfile_is_one_line(tmp_path):
    user_config(tmp_path)
    status, lines = snakemake_in(tmp_path, "all", "--configfile", "mine.yaml", "all")
    assert status == 1
    assert lines == [f"bitdrift: config file 'all' does not exist (in {tmp_path}): "
                     "--configfile takes every word after it as a config file, so put "
                     "targets first: snakemake --profile profiles/local all --configfile "
                     "mine.yaml"]


def test_a_config_file_that_is_not_there_is_one_line_in_a_dry_run_too(tmp_path):
    status, lines = snakemake_in(tmp_path, "-n", "all", "--configfile", "mnie.yaml")
    assert status == 1
    assert lines == [f"bitdrift: config file 'mnie.yaml' does not exist (in {tmp_path}); "
                     "check its path (the presets are in config/presets/)"]


def test_the_full_view_keeps_snakemakes_message(tmp_path):
    status, lines = snakemake_in(tmp_path, "--logger-bitdrift-full", "--configfile", "x.yaml")
    assert status == 1
    assert "Traceback (most recent call last):" in lines
    assert lines[-1] == "FileNotFoundError: [Errno 2] No such file or directory: 'x.yaml'"


def test_the_readme_command_replaces_config_yaml_and_runs_in_its_workdir(tmp_path):
    user_config(tmp_path)
    status, lines = snakemake_in(tmp_path, "-n", "all", "--configfile", "mine.yaml")
    assert status == 0, lines
    # config.yaml's devices are not merged in: only mine.yaml's device runs
    assert planned_devices(lines) == {"ort"}
    assert "    output: results/inference/mine/ort.h5" in lines  # under runs/mine
    assert not (tmp_path / "results").exists() and (tmp_path / "runs/mine").is_dir()
    # A second config file overlays the first key by key: one device more, the first kept
    (tmp_path / "more.yaml").write_text(yaml.safe_dump({"devices": {"ort_2t": {
        **DEVICE, "threads": 2}}}))
    status, lines = snakemake_in(tmp_path, "-n", "all", "--configfile", "mine.yaml",
                                 "more.yaml")
    assert status == 0, lines
    assert planned_devices(lines) == {"ort", "ort_2t"}


def test_relative_paths_in_the_config_are_relative_to_its_workdir(tmp_path):
    config = user_config(tmp_path)
    (tmp_path / "runs/mine/model.onnx").rename(tmp_path / "model.onnx")  # beside mine.yaml
    status, lines = snakemake_in(tmp_path, "-n", "all", "--configfile", config.name)
    assert status == 1
    assert (f"config key models.mine.file: model.onnx does not exist (in "
            f"{tmp_path / 'runs/mine'}), and no rule of the workflow makes it") in lines
