"""The tiny test config end to end through Snakemake: tables, figures, report, incremental."""

import hashlib
import json
import subprocess
import sys
import zipfile
from importlib import metadata

import h5py
import numpy as np
import pandas as pd
import pytest
import yaml

from bitdrift.analysis.eqc import EQC_COLUMNS, EQC_EXTRA_COLUMNS, PRECISION_COLUMNS
from bitdrift.record.reader import Record
from tests.utils import open_every_category, snakemake

pytestmark = pytest.mark.workflow


def test_tables_follow_the_contract_and_agree(run):
    workdir, config = run
    settings = yaml.safe_load(config.read_text())
    devices, samples = list(settings["devices"]), settings["samples"]
    eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
    assert list(eqc.columns) == EQC_COLUMNS + EQC_EXTRA_COLUMNS
    assert len(eqc) == len(devices) * len(samples)
    assert eqc["device"].tolist()[: len(devices)] == devices  # config order
    assert eqc.groupby("sample")["eqc"].apply(lambda s: s.iloc[0]).eq(1).all()
    assert eqc["deterministic"].all()
    # TensorFlow and torch kernels differ: more than one class per sample
    assert (eqc.groupby("sample")["eqc"].max() > 1).all()
    precision = pd.read_csv(workdir / "results/tables/precision.csv")
    assert list(precision.columns[: len(PRECISION_COLUMNS)]) == PRECISION_COLUMNS
    output_rows = precision[precision["layer"] == "output"].set_index("sample")
    for sample, rows in eqc.groupby("sample"):
        assert output_rows.loc[sample, "n_eqc"] == rows["eqc"].nunique()
        assert output_rows.loc[sample, "remaining_precision"] < 23
    assert precision["remaining_precision"].between(0, 23).all()
    assert (precision["remaining_precision_uncapped"] >= precision["remaining_precision"]).where(
        precision["remaining_precision"] > 0, True).all()
    per_layer = pd.read_csv(workdir / "results/tables/eqc_layers.csv")
    assert set(per_layer["layer"]) == set(precision["layer"])


def test_every_record_carries_its_effective_precision(run):
    """Every Dense/Conv layer of every device checked, none below its declared format; the
    table agrees with a recomputation here from one record (numpy, long double)."""
    workdir, _ = run
    table = pd.read_csv(workdir / "results/tables/effective_precision.csv")
    assert table["unchecked"].isna().all()
    layers = {"conv2d", "conv2d_1", "dense_1", "dense_2", "dense_3"}
    for device, rows in table.groupby("device"):
        assert set(rows["layer"]) == layers, device
    assert not table["reduced"].any()
    assert pd.read_csv(workdir / "results/tables/eqc.csv")["effective_precision"].eq(
        "declared").all()
    with Record(workdir / "results/inference/small/torch_1thread.h5") as record:
        inputs = record.tensor(0, "flatten_1").values[0].astype(np.longdouble)
        outputs = record.tensor(0, "dense_1").values[0].astype(np.longdouble)
    code = ("import keras, sys, numpy as np; m = keras.saving.load_model(sys.argv[1]); "
            "np.savez(sys.argv[2], *m.get_layer('dense_1').get_weights())")
    weights = workdir / "dense_1_weights.npz"
    subprocess.run([sys.executable, "-c", code, str(workdir / "results/models/small/seed_3/"
                                                    "model.keras"), str(weights)], check=True)
    with np.load(weights) as data:
        kernel, bias = (data[name].astype(np.longdouble) for name in ("arr_0", "arr_1"))
    scale = np.abs(inputs) @ np.abs(kernel) + np.abs(bias)
    error = np.max(np.abs(outputs - (inputs @ kernel + bias)) / scale)
    row = table[(table["device"] == "torch_1thread") & (table["layer"] == "dense_1")].iloc[0]
    assert error <= row["relative_error"] * (1 + 1e-9)  # the table's worst covers sample 0
    assert error < 2.0**-20  # float32 arithmetic


