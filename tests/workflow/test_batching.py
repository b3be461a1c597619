"""The batch-invariance study end to end through Snakemake on a tiny config: the
transformer trained and exported by the spine's rules, one job per device (TensorFlow,
torch, ONNX Runtime), the tables and the figure."""

import json

import numpy as np
import pandas as pd
import pytest

from tests.utils import ROOT, snakemake

pytestmark = pytest.mark.workflow


@pytest.fixture(scope="module")
def batching_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("batching")
    snakemake(workdir, "batching", configfile=ROOT / "tests/config/batching.yaml")
    return workdir


def test_batching_tables_and_figure(batching_run):
    results = batching_run / "results"
    devices = ["tf_1thread", "torch_1thread", "ort_all"]
    layers = pd.read_csv(results / "tables/batching_layers.csv")
    summary = pd.read_csv(results / "tables/batching_summary.csv").set_index("device")
    decoding = pd.read_csv(results / "tables/batching_decoding.csv")
    assert sorted(summary.index) == sorted(devices)
    for device in devices:
        run = json.loads((results / f"batching/transformer/{device}.json").read_text())
        settings = [s["name"] for s in run["settings"]]
        assert settings == ["alone", "batch2_at0", "batch2_at1", "batch2_neighbours1",
                            "batch8_at0", "batch8_at7", "batch8_neighbours1", "padded20"]
        mine = layers[layers["device"] == device]
        # every layer x setting but the baseline has one cell, over both inputs
        assert len(mine) == len(run["layers"]) * (len(settings) - 1)
        assert mine["inputs"].eq(2).all()
        # recount from the run file: a cell differs when any input's bits differ
        for (layer, setting), cell in mine.set_index(["layer", "setting"]).iterrows():
            entries = [v for v in run["verdicts"]
                       if v["layer"] == layer and v["setting"] == setting]
            assert cell["inputs_differing"] == sum(not v["equal"] for v in entries)
        # a row lookup is bit-equal in any batch
        assert mine[mine["layer"] == "token_embedding"]["verdict"].eq("equal").all()
        logits = mine[mine["layer"] == "logits"]
        assert summary.loc[device, "settings_differing"] == \
            int(logits["verdict"].eq("differs").sum())
        rows = decoding[decoding["device"] == device]
        assert len(rows) == 2 * (len(settings))  # two prompts, every setting
        alone = rows[rows["setting"] == "alone"]
        assert alone["first_divergent_token"].isna().all()
        assert alone["largest_logit_change"].eq(0).all()  # alone against itself
        assert rows["smallest_margin"].gt(0).all()  # no exact tie among the top logits
        assert alone["completion"].str.split().str.len().eq(6).all()
    png = results / "figures/batching.png"
    assert png.stat().st_size > 10_000
    assert (results / "figures/batching.pdf").is_file()
    assert np.isfinite(layers["remaining_precision"]).all()
