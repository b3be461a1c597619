"""Helpers shared by the tests: files in the real formats, and running the workflow."""

import contextlib
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
# Root attributes of a hand-made inference record (tests supply model and device).
BASE_ATTRS = {"backend": "tensorflow", "precision": "float32", "model_sha256": "m" * 64,
              "input_sha256": "i" * 64, "fingerprint": {"hostname": "test"}}


def make_celeba(folder, rows):
    """A tiny CelebA folder in its CSV layout: rows of (image_id, partition, Blond, Male, Young)."""
    (folder / "img_align_celeba").mkdir(parents=True)
    names = ["5_o_Clock_Shadow", "Blond_Hair", "Male", "Young"]
    with open(folder / "list_attr_celeba.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image_id", *names])
        for image_id, _, blond, male, young in rows:
            writer.writerow([image_id, -1, blond, male, young])
    with open(folder / "list_eval_partition.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["image_id", "partition"])
        writer.writerows([(image_id, partition) for image_id, partition, *_ in rows])
    rng = np.random.default_rng(0)
    for image_id, *_ in rows:
        Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)).save(
            folder / "img_align_celeba" / image_id)


def write_run(path, *, plan="p", arm="a", device="cpu", run=0, predictions, labels,
              weights, seconds=1.0, switches=None, study="plan", learning_rate=0.01,
              accuracy=None, loss=0.5, attributes=None, classes=None, init_sha256=None,
              spec=None):
    """A run file in the format bitdrift.studies.variance.runs writes. The initial weights'
    digest follows the init switch unless given: one for a fixed init, one per run else."""
    classes = classes or int(max(np.max(predictions), np.max(labels)) + 1)
    logits = np.eye(classes, dtype=np.float32)[predictions]
    switches = switches or {"init": "fixed", "data_order": "fixed", "augmentation": "fixed",
                            "dropout": "fixed", "deterministic": False}
    with h5py.File(path, "w") as handle:
        handle["logits"], handle["labels"] = logits, np.asarray(labels)
        handle["weights"] = np.asarray(weights, dtype=np.float32)
        handle["step_seconds"] = np.full((2, 3), seconds / 3)
        handle["epoch_seconds"] = np.full(2, seconds)
        if attributes is not None:
            handle["attributes"] = np.asarray(attributes, dtype=np.int8)
            handle.attrs["attribute_names"] = json.dumps(["Male"])
        handle.attrs.update({
            "plan": plan, "arm": arm, "device": device, "run": run, "study": study,
            "model": "small", "learning_rate": learning_rate, "classes": classes,
            "switches": json.dumps(switches), "deterministic": switches["deterministic"],
            "test_accuracy": float(np.mean(np.asarray(predictions) == labels))
            if accuracy is None else accuracy, "test_loss": loss, "dataset_sha256": "abc",
            "init_sha256": init_sha256 or (
                "init-fixed" if switches["init"] == "fixed" else f"init-run-{run}")})
        if spec is not None:
            handle.attrs["spec"] = json.dumps(spec)
    return path


def figure_text(plot, *args, folder) -> str:
    """The text a plotting function draws: ``plot(*args, out)`` with ``out`` an SVG whose
    text stays text (matplotlib's svg.fonttype "none"), the SVG's <text> contents joined
    by newlines, XML entities decoded."""
    import html
    import re

    import matplotlib

    out = Path(folder) / f"{plot.__name__}.svg"
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        plot(*args, out)
    texts = re.findall(r"<text\b[^>]*>(.*?)</text>", out.read_text(), flags=re.S)
    return "\n".join(html.unescape(re.sub(r"<[^>]+>", "", text)) for text in texts)