def test_figures_and_report_exist(run):
    workdir, _ = run
    names = ("eqc", "remaining_precision", "backprop_variation", "bifurcation_volume",
             "maxpool_training", "training_variance", "churn", "determinism_cost",
             "ensemble_disagreement", "eqc_table", "divergence", "divergent_examples",
             "kernels", "accumulation_orders")
    for name in names:
        data = (workdir / "results/figures" / f"{name}.pdf").read_bytes()
        assert data.startswith(b"%PDF") and len(data) > 5000, name
        assert (workdir / "results/figures" / f"{name}.png").read_bytes().startswith(
            b"\x89PNG"), name
    # The report embeds the PNGs (shown inline by any browser), one per figure.
    report = (workdir / "results/report.html").read_text(errors="replace")
    for name in names:
        assert f"{name}.png" in report, name
    # Tables too, as HTML beside each CSV: the report shows HTML inline (a CSV there is
    # download-only).
    for name in ("eqc", "precision", "explain", "training_variance", "example_divergence",
                 "bifurcation_volume", "eqc_table"):
        page = (workdir / "results/tables" / f"{name}.html").read_text()
        header = (workdir / "results/tables" / f"{name}.csv").read_text().splitlines()[0]
        assert "<table>" in page and all(f"<th>{column}</th>" in page
                                         for column in header.split(",")), name
        assert f"{name}.html" in report, name


def test_this_machine_among_the_machines_measured(run):
    """The reference model on atlas.devices, compared with the atlas shipped with bitdrift:
    each entry's verdict against per-layer digests computed here from the record."""
    from bitdrift.atlas.entries import THIS_MACHINE, default_folder, read_atlas, settings

    workdir, _ = run
    table = pd.read_csv(workdir / "results/tables/atlas.csv")
    atlas = read_atlas(default_folder())
    assert atlas.entries and not atlas.refused
    assert table.loc[table["machine"] == THIS_MACHINE, "device"].tolist() == ["tf_1thread"]
    with Record(workdir / "results/inference/atlas_reference/tf_1thread.h5") as record:
        config = json.loads(record.attr("device_config"))
        mine = {}
        for sample in record.samples:
            mine[str(sample)] = []
            for info in record.layers(sample):
                values = record.tensor(sample, info).values
                assert (values == values[0]).all()  # deterministic: every repeat the same
                digest = hashlib.sha256(f"float32:{values[0].shape}:".encode())
                digest.update(values[0].tobytes())
                mine[str(sample)].append(digest.hexdigest()[:32])
    for name, entry in atlas.entries.items():
        part = entry["devices"].get("tf_1thread")
        row = table[(table["machine"] == name) & (table["device"] == "tf_1thread")]
        assert len(row) == (part is not None)
        if part is not None:
            expected = settings(part) == settings({"config": config}) and \
                part["digests"] == mine
            assert bool(row["same_bits_as_this_machine"].iloc[0]) == expected, name
    findings = (workdir / "results/findings.md").read_text()
    assert "## This machine among the machines measured" in findings
    assert "of the atlas ran this machine's atlas devices" in findings
    assert set(table["label"]) and not any(".json" in label for label in table["label"])
    assert (workdir / "results/figures/atlas.png").stat().st_size > 0


def test_maxpool_tables(run):
    workdir, _ = run
    zero = pd.read_csv(workdir / "results/tables/maxpool_zero_program.csv")
    at_zero = zero[(zero["x"] == "x1") & (zero["t"] == 0.0)]
    assert set(at_zero["derivative"].abs()) == {1.5}  # Tables 1 and 3 at every precision
    volume = pd.read_csv(workdir / "results/tables/bifurcation_volume.csv")
    assert volume["setting"].tolist() == ["lenet5_b16_fp32"]
    assert volume[["M", "R"]].values.tolist() == [[2, 2]]
    assert volume["share_batches"].between(0, 1).all()


def test_adding_a_device_recomputes_only_that_device(run, tmp_path):
    workdir, config = run
    settings = yaml.safe_load(config.read_text())
    settings["devices"]["torch_2threads"] = {"accelerator": "cpu", "backend": "torch",
                                             "threads": 2, "repeats": 1}
    extended = tmp_path / "extended.yaml"  # a dry run: the shared workdir stays as it is
    extended.write_text(yaml.safe_dump(settings))
    dry_run = snakemake(workdir, "all", "-n", configfile=extended)
    jobs = {line.split()[0]: int(line.split()[1]) for line in dry_run.splitlines()
            if len(line.split()) == 2 and line.split()[1].isdigit()}
    assert jobs.get("run_inference") == 1
    assert "prepare_dataset" not in jobs and "train_model" not in jobs
    assert jobs.get("cluster_equivalence_classes") == 1


