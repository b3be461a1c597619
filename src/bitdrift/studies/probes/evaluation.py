"""Judging probes on held-out devices: the devices used to find a probe are never the
ones it is scored on.

Every device runs one evaluation file: the probes, then the natural test samples. Per
input, the number of classes among the held-out devices; against it (a) the best single
natural sample and (b) the finest partition over all natural samples together (two
devices are apart if any sample separates them). Identify with 1, 2, 3 inputs, leave one
device out: the left-out device's outputs on those inputs are looked up among all other
devices; it is identified when the devices that match are exactly the other members of
its class (the finest partition over every input), and only devices whose class has
another member can be asked.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from bitdrift.errors import StudyError
from bitdrift.inputs.datasets import read_dataset
from bitdrift.record.hdf5 import OUTPUT
from bitdrift.record.reader import Record
from bitdrift.studies.probes.search import PADDING_ROWS, greedy_order, partition, write_images

IDENTIFY_INPUTS = (1, 2, 3)


def read_provenance(probe_file) -> dict:
    try:
        with h5py.File(probe_file, "r") as handle:
            return json.loads(handle.attrs["probe_provenance"])
    except (OSError, KeyError) as error:
        raise StudyError(f"{probe_file}: not a probe file from `bitdrift probe` ({error})") \
            from error


def write_evaluation_set(probe_file, dataset_file, out, pool: int | None = None) -> None:
    """The natural test set, then the probes, then padding: what every device runs. Rows:
    the natural pool (the first ``pool`` test samples) and the probes, in attributes."""
    provenance = read_provenance(probe_file)
    probes = read_dataset(probe_file, splits=("test",))["x_test"]
    test = read_dataset(dataset_file, splits=("test",))["x_test"]
    if probes.shape[1:] != test.shape[1:]:
        raise StudyError(f"{probe_file}: probes of shape {probes.shape[1:]} but the test "
                         f"images of {dataset_file} are {test.shape[1:]}")
    natural = len(test) if pool is None else min(pool, len(test))
    write_images(np.concatenate([test, probes, test[:PADDING_ROWS]]), Path(out), attrs={
        "name": "probe_evaluation", "source": "probe_evaluation",
        "natural_rows": json.dumps(list(range(natural))),
        "probe_rows": json.dumps(list(range(len(test), len(test) + len(probes)))),
        "probe_provenance": json.dumps(provenance)})


def evaluation_rows(evaluation_file) -> tuple[list[int], list[int]]:
    """(probe rows, natural rows) of an evaluation file."""
    try:
        with h5py.File(evaluation_file, "r") as handle:
            return (json.loads(handle.attrs["probe_rows"]),
                    json.loads(handle.attrs["natural_rows"]))
    except (OSError, KeyError) as error:
        raise StudyError(f"{evaluation_file}: not an evaluation file from `bitdrift "
                         f"probe-set` ({error})") from error


def read_outputs(records: list) -> dict:
    """{device: {row: output}}, each the majority of the device's repeats."""
    from bitdrift.analysis.eqc import summarize_repeats

    outputs = {}
    for path in records:
        with Record(path) as record:
            rows = {}
            for sample in record.samples:
                tensor = record.tensor(sample, OUTPUT)
                rows[sample] = summarize_repeats(record.device, tensor.values,
                                                 tensor.float_format)[1]
            outputs[record.device] = rows
    return outputs


def classes(outputs: dict, devices: list[str], row: int) -> int:
    return len(partition(outputs, devices, [row]))


def identify(outputs: dict, devices: list[str], rows: list[int], queries: list[str],
             truth: list[list[str]]) -> dict:
    """Leave one device out: per query device (whose class in ``truth`` has another
    member), the other devices equal to it on ``rows``; right when they are exactly the
    other members of its class."""
    class_of = {device: group for group in truth for device in group}
    asked = [d for d in queries if len(class_of[d]) > 1]
    right = []
    for device in asked:
        key = [outputs[device][row].tobytes() for row in rows]
        matched = {other for other in devices if other != device
                   and [outputs[other][row].tobytes() for row in rows] == key}
        right.append(matched == set(class_of[device]) - {device})
    return {"queries": len(asked), "identified": int(sum(right)),
            "accuracy": float(np.mean(right)) if asked else float("nan")}


