"""The conda environments must pin what requirements.txt and requirements-nodeps.txt
pin."""

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def pins(lines):
    return dict(line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))


def test_conda_environment_matches_requirements():
    requirements = pins((ROOT / "requirements.txt").read_text().split()
                        + (ROOT / "requirements-nodeps.txt").read_text().split())
    env = yaml.safe_load((ROOT / "envs/bitdrift.yaml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    conda_pins = pins(pip_section)
    for name in ("snakemake", "snakemake-executor-plugin-slurm"):
        requirements.pop(name)  # the workflow manager runs outside the job environment
    assert conda_pins == requirements
