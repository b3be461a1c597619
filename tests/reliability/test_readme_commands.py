"""Every `bitdrift` command the README shows runs as written (`maxpool-volume-table` once
crashed on an attribute its parser never set). The commands are read from README.md itself;
`FILE...` stands for the records, `SOMEONES_RECORD.h5` for one of them."""

import re
import shutil
import subprocess
import sys

import pytest

from tests.utils import ROOT

pytestmark = pytest.mark.workflow


def readme_commands() -> list[str]:
    """The `bitdrift ...` lines of README's bash blocks, continuations joined, comments
    dropped."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("bitdrift "):
                commands.append(" ".join(line.split()))
    return commands


def bitdrift(folder, *args):
    return subprocess.run([sys.executable, "-m", "bitdrift", *args], cwd=folder,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A folder with the README's names in place: config, dataset, model, records of two
    devices, and a second training run of the noise plan (the gallery needs two)."""
    folder = tmp_path_factory.mktemp("readme")
    shutil.copy(ROOT / "tests/config/readme.yaml", folder / "config.yaml")
    for args in (["prepare-dataset", "--config", "config.yaml", "--dataset", "digits"],
                 ["train", "--config", "config.yaml", "--model", "cifar10_small", "--seed",
                  "1"],
                 ["train-run", "--config", "config.yaml", "--plan", "noise", "--arm", "algo",
                  "--device", "tf_2threads", "--run", "1"]):
        done = bitdrift(folder, *args)
        assert done.returncode == 0, done.stderr[-3000:]
    shutil.copy(folder / "results/datasets/digits.h5", folder / "digits.h5")
    shutil.copy(folder / "results/models/cifar10_small/seed_1/model.keras",
                folder / "model.keras")
    for device in ("tf_1thread", "tf_2threads"):
        done = bitdrift(folder, "infer", "--config", "config.yaml", "--model",
                        "cifar10_small", "--device", device, "--out", f"records/{device}.h5")
        assert done.returncode == 0, done.stderr[-3000:]
    return folder


def test_the_readme_shows_the_commands_this_test_runs():
    commands = readme_commands()
    assert len(commands) >= 20
    assert any(command.startswith("bitdrift maxpool-volume-table") for command in commands)


def test_every_readme_command_runs_as_written(folder):
    failures = []
    for command in readme_commands():
        line = command.replace("FILE...", "records/tf_1thread.h5 records/tf_2threads.h5")
        line = line.replace("SOMEONES_RECORD.h5", "records/tf_2threads.h5")
        line = line.replace("RECORD_A.h5 RECORD_B.h5",
                            "records/tf_1thread.h5 records/tf_2threads.h5")
        done = subprocess.run(["bash", "-c", line.replace("bitdrift ", f"{sys.executable} "
                                                          "-m bitdrift ", 1)],
                              cwd=folder, capture_output=True, text=True, timeout=600)
        allowed = {0}
        if command.startswith("bitdrift identify"):
            allowed = {0, 1}  # matched or not: both are answers
        if command.startswith("bitdrift repro"):
            # two thread counts may give the same bits on this CPU: nothing to reproduce
            # (exit 1); tests/unit/test_repro.py checks real splits
            allowed = {0, 1}
        if "my_laptop_gpu" in command:  # a GPU device on a machine without one: exit 5,
            allowed = {5}  # refusing to fall back to the CPU, as the README says
        if done.returncode not in allowed or "Traceback" in done.stderr:
            failures.append(f"{command}: exit {done.returncode}: {done.stderr[-600:]}")
    assert not failures, "\n".join(failures)