def tampered_copy(model, target):
    """The model with one weight changed in its last bits: what a record made from a
    slightly different model (another training, another checkpoint) would carry."""
    with zipfile.ZipFile(model) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    weights = target.with_suffix(".weights.h5")
    weights.write_bytes(members["model.weights.h5"])
    with h5py.File(weights, "r+") as handle:
        kernels = []
        # a layer's kernel: the optimizer's state is not part of what the model computes
        handle.visititems(lambda name, obj: kernels.append(obj)
                          if isinstance(obj, h5py.Dataset) and obj.ndim == 2
                          and name.startswith("layers") else None)
        values = kernels[-1][()]
        values.flat[0] = np.nextafter(values.flat[0], np.float32(np.inf))
        kernels[-1][...] = values
    members["model.weights.h5"] = weights.read_bytes()
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def bitdrift_infer(workdir, config, device, *args):
    command = [sys.executable, "-m", "bitdrift.cli", "infer", "--config", str(config),
               "--model", "small", "--device", device, *args]
    result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def test_external_device_is_merged_and_a_mismatched_one_refused(own_run, tmp_path):
    workdir, config = own_run
    settings = yaml.safe_load(config.read_text())
    settings["devices"]["laptop"] = {"accelerator": "cpu", "backend": "torch", "threads": 1,
                                     "repeats": 1, "external": True}
    extended = workdir / "external.yaml"
    extended.write_text(yaml.safe_dump(settings))
    record = workdir / "results/inference/small/laptop.h5"
    # Measured "off-cluster": the same command a user runs on the other machine.
    bitdrift_infer(workdir, extended, "laptop", "--out", str(record))
    dry_run = snakemake(workdir, "all", "-n", configfile=extended)
    assert "run_inference" not in dry_run  # never scheduled
    snakemake(workdir, "all", configfile=extended)
    eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
    laptop, torch = (eqc[eqc["device"] == name].set_index("sample")["eqc"]
                     for name in ("laptop", "torch_1thread"))
    assert laptop.equals(torch)  # same software, same machine: same class

    tampered = tmp_path / "tampered.keras"
    tampered_copy(workdir / "results/models/small/seed_3/model.keras", tampered)
    bitdrift_infer(workdir, extended, "laptop", "--out", str(record),
                   "--model-file", str(tampered))
    result = snakemake(workdir, "results/tables/eqc.csv", configfile=extended, check=False)
    assert result.returncode != 0
    log = (workdir / "logs/cluster_equivalence_classes/all.log").read_text()
    assert "laptop.h5: device 'laptop' was run on another model" in log, log