def probe_tables(outputs: dict, probe_rows: list[int], natural_rows: list[int],
                 search_devices: list[str], natural_indices: list[int] | None = None) -> dict:
    """The classes per input, the summary against the natural samples, and identify with
    1, 2, 3 inputs, on the held-out devices (every device not searched on)."""
    devices = list(outputs)
    held_out = [d for d in devices if d not in search_devices]
    searched = [d for d in search_devices if d in outputs]
    if len(held_out) < 2:
        raise StudyError(f"held-out devices {held_out}: at least two are needed to count "
                         "classes on them (every other device was searched on)")
    natural_indices = natural_indices or list(range(len(natural_rows)))
    label = {row: f"probe {k}" for k, row in enumerate(probe_rows)} | {
        row: f"test sample {index}" for index, row in zip(natural_indices, natural_rows,
                                                          strict=True)}
    test_index = dict(zip(natural_rows, natural_indices, strict=True))
    per_input = [{"input": label[row], "kind": "natural" if row in test_index else "probe",
                  "test_index": test_index.get(row, -1),
                  "classes_held_out": classes(outputs, held_out, row),
                  "classes_search": classes(outputs, searched, row),
                  "classes_all": classes(outputs, devices, row)}
                 for row in probe_rows + natural_rows]
    natural = [r for r in per_input if r["kind"] == "natural"]
    best_natural = max(natural, key=lambda r: r["classes_held_out"])
    best_probe = max(per_input[: len(probe_rows)], key=lambda r: r["classes_held_out"])
    summary = [
        {"measure": "held-out devices", "classes": len(held_out),
         "inputs": ", ".join(held_out)},
        {"measure": "best probe", "classes": best_probe["classes_held_out"],
         "inputs": best_probe["input"]},
        {"measure": "best natural sample", "classes": best_natural["classes_held_out"],
         "inputs": best_natural["input"]},
        {"measure": "all probes together", "classes": len(partition(outputs, held_out,
                                                                     probe_rows)),
         "inputs": f"{len(probe_rows)} probes"},
        {"measure": "finest partition, all natural samples",
         "classes": len(partition(outputs, held_out, natural_rows)),
         "inputs": f"{len(natural_rows)} natural samples"},
        {"measure": "finest partition, natural samples and probes",
         "classes": len(partition(outputs, held_out, natural_rows + probe_rows)),
         "inputs": f"{len(natural_rows) + len(probe_rows)} inputs"},
    ]
    # Identify: probes in the search's order; natural samples chosen the same way (greedy,
    # on the search devices only), so neither side sees a held-out device when chosen.
    truth = partition(outputs, devices, natural_rows + probe_rows)
    natural_order = greedy_order(outputs, searched, natural_rows, max(IDENTIFY_INPUTS))
    identify_rows = []
    for count in IDENTIFY_INPUTS:
        for kind, order in (("probes", probe_rows), ("natural samples", natural_order)):
            if count > len(order):
                continue
            which = ", ".join(label[row] for row in order[:count])
            for queries, asked in (("held-out", held_out), ("all", devices)):
                result = identify(outputs, devices, order[:count], asked, truth)
                identify_rows.append({"inputs": kind, "count": count, "which": which,
                                      "queried": queries, **result})
    return {"per_input": per_input, "summary": summary, "identify": identify_rows,
            "held_out": held_out}


