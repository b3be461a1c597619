"""The batch-invariance tables and figure, from the devices' run files (`runs.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bitdrift.errors import RecordError
from bitdrift.studies.batching.runs import first_divergence

LAYER_COLUMNS = ["device", "backend", "layer", "layer_class", "setting", "inputs",
                 "inputs_differing", "remaining_precision", "differing_share", "verdict",
                 "origin"]
DECODING_COLUMNS = ["device", "prompt", "setting", "first_divergent_token",
                    "largest_logit_change", "smallest_margin", "completion"]
SUMMARY_COLUMNS = ["device", "backend", "settings", "settings_differing",
                   "first_layer_differing", "origin_layers", "prompts",
                   "first_divergent_token", "distinct_completions",
                   "largest_logit_change", "smallest_margin"]
RUN_KEYS = ("device", "backend", "layers", "settings", "verdicts", "decoding", "prompts")


def read_run(path) -> dict:
    """A device's run file; RecordError naming the file if it is not one."""
    try:
        run = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise RecordError(f"{path}: not a batch-invariance run file ({error})") from error
    missing = [key for key in RUN_KEYS if key not in run]
    if missing:
        raise RecordError(f"{path}: not a batch-invariance run file (missing {missing})")
    return run


def origins(verdicts: list[dict], inbound: dict[str, list[str]]) -> set[tuple]:
    """(setting, input, layer) of every layer whose output differs from its batch-of-1
    output while every recorded layer it takes equals its own: where a difference
    starts, not where it is passed on. Inputs the run did not record (the token input,
    a mask) count as equal: the study builds them identically in every batch."""
    equal = {(v["setting"], v["input"], v["layer"]): v["equal"] for v in verdicts}
    return {(setting, index, layer) for (setting, index, layer), same in equal.items()
            if not same and all(equal.get((setting, index, source), True)
                                for source in inbound.get(layer, []))}


def batching_tables(runs: list[dict], inbound: dict[str, list[str]], vocabulary: list[str]):
    """{layers, decoding, summary} rows (lists of dicts) of the devices' runs."""
    layer_rows, decoding_rows, summary_rows = [], [], []
    for run in runs:
        classes = dict(map(tuple, run["layers"]))
        started = origins(run["verdicts"], inbound)
        baseline = run["settings"][0]["name"]  # alone: each input against itself
        cells: dict[tuple, list[dict]] = {}
        for verdict in run["verdicts"]:
            if verdict["setting"] == baseline:
                continue
            cells.setdefault((verdict["layer"], verdict["setting"]), []).append(verdict)
        mine = []
        for (layer, setting), entries in cells.items():
            differing = [e for e in entries if not e["equal"]]
            mine.append({
                "device": run["device"], "backend": run["backend"], "layer": layer,
                "layer_class": classes.get(layer, ""), "setting": setting,
                "inputs": len(entries), "inputs_differing": len(differing),
                "remaining_precision": min(e["remaining_precision"] for e in entries),
                "differing_share": max(e["differing_share"] for e in entries),
                "verdict": "differs" if differing else "equal",
                "origin": any((setting, e["input"], layer) in started for e in entries)})
        layer_rows += mine
        by_prompt: dict[int, dict[str, dict]] = {}
        for entry in run["decoding"]:
            by_prompt.setdefault(entry["prompt"], {})[entry["setting"]] = entry
        firsts = []
        for prompt, by_setting in by_prompt.items():
            prompt_text = " ".join(vocabulary[t] for t in run["prompts"][prompt])
            for setting, entry in by_setting.items():
                first = first_divergence(by_setting[baseline]["tokens"], entry["tokens"])
                firsts.append(first)
                decoding_rows.append({
                    "device": run["device"], "prompt": prompt_text, "setting": setting,
                    "first_divergent_token": first,
                    "largest_logit_change": entry["largest_logit_change"],
                    "smallest_margin": entry["smallest_margin"],
                    "completion": " ".join(vocabulary[t] for t in entry["tokens"])})
        differing_layers = {r["layer"] for r in mine if r["verdict"] == "differs"}
        first_differing = [layer for layer, _ in run["layers"] if layer in differing_layers]
        diverged = [first for first in firsts if first is not None]
        summary_rows.append({
            "device": run["device"], "backend": run["backend"],
            "settings": len(run["settings"]) - 1,
            "settings_differing": sum(r["verdict"] == "differs" for r in mine
                                      if r["layer"] == run["layers"][-1][0]),
            "first_layer_differing": first_differing[0] if first_differing else "",
            "origin_layers": ";".join(dict.fromkeys(
                layer for layer, _ in run["layers"]
                if any(key[2] == layer for key in started))),
            "prompts": len(by_prompt),
            "first_divergent_token": min(diverged) if diverged else None,
            "distinct_completions": max((len({tuple(e["tokens"]) for e in by.values()})
                                         for by in by_prompt.values()), default=0),
            "largest_logit_change": max((e["largest_logit_change"] for e in run["decoding"]),
                                        default=0.0),
            "smallest_margin": min((e["smallest_margin"] for e in run["decoding"]),
                                   default=np.inf)})
    return {"layers": layer_rows, "decoding": decoding_rows, "summary": summary_rows}


