"""The ablation study end to end through Snakemake on a tiny config: variants made by the
spine's train and inference rules, a device matrix, the tables and figures."""

import h5py
import pandas as pd
import pytest

from tests.utils import ROOT, snakemake

pytestmark = pytest.mark.workflow


@pytest.fixture(scope="module")
def ablation_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("ablation")
    config = ROOT / "tests/config/ablation.yaml"
    snakemake(workdir, "all", configfile=config)
    return workdir


def test_variants_run_through_the_spines_rules_on_the_ablation_devices(ablation_run):
    results = ablation_run / "results"
    for model in ("small_sigmoid", "small_untrained"):
        for device in ("tf_1thread", "tf_sse41", "torch_1thread"):
            with h5py.File(results / f"inference/{model}/{device}.h5") as record:
                assert record.attrs["model"] == model
        # variants run on the ablation devices only, not on the matrix's copies
        assert not (results / f"inference/{model}/tf_1thread_float64.h5").exists()
    # the base on every device, the matrix's float64 copies included
    with h5py.File(results / "inference/small/torch_1thread_float64.h5") as record:
        assert record.attrs["precision"] == "float64"
    digests = {}
    for model in ("small", "small_untrained", "small_sigmoid"):
        with h5py.File(results / f"models/{model}/seed_3/test_logits.h5") as logits:
            digests[model] = logits.attrs["init_sha256"]
    assert digests["small"] == digests["small_untrained"]  # the same init seed
    assert digests["small"] != digests["small_sigmoid"]  # Xavier init for sigmoid


def test_ablation_tables_and_figures(ablation_run):
    tables = ablation_run / "results/tables"
    layers = pd.read_csv(tables / "ablation_layers.csv")
    assert set(layers["variant"]) == {"base", "sigmoid", "untrained"}
    assert layers["n_devices"].eq(2).all()  # the two ablation devices at float32
    across = pd.read_csv(tables / "activation_deviations_across_frameworks.csv")
    assert set(across["devices"]) == {"tf_1thread;torch_1thread"}
    assert set(across["variant"]) == {"base", "sigmoid", "untrained"}
    activation = pd.read_csv(tables / "activation_deviations.csv")
    for _, rows in activation.groupby("variant"):
        assert rows["layer_index"].tolist() == [2, 5, 9, 11]  # Table SUP-8's positions
    assert activation[["deviating_before", "deviating_after"]].stack().between(0, 1).all()
    effects = pd.read_csv(tables / "layer_effects.csv")
    counts = effects[effects["layer_kind"] == "activation"].set_index("variant")["layers"]
    assert counts.eq(4).all()
    accuracy = pd.read_csv(tables / "validation_accuracy.csv").set_index("variant")
    assert bool(accuracy.loc["untrained", "trained"]) is False
    casting = pd.read_csv(tables / "precision_casting.csv")
    assert set(casting["precision"]) == {"float32", "float64"}
    assert casting.groupby("precision")["mantissa_bits"].first().to_dict() == {
        "float32": 23, "float64": 52}
    assert casting["n_devices"].eq(2).all()
    precision = pd.read_csv(tables / "precision.csv")
    assert precision["significant_bits_reference"].str.startswith("float64 device").all()
    for name in ("ablation_layers", "precision_casting"):
        assert (ablation_run / f"results/figures/{name}.pdf").read_bytes().startswith(b"%PDF")
