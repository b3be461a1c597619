"""`snakemake probes` on the default config (dry run): the search once, on its search
devices' node; every other device of their precision held out, running only the
evaluation set."""

import pytest

from bitdrift.config import load_config
from tests.utils import ROOT, snakemake
from tests.workflow.test_presets import dry_run_jobs

pytestmark = pytest.mark.workflow


def test_the_probe_dag_runs_the_search_once_and_every_float32_device_on_the_probes(tmp_path):
    config = load_config(ROOT / "config.yaml")
    search = config["probes"]["search_devices"]
    # Counted from the config itself: scheduled devices of the search devices' precision.
    float32 = [name for name, device in config["devices"].items()
               if device["precision"] == "float32" and not device["external"]]
    assert set(search) < set(float32)
    output = snakemake(tmp_path, "probes", "-n", configfile=ROOT / "config.yaml")
    jobs = dry_run_jobs(output)
    rules = [job["rule"] for job in jobs]
    assert rules.count("search_probes") == 1
    assert rules.count("evaluate_probes") == 1
    evaluated = sorted(job["wildcards"]["device"] for job in jobs
                       if job["rule"] == "run_probe_inference")
    assert evaluated == sorted(float32)
    assert "run_inference" not in rules  # the probes need no record of the default samples
    # The probe and evaluation files are targets themselves: one deleted by a killed job is
    # made again even while the tables after it exist.
    target = output[output.index("rule probes:"):].split("\n")[1]
    assert "results/probes/cifar10_small/probes.h5" in target
    assert "results/probes/cifar10_small/evaluation.h5" in target