def test_training_variance_arms_behave_as_their_switches_say(run):
    workdir, _ = run
    tables = workdir / "results/tables"
    summary = pd.read_csv(tables / "training_variance.csv")
    noise = summary[summary["plan"] == "noise"].set_index("arm")
    assert noise["runs"].eq(2).all()
    # Every seed fixed, on a CPU: the runs are bit-identical, with or without op determinism
    # (the IMPL arm shows no spread on this machine; on a GPU it would).
    for arm in ("control", "impl", "same"):
        assert noise.loc[arm, "distinct_outputs"] == 1, arm
        assert noise.loc[arm, "churn"] == 0 and noise.loc[arm, "weight_distance"] == 0, arm
        assert noise.loc[arm, "sd_loss"] == 0, arm
    for arm in ("algo", "algo_impl", "different"):
        assert noise.loc[arm, "distinct_outputs"] == 2, arm
        assert noise.loc[arm, "weight_distance"] > 0 and noise.loc[arm, "sd_loss"] > 0, arm
    ratio = pd.read_csv(tables / "seed_ratio.csv").set_index("plan").loc["noise"]
    assert ratio["ratio_loss"] == 0.0 and ratio["sd_loss_different"] > 0
    # Seeds follow the arm: run 1 of ALGO uses seed 1 for everything, IMPL seed 0.
    with h5py.File(workdir / "results/training/noise/algo/tf_1thread/run_1/run.h5") as handle:
        assert set(json.loads(handle.attrs["seeds"]).values()) == {1}
        assert handle["logits"].shape == (16, 10) and handle["step_seconds"].shape[0] == 1
    with h5py.File(workdir / "results/training/noise/impl/tf_1thread/run_1/run.h5") as handle:
        assert set(json.loads(handle.attrs["seeds"]).values()) == {0}
    # One fixed init seed: the same initial weights on TensorFlow and torch (drawn with
    # NumPy), so what parts the two models is the backends' kernels, not their RNGs.
    devices = summary[summary["plan"] == "devices"].set_index("scope")
    assert devices.loc["all", "distinct_outputs"] == 2 and devices.loc["all", "runs"] == 2
    digests = set()
    for device in ("tf_1thread", "torch_1thread"):
        with h5py.File(workdir / f"results/training/devices/control/{device}/run_0/run.h5") as h:
            digests.add(h.attrs["init_sha256"])
    assert len(digests) == 1
    # unrelated initial weights gave ~1.41 (orthogonal unit vectors); one init, far less
    assert devices.loc["all", "weight_distance"] < 0.5
    ensemble = summary[summary["study"] == "ensemble"].set_index(["momentum", "arm"])
    assert len(ensemble) == 8 and ensemble["learning_rate"].eq(0.05).all()
    assert set(ensemble.index.get_level_values("momentum")) == {0.0, 0.9}
    ensemble = ensemble.loc[0.9]
    assert ensemble.loc["fixed_init_fixed_batches_deterministic", "disagreement"] == 0
    assert ensemble.loc["random_init_random_batches_deterministic", "distinct_outputs"] == 2
    cost = pd.read_csv(tables / "determinism_cost.csv")
    pairs = set(zip(cost["arm_default"], cost["arm_deterministic"], strict=True))
    assert {("algo_impl", "algo"), ("impl", "control")} <= pairs
    assert cost["epoch_seconds_default"].gt(0).all()
    runs = pd.read_csv(tables / "training_runs.csv")
    assert len(runs) == 12 + 2 + 2 + 2 * 4 * 2 and runs["total_seconds"].gt(0).all()


def test_example_divergence_tables(run):
    workdir, _ = run
    tables = workdir / "results/tables"
    examples = pd.read_csv(tables / "example_divergence.csv")
    assert list(examples.columns[:9]) == ["plan", "arm", "scope", "example", "label",
                                          "divergence", "label_entropy",
                                          "sd_true_probability", "majority_correct"]
    with h5py.File(workdir / "results/datasets/digits.h5") as handle:
        labels = handle["y_test"][()]
    noise = examples[examples["plan"] == "noise"]
    for arm, rows in noise.groupby("arm"):
        assert rows["label"].tolist() == labels.tolist(), arm  # the runs' own test set
    # Same seed and deterministic ops on one CPU: every run agrees on every example
    assert (noise[noise["arm"] == "control"]["divergence"] == 0).all()
    # Different seeds: some examples flip
    assert (noise[noise["arm"] == "algo"]["divergence"] > 0).any()
    overlap = pd.read_csv(tables / "divergence_overlap.csv")
    assert {"arms", "plans"} <= set(overlap["comparison"])
    subset = pd.read_csv(tables / "divergent_subset_accuracy.csv").set_index(["plan", "arm"])
    algo = subset.loc[("noise", "algo")]
    assert algo["subset_examples"] > 0 and algo["accuracy_top_k"] < algo["accuracy_rest"]


def test_subgroup_spread_on_the_celeba_style_dataset(run):
    workdir, _ = run
    subgroups = pd.read_csv(workdir / "results/tables/training_subgroups.csv")
    assert set(subgroups["plan"]) == {"subgroups"}
    rows = subgroups.set_index("group")
    assert set(rows.index) == {"all", "Male", "not Male", "Young", "not Young"}
    assert rows.loc["all", "examples"] == 12 and rows["runs"].eq(2).all()
    assert rows.loc["Male", "examples"] + rows.loc["not Male", "examples"] == 12
    # Rates are recomputed here from the runs' own predictions and the dataset's attributes.
    dataset = workdir / "results/datasets/celeba.h5"
    with h5py.File(dataset) as handle:
        labels, male = handle["y_test"][()], handle["a_test"][()][:, 0] == 1
    fprs = []
    for number in (0, 1):
        path = workdir / f"results/training/subgroups/algo/tf_1thread/run_{number}/run.h5"
        with h5py.File(path) as handle:
            predicted = handle["logits"][()].argmax(1)
        negatives = male & (labels == 0)
        fprs.append(np.sum(predicted[negatives] == 1) / negatives.sum())
    assert rows.loc["Male", "mean_fpr"] == pytest.approx(np.mean(fprs))