def snakemake(workdir, *args, configfile, timeout=1200, executor=("--cores", "2"), env=None,
              check=True):
    """Run the workflow in `workdir`; `configfile` is one path or a list (later ones
    overlay earlier ones). With check=False the completed process is returned as is."""
    configfiles = configfile if isinstance(configfile, list) else [configfile]
    command = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
               "-d", str(workdir), "--configfile", *map(str, configfiles), *executor, *args]
    # On timeout subprocess.run kills snakemake outright: on SIGTERM it would wait for
    # running jobs, and a stuck cluster must fail the test, not hang it.
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env=None if env is None else {**os.environ, **env})
    if not check:
        return result
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return result.stdout + result.stderr


def write_inputs(workdir):
    """Input files the test config names: a tiny CelebA folder in the real CSV layout
    (24 train and 12 test images; blond, male and young drawn at random)."""
    rng = np.random.default_rng(1)
    rows = [(f"{i:06d}.jpg", 0 if i <= 24 else 2, *rng.choice([1, -1], size=3))
            for i in range(1, 37)]
    make_celeba(Path(workdir) / "celeba", rows)


def small_model_assets(folder: Path) -> tuple[Path, Path]:
    """The digits dataset (8 training, 12 test images) and an untrained Cifar10-small saved
    by Keras on TensorFlow in a process of its own (seed 0), in ``folder``."""
    from bitdrift.inputs.datasets import prepare_dataset

    dataset = folder / "digits.h5"
    prepare_dataset("digits", {"source": "digits", "limit_train": 8, "limit_test": 12}, dataset)
    model = folder / "small.keras"
    code = ("import keras, sys; from bitdrift.inputs.models import build_model; "
            "keras.utils.set_random_seed(0); "
            "build_model(keras, {'architecture': 'cifar10_small'}, (32, 32, 3), 10)"
            ".save(sys.argv[1])")
    subprocess.run([sys.executable, "-c", code, str(model)], check=True,
                   env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    return dataset, model


def copy_into(folder, *paths: Path) -> tuple[Path, ...]:
    """Copies of ``paths`` in ``folder`` (made if need be), by the same names: a test's
    own copy of files a session fixture built once (copying is cheap, building is not)."""
    import shutil

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return tuple(Path(shutil.copy2(path, folder / Path(path).name)) for path in paths)


# What a checkout needs to plan and run the workflow (tests that copy one elsewhere)
CHECKOUT_FILES = ("Snakefile", "config.yaml", "rules", "src", "workflow", "profiles", "envs")


def copy_checkout(checkout: Path) -> Path:
    """A copy of this checkout's CHECKOUT_FILES in ``checkout`` (made here)."""
    import shutil

    checkout.mkdir()
    for name in CHECKOUT_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, checkout / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(source, checkout / name)
    return checkout


# A Keras model (Dense, ReLU, Dense, Softmax; seed 0) converted by TensorFlow's LiteRT
# converter to OUT/model.tflite, its Dense layers' weights in OUT/weights.npz (the truth
# tests compute from): run as `python -c KERAS_TO_TFLITE OUT`, in a process of its own.
KERAS_TO_TFLITE = """
import sys, keras, numpy as np, tensorflow as tf
from pathlib import Path
out = Path(sys.argv[1])
keras.utils.set_random_seed(0)
inputs = keras.Input((6,), name="x")
hidden = keras.layers.Dense(5, activation="relu", name="fc1")(inputs)
logits = keras.layers.Dense(3, name="fc2")(hidden)
model = keras.Model(inputs, keras.layers.Softmax(name="probabilities")(logits))
(out / "model.tflite").write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
np.savez(out / "weights.npz", *[layer.get_weights()[i] for layer in model.layers[1:3]
                                for i in (0, 1)])
"""


# The file each exported runtime runs
EXPORT_FILES = {"onnxruntime": "model.onnx", "openvino": "model.onnx", "litert": "model.tflite"}


def export_small_model(model: Path, dataset: Path, folder: Path) -> Path:
    """``model``'s reference, ONNX and LiteRT exports in ``folder`` (as
    bitdrift.backends.keras.export
    writes them, in a TensorFlow process of its own); returns the reference's path."""
    code = ("import sys; from bitdrift.backends.keras.export import export_model, write_reference; "
            "write_reference(sys.argv[1], sys.argv[2], sys.argv[3] + '/reference.npz'); "
            "export_model(sys.argv[1], 'onnx', sys.argv[3] + '/model.onnx'); "
            "export_model(sys.argv[1], 'tflite', sys.argv[3] + '/model.tflite')")
    subprocess.run([sys.executable, "-c", code, str(model), str(dataset), str(folder)],
                   check=True, env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    return folder / "reference.npz"


def fork_servers_in(folder) -> list[int]:
    """The pids of the fork servers (bitdrift.run.fork_server) listening in ``folder``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                command = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
                if b"bitdrift.run.fork_server" in command and any(
                        part.startswith(str(folder).encode()) for part in command):
                    found.append(int(entry))
    return found


def open_every_category(page, report, categories):
    """In Snakemake's HTML report `report` (a Playwright page), click each category of the
    sidebar (and each subcategory where it has several), then the view button of each
    result it lists (a result the browser cannot show, as findings.md, has a download
    link instead: not clicked). Returns the paths of the results that opened; a view that
    breaks blanks the page and leaves a page error, which the caller listens for."""
    opened = set()
    for category, subcategories in categories.items():
        for subcategory, paths in subcategories.items():
            page.goto(report.as_uri())
            sidebar = page.locator("nav")
            sidebar.get_by_role("link", name=category, exact=True).click()
            if len(subcategories) > 1:
                sidebar.get_by_role("link", name=subcategory, exact=True).click()
            rows = sidebar.locator("table tbody tr")
            assert rows.count() == len(paths), (category, subcategory, rows.count())
            for index in range(len(paths)):
                button = rows.nth(index).locator("a").first
                if button.get_attribute("download") is None:
                    button.click()
                    opened.add(page.evaluate("() => app.state.resultPath"))
    return opened


# Run inside a private user and mount namespace (tests.utils.on_mounts): mount each tmpfs,
# fill the ones asked, run the command, list what each mount holds after it.
_ON_MOUNTS = r"""
import json, os, subprocess, sys
spec = json.loads(sys.argv[1])
for folder, options in spec["mounts"].items():
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", folder])
    if mounted.returncode != 0:
        sys.exit(77)
for folder in spec["fill"]:
    with open(os.path.join(folder, "filler"), "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            pass
    if spec["room"]:
        filler = os.path.join(folder, "filler")
        os.truncate(filler, os.path.getsize(filler) - spec["room"])
done = subprocess.run(spec["command"], capture_output=True, text=True)
print(json.dumps({"status": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
                  "left": {folder: sorted(name for name in os.listdir(folder) if name != "filler")
                           for folder in spec["mounts"]}}))
"""


def on_mounts(mounts: dict, command: list[str], fill=(), timeout=300, room=0) -> dict:
    """Run ``command`` with each folder of ``mounts`` {folder: tmpfs options ("ro",
    "size=64k")} a tmpfs of its own, those in ``fill`` filled up first (but ``room``
    bytes), in a private user and mount namespace (as ./quickstart's test mounts its
    disks: no root needed, nothing seen outside). Returns {"status", "stdout", "stderr",
    "left": {folder: names in it after the command, the filler left out}}."""
    for folder in mounts:
        Path(folder).mkdir(parents=True, exist_ok=True)
    spec = {"mounts": {str(folder): options for folder, options in mounts.items()},
            "fill": [str(folder) for folder in fill], "room": room,
            "command": [str(c) for c in command]}
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", sys.executable,
                           "-c", _ON_MOUNTS, json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0 and (done.returncode == 77 or "unshare" in done.stderr):
        import pytest

        pytest.skip(f"this kernel lets no user namespace mount a tmpfs: {done.stderr[-2000:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