def plot_batching(runs: list[dict], tables: dict, out) -> None:
    """Per device, layers x batch settings: a cell per verdict (bit-equal to batch of 1,
    or the remaining precision of the worst input), origins marked; the title gives the
    decoding symptom."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    from bitdrift.analysis.remaining_precision import MANTISSA_BITS
    from bitdrift.atomic import save_figure

    summary = {row["device"]: row for row in tables["summary"]}
    columns = min(len(runs), 3)
    rows = -(-len(runs) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 4.8 * rows),
                                squeeze=False, gridspec_kw={"wspace": 0.55, "hspace": 0.7})
    colours = plt.get_cmap("magma")(np.linspace(0.1, 0.9, 64))
    for axis in axes.ravel()[len(runs):]:
        axis.axis("off")
    for axis, run in zip(axes.ravel(), runs, strict=False):
        layers = [layer for layer, _ in run["layers"]]
        settings = [s["name"] for s in run["settings"]][1:]
        bits = MANTISSA_BITS.get(run.get("precision", "float32"), 23)
        cells = {(r["layer"], r["setting"]): r for r in tables["layers"]
                 if r["device"] == run["device"]}
        grid = np.full((len(layers), len(settings)), np.nan)
        for i, layer in enumerate(layers):
            for j, setting in enumerate(settings):
                cell = cells[(layer, setting)]
                if cell["verdict"] == "differs":
                    grid[i, j] = max(cell["remaining_precision"], 0)
        axis.set_facecolor("#d9f0d3")  # bit-equal cells show the background
        image = axis.imshow(np.ma.masked_invalid(grid), aspect="auto", vmin=0, vmax=bits,
                            cmap=ListedColormap(colours), interpolation="nearest")
        for i, layer in enumerate(layers):
            for j, setting in enumerate(settings):
                if cells[(layer, setting)]["origin"]:
                    axis.plot(j, i, marker="o", markersize=3, color="#1f77b4")
        axis.set_yticks(range(len(layers)), layers, fontsize=6)
        axis.set_xticks(range(len(settings)), settings, rotation=90, fontsize=6)
        row = summary[run["device"]]
        first = row["first_divergent_token"]
        axis.set_title(f"{run['device']}: test inputs' logits differ in "
                       f"{row['settings_differing']}/{row['settings']} settings\ndecoding: "
                       + (f"first divergent token {first}, up to "
                          f"{row['distinct_completions']} completions" if first
                          else "every setting gives the batch-of-1 text")
                       + f"\ndecoding logits moved up to {row['largest_logit_change']:.1e}; "
                         f"closest top-2 gap {row['smallest_margin']:.1e}", fontsize=8)
    figure.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6,
                    label="remaining precision (bits) where not bit-equal")
    figure.suptitle("Batch invariance per layer: green = bit-equal to the input run alone; "
                    "dot = the difference starts in this layer", fontsize=10)
    save_figure(figure, out, bbox_inches="tight")


def write_batching(run_files: list, model_path, out_tables: dict, out_figure,
                   vocabulary: list[str]) -> dict:
    """Read the run files, write the three tables (CSV and HTML) and the figure."""
    from bitdrift.atomic import write_csv
    from bitdrift.inputs.models import layer_inbound

    runs = [read_run(path) for path in run_files]
    tables = batching_tables(runs, layer_inbound(model_path), vocabulary)
    for key, columns in (("layers", LAYER_COLUMNS), ("decoding", DECODING_COLUMNS),
                         ("summary", SUMMARY_COLUMNS)):
        write_csv(tables[key], out_tables[key], columns)
    plot_batching(runs, tables, out_figure)
    return tables