def test_training_stats_command_reproduces_the_workflow_tables(run, tmp_path):
    workdir, _ = run
    files = sorted(str(p) for p in (workdir / "results/training").glob("noise/*/*/*/run.h5"))
    result = subprocess.run([sys.executable, "-m", "bitdrift.cli", "training-stats", *files,
                             "--out-dir", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    ours = pd.read_csv(tmp_path / "training_variance.csv").set_index("arm")
    workflow = pd.read_csv(workdir / "results/tables/training_variance.csv")
    workflow = workflow[workflow["plan"] == "noise"].set_index("arm")
    for column in ("sd_accuracy", "sd_loss", "churn", "weight_distance", "distinct_outputs"):
        pd.testing.assert_series_equal(ours[column].sort_index(), workflow[column].sort_index())


def test_explanations_and_divergence_agree_with_the_classes(run):
    workdir, _ = run
    tables = workdir / "results/tables"
    explain = pd.read_csv(tables / "explain.csv")
    eqc = pd.read_csv(tables / "eqc.csv")
    assert len(explain) == eqc[["model", "sample"]].drop_duplicates().shape[0]
    assert explain["determined"].all() and explain["search"].eq("exact").all()
    assert explain["attributes"].str.len().gt(0).all()
    layers = pd.read_csv(tables / "eqc_layers.csv")
    divergence = pd.read_csv(tables / "divergence.csv")
    assert len(divergence) > 0
    for row in divergence.itertuples():
        rows = layers[(layers["model"] == row.model) & (layers["sample"] == row.sample)]
        by_position = {position: part.set_index("device")["eqc"]
                       for position, part in rows.groupby("position")}
        apart = [p for p, classes in sorted(by_position.items())
                 if classes[row.device_a] != classes[row.device_b]]
        if pd.isna(row.first_position):
            assert not apart
        else:
            assert apart[0] == row.first_position  # nothing apart before, apart at it
    for name in ("eqc_table.pdf", "divergence.pdf"):
        assert (workdir / "results/figures" / name).read_bytes().startswith(b"%PDF")
    table = pd.read_csv(tables / "eqc_table.csv")
    assert table["settings_group"].is_monotonic_increasing


def test_the_report_opens_in_a_real_browser(run):
    """results/report.html in Debian's Chromium (headless, driven by Playwright): no
    JavaScript error, every figure decodes as an image, every table is an HTML table
    carrying its CSV as a download, every item labelled; a screenshot is kept beside it."""
    import base64
    import shutil

    from playwright.sync_api import sync_playwright

    workdir, _ = run
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is not installed (./quickstart test installs it)"
    errors = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("pageerror", lambda error: errors.append(f"page error: {error}"))
        page.on("console", lambda message: errors.append(f"console: {message.text}")
                if message.type == "error" else None)
        page.goto((workdir / "results/report.html").as_uri())
        page.wait_for_timeout(1000)
        results = page.evaluate("() => window.results")
        decoded = page.evaluate("""async () => {
            const out = {};
            for (const [path, item] of Object.entries(window.results)) {
                if (!item.mime_type.startsWith("image/")) continue;
                const image = new Image();
                image.src = item.data_uri;
                try { await image.decode(); out[path] = image.naturalWidth; }
                catch (error) { out[path] = 0; }
            }
            return out;
        }""")
        # The home view opens on the findings' first line, the rule graph below them, not
        # beside (the style at the end of workflow/report/workflow.rst)
        layout = page.evaluate("""() => {
            const graph = document.querySelector('#rulegraph').getBoundingClientRect();
            const text = document.querySelector('#findings-on-this-machine')
                .getBoundingClientRect();
            const figure = document.querySelector('#findings-on-this-machine img');
            return {graph: graph.top, top: text.top, text: text.bottom, width: text.width,
                    figure: figure ? figure.naturalWidth : 0};
        }""")
        page.get_by_text("Results", exact=True).first.click()
        page.wait_for_timeout(500)
        page.screenshot(path=str(workdir / "results/report_screenshot.png"))
        # Every category of the sidebar opens (and each of its subcategories), listing its
        # results, and every result listed opens; a blank page raises a page error
        categories = page.evaluate("() => window.categories")
        opened = open_every_category(page, workdir / "results/report.html", categories)
        browser.close()
    assert not errors, errors
    shown = ("image/", "text/html", "application/pdf")  # the rest are download links
    assert opened == {path for subcategories in categories.values()
                      for paths in subcategories.values() for path in paths
                      if results[path]["mime_type"].startswith(shown)}
    assert {"Findings", "Remaining precision"} <= set(categories)  # they once opened blank
    assert layout["graph"] >= layout["text"] - 1 and layout["width"] > 700, layout
    assert 0 <= layout["top"] < 100, layout  # not centred out of reach above the window
    assert layout["figure"] > 100, layout  # the EQC figure, inline after the classes
    figures = {path for path, item in results.items() if item["mime_type"] == "image/png"}
    tables = {path for path, item in results.items() if item["mime_type"] == "text/html"}
    assert len(figures) >= 12 and len(tables) >= 20
    assert all(decoded[path] > 100 for path in figures), decoded
    for path in tables:
        page_text = base64.b64decode(results[path]["data_uri"].split(",", 1)[1]).decode()
        assert "<table>" in page_text and "href='data:text/csv;base64," in page_text, path
        csv = base64.b64decode(page_text.split("data:text/csv;base64,", 1)[1].split("'")[0])
        assert csv == (workdir / path).with_suffix(".csv").read_bytes(), path
    assert all(item["labels"] and set(item["labels"]) == {"kind", "name"}
               for item in results.values())
    assert (workdir / "results/report_screenshot.png").read_bytes().startswith(b"\x89PNG")


def test_runtimes_agree_and_kernels_are_named(run):
    """The exported runtime ran the workflow's export and classes the test images as
    TensorFlow does; every TensorFlow and torch Conv/Dense layer has a named kernel (none
    unknown), the exported runtime names the node of its compiled graph that ran each
    layer, and divergence.csv carries both
    devices' kernels at the first divergent layer, as the records hold them."""
    workdir, _ = run
    tables = workdir / "results/tables"
    agreement = pd.read_csv(tables / "argmax_agreement.csv").set_index("device")
    assert agreement.loc["ort_1thread", "share"] == "1.0" or \
        float(agreement.loc["ort_1thread", "share"]) >= 0.99
    assert agreement.loc["tf_1thread", "share"] == "reference"
    assert (workdir / "results/exports/small/model.onnx").stat().st_size > 1000
    kernels = pd.read_csv(tables / "kernels.csv")
    compute = kernels[kernels["layer_class"].isin(["Conv2D", "Dense"])]
    framework = compute[compute["backend"].isin(["tensorflow", "torch"])]
    assert len(framework) and not framework["signature"].isin(["unknown", "none"]).any()
    # ONNX Runtime describes its optimised graph: each compute layer ran a node of its
    # kind (a convolution for Conv2D, a GEMM or MatMul for Dense), never "untraced"
    exported = compute[compute["device"] == "ort_1thread"].drop_duplicates("layer")
    assert len(exported) == len(compute[compute["device"] == "tf_1thread"]
                                .drop_duplicates("layer"))
    for row in exported.itertuples():
        ops = set(row.signature.split("+"))
        assert all(op.startswith("ort ") for op in ops), row.signature
        wanted = ("Conv",) if row.layer_class == "Conv2D" else ("Gemm", "MatMul")
        assert any(op.endswith(wanted) for op in ops), (row.layer, row.signature)
    divergence = pd.read_csv(tables / "divergence.csv")
    row = divergence.dropna(subset=["first_layer"]).iloc[0]
    with Record(workdir / f"results/inference/small/{row.device_a}.h5") as record:
        expected = record.kernels["layers"][row.first_layer]["signature"]
    assert row.kernels_a == expected
    coverage = pd.read_csv(tables / "kernel_coverage.csv")
    assert coverage["first_divergences"].iloc[0] == len(divergence.dropna(subset=["first_layer"]))


def test_an_emulated_cpu_is_a_device_of_the_workflow(run):
    """torch_haswell ran under `qemu-x86_64 -cpu Haswell-v4`: its record names the CPU it
    saw through CPUID (no AVX-512, whatever the host has), its oneDNN kernels name no
    AVX-512 or AMX, it is a column of the class tables, and the findings say it was
    emulated. ort_neoverse_n1 ran on an emulated Arm CPU, in the userland the workflow
    built."""
    workdir, _ = run
    with Record(workdir / "results/inference/small/torch_haswell.h5") as record:
        flags = set(record.fingerprint["cpu"]["flags"])
        assert record.fingerprint["emulation"]["model"] == "Haswell-v4"
    assert "avx2" in flags and not any(flag.startswith("avx512") for flag in flags)
    kernels = pd.read_csv(workdir / "results/tables/kernels.csv")
    onednn = kernels[(kernels["device"] == "torch_haswell") & (kernels["library"] == "onednn")]
    assert len(onednn) and not onednn["implementation"].str.contains("avx512|amx").any()
    assert "torch_haswell" in set(pd.read_csv(workdir / "results/tables/eqc.csv")["device"])
    findings = (workdir / "results/findings.md").read_text()
    assert "Emulated by QEMU" in findings and "as Haswell-v4" in findings
    assert "): torch_haswell." in findings
    # an Arm CPU: the rule install_aarch64 made its userland before the device ran in it
    manifest = json.loads((workdir / "results/emulation/aarch64.json").read_text())
    assert "onnxruntime" in manifest["runtimes"]
    with Record(workdir / "results/inference/small/ort_neoverse_n1.h5") as record:
        assert record.fingerprint["cpu"]["arch"] == "AARCH64"
        assert record.fingerprint["emulation"]["model"] == "neoverse-n1"
        # the Arm process imported the host's release of its runtime (not the host's wheel)
        versions = record.fingerprint["versions"]
        assert versions["onnxruntime"] == metadata.version("onnxruntime")
        assert versions["python"].startswith("3.11")
    assert "ort_neoverse_n1" in set(pd.read_csv(workdir / "results/tables/eqc.csv")["device"])
    assert "as neoverse-n1 (Arm Neoverse-N1; it saw NEON" in findings


def test_findings_open_the_report_and_name_this_machine(run):
    """findings.md is written from the tables of this run: its class counts are those of
    eqc.csv, and the report's first section is the findings."""
    workdir, _ = run
    findings = (workdir / "results/findings.md").read_text()
    eqc = pd.read_csv(workdir / "results/tables/eqc.csv")
    counts = "/".join(str(n) for _, n in sorted(eqc.groupby("sample")["eqc"].nunique().items()))
    assert f"small, float32: {counts} classes among {eqc['device'].nunique()} float32 devices" \
        in findings
    with open("/proc/cpuinfo") as handle:
        brand = next(line.split(":", 1)[1].strip() for line in handle
                     if line.startswith("model name"))
    assert brand in findings
    assert "None: every scheduled device ran." in findings
    report = (workdir / "results/report.html").read_text(errors="replace")
    assert "Findings on this machine" in report


def test_every_device_runs_the_model_as_deployed(run):
    """The observer check in the workflow: the exports include the deployed files, every
    record holds the deployed model's final output, and observer_check.csv counts the
    samples whose deployed output equals the instrumented one as a byte comparison of the
    records' own datasets does; findings says how many devices agree."""
    workdir, _ = run
    assert (workdir / "results/exports/small/deployed.onnx").stat().st_size > 1000
    table = pd.read_csv(workdir / "results/tables/observer_check.csv").set_index("device")
    records = sorted((workdir / "results/inference/small").glob("*.h5"))
    assert sorted(table.index) == sorted(path.stem for path in records)
    for path in records:
        with Record(path) as record:  # every repeat (format 4 stores distinct ones once)
            equal = [record.instrumented_output(sample).values.tobytes()
                     == record.tensor(sample, "output").values.tobytes()
                     for sample in record.samples]
        assert table.loc[path.stem, "equal_samples"] == sum(equal)
        assert table.loc[path.stem, "observer_equal"] == ("yes" if all(equal) else "no")
    findings = (workdir / "results/findings.md").read_text()
    assert f"on {(table['observer_equal'] == 'yes').sum()} of {len(table)} checked" in findings
