"""The workflow through `--profile profiles/slurm-gpu` on a real single-node SLURM cluster.

Scheduling is read back from SLURM's own records (`scontrol show job`), and the records
must equal those of the local run bit for bit.
"""

import os
import shutil

import h5py
import numpy as np
import pandas as pd
import pytest
import yaml

from bitdrift.record.reader import Record
from tests.cluster.slurm import ClusterUnavailable, SlurmCluster
from tests.utils import ROOT, snakemake, write_inputs

pytestmark = pytest.mark.workflow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except ClusterUnavailable as error:
        # CI sets BITDRIFT_REQUIRE_SLURM: there the cluster must start, never skip.
        if os.environ.get("BITDRIFT_REQUIRE_SLURM"):
            pytest.fail(f"SLURM test cluster required but not started: {error}")
        pytest.skip(f"SLURM test cluster cannot be started here: {error}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def slurm_run(cluster, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slurm_workflow")
    configs = [workdir / "config.yaml", workdir / "slurm.yaml"]
    shutil.copy(ROOT / "tests/config/config.yaml", configs[0])
    shutil.copy(ROOT / "tests/config/slurm.yaml", configs[1])
    write_inputs(workdir)
    profile = ["--profile", str(ROOT / "profiles/slurm-gpu"),
               # the plugin waits 40 s before its first status check by default
               "--slurm-init-seconds-before-status-checks", "2"]
    try:
        snakemake(workdir, "all", configfile=configs, executor=profile, env=cluster.env,
                  timeout=900)
    except AssertionError:
        print(cluster.logs())
        raise
    settings = {}
    for config in configs:  # the overlay merges into the base, as in Snakemake
        merge(settings, yaml.safe_load(config.read_text()))
    return workdir, settings, cluster.jobs()


def merge(base, overlay):
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value


def jobs_of(jobs, rule, wildcard=""):
    return [job for job in jobs if job.get("Comment", "").startswith(f"rule_{rule}")
            and job["Comment"].endswith(wildcard)]


def test_each_device_ran_on_its_partition_with_its_gres(slurm_run):
    _, settings, jobs = slurm_run
    for device, entry in settings["devices"].items():
        resources = entry.get("resources", {})
        # the device's job for the study's model (the atlas comparison's reference model
        # runs on its atlas devices as a job of its own, on the same partition)
        (job,) = [job for job in jobs_of(jobs, "run_inference", f"_{device}")
                  if "atlas_reference" not in job["Comment"]]
        assert job["JobState"] == "COMPLETED", job
        assert job["Partition"] == resources.get("slurm_partition", "cpu"), (device, job)
        requested = " ".join([job.get("TresPerJob", ""), job.get("TresPerNode", "")])
        if "gpu" in resources:
            assert f"gres:gpu:{resources['gpu']}" in requested, (device, job)
        if "gres" in resources:
            assert f"gres:{resources['gres']}" in requested, (device, job)
        if not {"gpu", "gres"} & set(resources):
            assert "gres" not in requested, (device, job)
        if "constraint" in resources:
            assert job["Features"] == resources["constraint"], (device, job)
        if "mem_mb" in resources:
            assert job["MinMemoryNode"] == f"{resources['mem_mb']}M", (device, job)
        if "runtime" in resources:
            assert job["TimeLimit"] == f"00:{resources['runtime']:02d}:00", (device, job)


def test_training_and_analysis_use_their_own_partition_settings(slurm_run):
    _, settings, jobs = slurm_run
    (train,) = jobs_of(jobs, "train_model")
    train_resources = settings["models"]["small"]["train"]["resources"]
    assert train["Partition"] == train_resources["slurm_partition"]
    assert train["MinMemoryNode"] == f"{train_resources['mem_mb']}M"
    assert train["NumCPUs"] == "2"  # the rule's threads become cpus-per-task
    analysis = jobs_of(jobs, "cluster_equivalence_classes") + jobs_of(
        jobs, "compute_remaining_precision")
    assert len(analysis) == 2
    for job in analysis:
        assert job["MinMemoryNode"] == f"{settings['analysis']['resources']['mem_mb']}M"
    # Light rules stay on the submitting host.
    for rule in ("prepare_dataset", "install_aarch64", "plot_equivalence_classes",
                 "plot_remaining_precision"):
        assert not jobs_of(jobs, rule), rule


