"""Tables of the ablation study: per-layer precision of every model variant (Figures
SUP-4..7), deviations before and after each activation (Table SUP-8), layers that raise,
keep or lower the remaining precision (Table SUP-9), the variants' test accuracy (Table
SUP-7) and precision casting (main paper Figure 6, Figures SUP-2/3).

The per-layer numbers come from the core's analysis (`bitdrift.analysis.eqc.precision_rows`) over
the records the spine's inference rule wrote, so a variant is analysed exactly as the
main study's models are.
"""

from __future__ import annotations

import h5py
import numpy as np
import pandas as pd

from bitdrift.analysis.eqc import precision_rows
from bitdrift.analysis.remaining_precision import MANTISSA_BITS
from bitdrift.errors import StudyError
from bitdrift.inputs.models import layer_kind
from bitdrift.record.hdf5 import OUTPUT

VARIANT_COLUMNS = ["base", "variant", "model", "activation", "pooling", "trained"]
LAYER_COLUMNS = [*VARIANT_COLUMNS, "sample", "layer", "position", "layer_index",
                 "layer_class", "layer_kind", "n_devices", "n_eqc", "remaining_precision",
                 "deviating_fraction", "significant_bits_mean", "significant_bits_min"]
ACTIVATION_COLUMNS = [*VARIANT_COLUMNS, "layer", "layer_index", "previous_layer",
                      "deviating_before", "deviating_after", "samples"]
EFFECT_COLUMNS = [*VARIANT_COLUMNS, "layer_kind", "increase", "unaffected", "decrease",
                  "layers", "samples"]
ACCURACY_COLUMNS = [*VARIANT_COLUMNS, "test_accuracy", "classes", "chance", "init_sha256",
                    "flag"]
CASTING_COLUMNS = ["base", "precision", "sample", "layer", "position", "layer_class",
                   "n_devices", "n_eqc", "remaining_precision", "mantissa_bits",
                   "remaining_share"]


def ablation_layers(variants: list[dict], records: dict, precision: str) -> pd.DataFrame:
    """Per variant (entries of config.variants_of), sample and layer: classes, remaining
    precision, deviating share and significant bits over ``records[model]`` at
    ``precision``. ``layer_index`` counts the input layer as 0, as Table SUP-8 does."""
    rows = []
    for entry in variants:
        if entry["model"] not in records:
            raise StudyError(f"no records of model {entry['model']!r}")
        for row in precision_rows(records[entry["model"]], precision, significant=True):
            rows.append({**{key: entry[key] for key in VARIANT_COLUMNS},
                         "sample": row["sample"], "layer": row["layer"],
                         "position": row["position"], "layer_index": row["position"] + 1,
                         "layer_class": row["layer_class"],
                         "layer_kind": layer_kind(row["layer_class"]),
                         **{key: row[key] for key in ("n_devices", "n_eqc",
                                                      "remaining_precision",
                                                      "deviating_fraction",
                                                      "significant_bits_mean",
                                                      "significant_bits_min")}})
    return pd.DataFrame(rows, columns=LAYER_COLUMNS)


def _layer_sequences(layers: pd.DataFrame):
    """Per (variant, sample): its layers in model order, the final output left out (it
    is the last layer's tensor again)."""
    part = layers[layers["layer"] != OUTPUT]
    for key, group in part.groupby(["base", "variant", "sample"], sort=False):
        yield key, group.sort_values("position").reset_index(drop=True)


def activation_deviations(layers: pd.DataFrame) -> pd.DataFrame:
    """Table SUP-8: per variant and activation layer, the share of values that are not
    identical on all devices in the layer before it and in the activation's output,
    averaged over samples."""
    rows = []
    for _, sequence in _layer_sequences(layers):
        for index in range(1, len(sequence)):
            row = sequence.iloc[index]
            if row["layer_kind"] != "activation":
                continue
            previous = sequence.iloc[index - 1]
            rows.append({**{key: row[key] for key in VARIANT_COLUMNS},
                         "layer": row["layer"], "layer_index": row["layer_index"],
                         "previous_layer": previous["layer"],
                         "deviating_before": previous["deviating_fraction"],
                         "deviating_after": row["deviating_fraction"]})
    if not rows:
        return pd.DataFrame(columns=ACTIVATION_COLUMNS)
    table = pd.DataFrame(rows)
    keys = [*VARIANT_COLUMNS, "layer", "layer_index", "previous_layer"]
    table = (table.groupby(keys, sort=False)
             .agg(deviating_before=("deviating_before", "mean"),
                  deviating_after=("deviating_after", "mean"),
                  samples=("deviating_after", "size")).reset_index())
    return table[ACTIVATION_COLUMNS]