def plot_probes(per_input: list[dict], summary: list[dict], probe_images: np.ndarray,
                natural_images: np.ndarray, natural_indices: list[int], out) -> None:
    """Left: classes per input on the held-out devices, natural samples (a histogram)
    against the probes, with the finest natural partition. Right: each probe beside its
    nearest natural sample (L2)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bitdrift.atomic import save_figure

    by = {row["measure"]: row["classes"] for row in summary}
    n_probes = len(probe_images)
    figure = plt.figure(figsize=(11, max(3.6, 1.6 * n_probes)))
    grid = figure.add_gridspec(n_probes, 3, width_ratios=[3.4, 1, 1])
    left = figure.add_subplot(grid[:, 0])
    natural = [r["classes_held_out"] for r in per_input if r["kind"] == "natural"]
    probes = [r["classes_held_out"] for r in per_input if r["kind"] == "probe"]
    natural_all = [r["classes_all"] for r in per_input if r["kind"] == "natural"]
    probes_all = [r["classes_all"] for r in per_input if r["kind"] == "probe"]
    devices_all = max(natural_all + probes_all)
    bins = np.arange(0.5, max(devices_all, by["held-out devices"]) + 1.5)
    left.hist([natural, natural_all], bins=bins, color=["0.55", "C0"], alpha=0.8,
              label=[f"natural samples ({len(natural)}): held-out devices",
                     "natural samples: all devices (search + held out)"])
    top = left.get_ylim()[1]
    for k, (value, value_all) in enumerate(zip(probes, probes_all, strict=True)):
        height = top * (0.5 + 0.1 * k)
        left.plot(value - 0.2, height, "v", color="C3", ms=9,
                  label="probes, held-out devices" if k == 0 else None)
        left.plot(value_all + 0.2, height, "v", color="C1", ms=9,
                  label="probes, all devices" if k == 0 else None)
        left.annotate(f"probe {k}", (value_all + 0.2, height), xytext=(6, -3),
                      textcoords="offset points", fontsize=7, color="C1")
    finest = by["finest partition, all natural samples"]
    left.axvline(finest, color="0.3", ls="--",
                 label=f"held out: finest partition over all natural samples ({finest})")
    left.axvline(by["held-out devices"], color="k", ls=":",
                 label=f"held-out devices ({by['held-out devices']})")
    left.set_xlabel("bitwise classes the input splits the devices into")
    left.set_ylabel("inputs")
    left.set_title("classes per input; the probes were searched without the held-out devices",
                   fontsize=9)
    left.legend(fontsize=7, loc="upper left")
    flat = natural_images.reshape(len(natural_images), -1)
    for k, probe in enumerate(probe_images):
        nearest = int(np.argmin(((flat - probe.reshape(1, -1)) ** 2).sum(axis=1)))
        for column, (image, title) in enumerate(
                ((probe, f"probe {k}: {probes[k]} classes"),
                 (natural_images[nearest], f"nearest: test {natural_indices[nearest]}, "
                  f"{natural[nearest]} classes"))):
            ax = figure.add_subplot(grid[k, 1 + column])
            ax.imshow(np.clip(image.squeeze(), 0, 1), cmap="gray" if image.shape[-1] != 3
                      else None)
            ax.set_title(title, fontsize=7)
            ax.set_axis_off()
    figure.tight_layout()
    save_figure(figure, out)


def write_probe_tables(tables: dict, out: dict) -> None:
    from bitdrift.atomic import write_csv

    write_csv(tables["per_input"], out["classes"],
              columns=["input", "kind", "test_index", "classes_held_out", "classes_search",
                       "classes_all"])
    write_csv(tables["summary"], out["summary"], columns=["measure", "classes", "inputs"])
    write_csv(tables["identify"], out["identify"],
              columns=["inputs", "count", "which", "queried", "queries", "identified",
                       "accuracy"])


def evaluate_probes(probe_file, evaluation_file, records: list, out: dict) -> dict:
    """The tables (``out``: classes, summary, identify CSVs) and the figure (``out``:
    figure) of one model's probes."""
    provenance = read_provenance(probe_file)
    probe_rows, natural_rows = evaluation_rows(evaluation_file)
    outputs = read_outputs(records)
    wanted = set(probe_rows + natural_rows)
    short = [str(path) for path, rows in zip(records, outputs.values(), strict=True)
             if not wanted <= set(rows)]
    if short:
        raise StudyError(f"records {short}: not of the evaluation set {evaluation_file} "
                         f"(rows {min(wanted)}..{max(wanted)} missing)")
    tables = probe_tables(outputs, probe_rows, natural_rows, provenance["devices"],
                          natural_indices=natural_rows)
    write_probe_tables(tables, out)
    images = read_dataset(evaluation_file, splits=("test",))["x_test"]
    plot_probes(tables["per_input"], tables["summary"], images[probe_rows],
                images[natural_rows], natural_rows, out["figure"])
    return tables