def walk(path):
    """The record's measured tensors (the kernels dataset, which holds each call's time, is
    compared by its signatures in the test) and its digests."""
    with h5py.File(path, "r") as handle:
        items = {}
        handle.visititems(lambda name, obj: items.__setitem__(name, obj[()])
                          if isinstance(obj, h5py.Dataset) and name != "kernels" else None)
        return items, {key: handle.attrs[key] for key in ("model_sha256", "input_sha256")}


def signatures(path):
    with Record(path) as record:
        return {layer: entry["signature"] for layer, entry in record.kernels["layers"].items()}


def test_slurm_results_equal_the_local_run_bit_for_bit(slurm_run, run):
    slurm_dir, settings, _ = slurm_run
    local_dir, _ = run
    for device in settings["devices"]:
        slurm_items, slurm_hashes = walk(slurm_dir / f"results/inference/small/{device}.h5")
        local_items, local_hashes = walk(local_dir / f"results/inference/small/{device}.h5")
        assert slurm_hashes == local_hashes, device
        assert slurm_items.keys() == local_items.keys(), device
        for name, values in slurm_items.items():
            assert values.dtype == local_items[name].dtype, (device, name)
            assert np.array_equal(values.view(np.uint8), local_items[name].view(np.uint8)), (
                device, name)
        # The same kernels ran in every layer under SLURM as locally.
        assert signatures(slurm_dir / f"results/inference/small/{device}.h5") == \
            signatures(local_dir / f"results/inference/small/{device}.h5"), device
    pd.testing.assert_frame_equal(pd.read_csv(slurm_dir / "results/tables/eqc.csv"),
                                  pd.read_csv(local_dir / "results/tables/eqc.csv"))


def test_training_runs_follow_their_device_and_plan(slurm_run, run):
    slurm_dir, settings, jobs = slurm_run
    plan = settings["training_variance"]["plans"]["devices"]
    for device in plan["devices"]:
        (job,) = jobs_of(jobs, "train_variance_run", f"_devices_control_{device}_0")
        resources = settings["devices"][device].get("resources", {})
        assert job["JobState"] == "COMPLETED", job
        assert job["Partition"] == resources.get("slurm_partition", "cpu"), (device, job)
        assert job["TimeLimit"] == f"00:{plan['resources']['runtime']:02d}:00", (device, job)
        if "gres" in resources:
            requested = " ".join([job.get("TresPerJob", ""), job.get("TresPerNode", "")])
            assert f"gres:{resources['gres']}" in requested, (device, job)
    # On the cluster every run is a fresh process; locally the TensorFlow and torch runs
    # are children of their device's fork server. Fixed seeds and a CPU: the cluster's runs
    # equal the local ones bit for bit, which compares the two ways too.
    local_dir, _ = run
    for device in plan["devices"]:
        log = f"logs/train_variance_run/devices/control/{device}/run_0.log"
        assert "fork server" not in (slurm_dir / log).read_text(), device
        served = "fork server" in (local_dir / log).read_text()
        assert served == (settings["devices"][device]["backend"] in ("tensorflow", "torch")
                          and not settings["devices"][device].get("emulate")), device
    for path in (slurm_dir / "results/training").glob("*/control/*/run_*/run.h5"):
        local = local_dir / path.relative_to(slurm_dir)
        with h5py.File(path) as ours, h5py.File(local) as theirs:
            for name in ("logits", "weights"):
                assert np.array_equal(ours[name][()].view(np.uint8),
                                      theirs[name][()].view(np.uint8)), (path, name)