def layer_effects(layers: pd.DataFrame) -> pd.DataFrame:
    """Table SUP-9: per variant and layer kind, how many layers increase, leave unaffected
    or decrease the remaining precision relative to the layer before them, averaged over
    samples (so a count can be fractional, as in the paper)."""
    rows = []
    for (*_, sample), sequence in _layer_sequences(layers):
        for index in range(1, len(sequence)):
            row, previous = sequence.iloc[index], sequence.iloc[index - 1]
            change = row["remaining_precision"] - previous["remaining_precision"]
            rows.append({**{key: row[key] for key in VARIANT_COLUMNS}, "sample": sample,
                         "layer_kind": row["layer_kind"] or "other",
                         "increase": int(change > 0), "unaffected": int(change == 0),
                         "decrease": int(change < 0)})
    if not rows:
        return pd.DataFrame(columns=EFFECT_COLUMNS)
    table = pd.DataFrame(rows)
    keys = [*VARIANT_COLUMNS, "layer_kind"]
    per_sample = table.groupby([*keys, "sample"], sort=False)[
        ["increase", "unaffected", "decrease"]].sum().reset_index()
    summary = per_sample.groupby(keys, sort=False).agg(
        increase=("increase", "mean"), unaffected=("unaffected", "mean"),
        decrease=("decrease", "mean"), samples=("sample", "size")).reset_index()
    summary["layers"] = summary[["increase", "unaffected", "decrease"]].sum(axis=1)
    return summary[EFFECT_COLUMNS]


def validation_accuracy(variants: list[dict], logits_files: dict) -> pd.DataFrame:
    """Table SUP-7: each variant's test accuracy, from the test logits its training job
    wrote, with the digest of its initial weights (an untrained variant shares its base's)
    and a flag where the accuracy is at chance (no finding can rest on such a model)."""
    rows = []
    for entry in variants:
        path = logits_files[entry["model"]]
        try:
            with h5py.File(path, "r") as handle:
                logits, labels = handle["logits"][()], handle["labels"][()]
                init = str(handle.attrs.get("init_sha256", ""))
        except (OSError, KeyError) as error:
            raise StudyError(f"{path}: not a test-logits file of `bitdrift train` "
                             f"({error})") from error
        classes = logits.shape[1]
        accuracy = float(np.mean(logits.argmax(axis=1) == labels))
        at_chance = accuracy < 1.5 / classes
        rows.append({**{key: entry[key] for key in VARIANT_COLUMNS},
                     "test_accuracy": accuracy, "classes": classes, "chance": 1 / classes,
                     "init_sha256": init,
                     "flag": "at chance" if at_chance and entry["trained"] else ""})
    return pd.DataFrame(rows, columns=ACCURACY_COLUMNS)


def precision_casting(base: str, records: list, precisions: list[str]) -> pd.DataFrame:
    """Figure 6: per precision, the classes and remaining precision (bits and share of
    that precision's mantissa) of the base model's devices computing in it, per layer."""
    rows = []
    present = {record.precision for record in records}
    for precision in precisions:
        if precision not in present:
            continue
        mantissa = MANTISSA_BITS[precision]
        for row in precision_rows(records, precision, significant=False):
            rows.append({"base": base, "precision": precision, "sample": row["sample"],
                         "layer": row["layer"], "position": row["position"],
                         "layer_class": row["layer_class"], "n_devices": row["n_devices"],
                         "n_eqc": row["n_eqc"],
                         "remaining_precision": row["remaining_precision"],
                         "mantissa_bits": mantissa,
                         "remaining_share": row["remaining_precision"] / mantissa})
    return pd.DataFrame(rows, columns=CASTING_COLUMNS)
