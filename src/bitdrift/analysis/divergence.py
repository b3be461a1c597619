"""Where devices part ways: for two classes of the final output, the first layer (by
position) at which their representatives differ bitwise, what kind of layer it is, how
much precision the two still share there, the layer just before it, and the layer where
they agree again if they do. From the per-layer records only; a record without layers is
said to have none, never guessed.

Pairs are compared within one declared precision: a float16 and a float32 device differ
at every layer by construction, and such pairs (71 % of the default's) would say nothing
about where devices part ways. Cross-format pairs are counted, never compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from bitdrift.analysis.eqc import analyse, layered_subgroup, summarize_repeats
from bitdrift.analysis.kernels import divergence_kernels
from bitdrift.analysis.observer import record_check
from bitdrift.analysis.remaining_precision import MANTISSA_BITS, dropped_bits
from bitdrift.record.reader import Record, group_by_model

DIVERGENCE_COLUMNS = ["model", "sample", "class_a", "class_b", "device_a", "device_b",
                      "first_layer", "first_position", "layer_class",
                      "remaining_precision_at_first", "previous_layer", "note", "precision",
                      "rejoins_at", "kernels_a", "kernels_b", "kernels_differ", "orders_a",
                      "orders_b", "deployed_differs"]


def _pair_precision(record_a: Record, record_b: Record, sample: int, label: str) -> float:
    """Remaining precision of one layer between two devices' representatives; NaN where a
    record holds the layer's digests only (a sample outside analysis.full_samples: where
    the two part is known from the digests, how far apart they are is not)."""
    tensors = []
    infos = [next(i for i in record.layers(sample) if i.label == label)
             for record in (record_a, record_b)]
    if not all(record.has_values(sample, info)
               for record, info in zip((record_a, record_b), infos, strict=True)):
        return float("nan")
    for record, info in zip((record_a, record_b), infos, strict=True):
        tensor = record.tensor(sample, info)
        _, representative = summarize_repeats(record.device, tensor.values, tensor.float_format)
        tensors.append((representative, tensor.float_format))
    (a, format_a), (b, format_b) = tensors
    if format_a != format_b or a.shape != b.shape:
        return float("nan")
    return float(max(MANTISSA_BITS[format_a] - dropped_bits(a, b, format_a), 0))


@dataclass
class _LayerClasses:
    """What the table needs of one layer's LayerResult: its classes, not the outputs the
    result's keys hold (keeping those kept every record's tensors: 3.6 GB for four
    ResNet-50 records at 224). Memory stays one layer over all devices, as eqc's."""

    layer: str
    position: int
    layer_class: str
    classes: list[int]
    final: bool


def divergence_table(records: list[Record]) -> pd.DataFrame:
    """Per declared precision: one row per pair of final-output classes (their first
    devices of that precision), and one per device against the first device of its
    precision; ``first_layer`` empty where they never differ or where the records hold no
    layers (``note`` says which); ``rejoins_at`` the first later layer where the two are
    bitwise equal again (a pair can part at a convolution and agree after a ReLU or a
    pooling); ``deployed_differs`` the pair's devices whose deployed final output differs
    from their instrumented one on the sample (bitdrift.analysis.observer)."""
    rows = []
    for model, group in group_by_model(records):
        by_sample = _layer_classes(group)
        # Devices that record layers, apart from those that record the final output alone
        # (a compiled graph: Inductor, ExecuTorch), whose presence would leave no layer
        # common to all: the pairs of layered devices part at a layer of their own records
        # (bitdrift.analysis.eqc.layered_subgroup: the per-layer classes take the same)
        subgroup = layered_subgroup(group) or []
        layered_members = [index for index, record in enumerate(group)
                           if any(record is member for member in subgroup)]
        among_layered = _layer_classes(subgroup) if subgroup else {}
        formats: dict[str, list[int]] = {}
        for index, record in enumerate(group):
            formats.setdefault(record.precision, []).append(index)
        for sample, results in by_sample.items():
            results.sort(key=lambda r: r.position)
            final = next(r for r in results if r.final)
            layered = len(results) > 1
            for precision, members in formats.items():
                for i, j in _pairs(final.classes, members):
                    if i in layered_members and j in layered_members and \
                            among_layered.get(sample):
                        sub = sorted(among_layered[sample], key=lambda r: r.position)
                        rows.append(_pair_row(model, sample, precision, group, sub, final,
                                              len(sub) > 1, i, j, layered_members.index(i),
                                              layered_members.index(j)))
                        continue
                    rows.append(_pair_row(model, sample, precision, group, results, final,
                                          layered, i, j))
    table = divergence_kernels(records, pd.DataFrame(rows, columns=DIVERGENCE_COLUMNS[:-6]))
    # ... and the order each one summed in there, where that layer is a Dense or Conv2D
    # layer with a revealed order (bitdrift.analysis.accumulation): the why below the kernels' names
    orders = {(record.model, record.device): record.accumulation_orders or {}
              for record in records}
    for side in ("a", "b"):
        table[f"orders_{side}"] = [
            (orders.get((model, device), {}).get(layer) or {}).get("order", "")
            if layer else "" for model, device, layer in
            zip(table["model"], table[f"device_{side}"], table["first_layer"], strict=True)]
    # Which of the two devices' deployed model gives another final output than its own
    # instrumented run on the sample (bitdrift.analysis.observer): a pair whose every
    # recorded layer agrees and whose final outputs part is parted by that device's
    # deployment, not by where the two devices' layers part
    deployed = {(record.model, record.device): _deployed_differs(record) for record in records}
    table["deployed_differs"] = [
        " ".join(device for device in (device_a, device_b)
                 if int(sample) in deployed.get((model, device), ()))
        for model, sample, device_a, device_b in zip(
            table["model"], table["sample"], table["device_a"], table["device_b"],
            strict=True)]
    table["first_position"] = pd.array(
        [None if p == "" else int(p) for p in table["first_position"]], dtype="Int64")
    return table


def _deployed_differs(record: Record) -> set[int]:
    """The samples on which the record's deployed final output differs from its
    instrumented one (none for a record without the deployed output)."""
    check = record_check(record)
    return {int(sample) for sample, equal in (check or {}).get("samples", {}).items()
            if not equal}


def class_pairs(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of distinct class pairs that part: one per (model, precision, sample, two
    different final-output classes), the first, which is the two classes' representatives
    (divergence_table lists them before each device against the first device, which can
    meet the same two classes again: a second device of one class against another class).
    Rows of devices of one class, and rows that never part, are left out."""
    if table.empty:
        return table
    first = table["first_layer"].fillna("").astype(str).replace("nan", "")
    parted = table[(table["class_a"] != table["class_b"]) & (first != "")]
    keys = [key for key in ("model", "precision", "sample") if key in table.columns]
    low = np.minimum(parted["class_a"], parted["class_b"])
    high = np.maximum(parted["class_a"], parted["class_b"])
    return parted[~pd.DataFrame({**{key: parted[key] for key in keys}, "low": low,
                                 "high": high}).duplicated()]


def _pairs(classes: list[int], members: list[int]) -> list[tuple[int, int]]:
    """Class representatives (first device of each class among ``members``) pairwise,
    then each member against the first member."""
    representatives: dict[int, int] = {}
    for index in members:
        representatives.setdefault(classes[index], index)
    pairs = [(representatives[a], representatives[b])
             for a in sorted(representatives) for b in sorted(representatives) if a < b]
    return pairs + [(members[0], index) for index in members[1:]
                    if (members[0], index) not in pairs]


def _layer_classes(group: list[Record]) -> dict[int, list]:
    """{sample: [_LayerClasses]} of the records' common layers (bitdrift.analysis.eqc.analyse)."""
    by_sample: dict[int, list[_LayerClasses]] = {}
    for result in analyse(group, layers=True, remaining_precision=False):
        by_sample.setdefault(result.sample, []).append(_LayerClasses(
            result.layer, result.position, result.layer_class, result.classes,
            result.final))
    return by_sample


def _pair_row(model, sample, precision, group, results, final, layered, i, j,
              result_i=None, result_j=None) -> dict:
    """``result_i``, ``result_j``: the pair's indices in ``results`` where those are the
    classes among a subgroup of the devices (default: ``i``, ``j``)."""
    result_i = i if result_i is None else result_i
    result_j = j if result_j is None else result_j
    row = {"model": model, "sample": sample, "class_a": final.classes[i],
           "class_b": final.classes[j], "device_a": group[i].device,
           "device_b": group[j].device, "first_layer": "", "first_position": "",
           "layer_class": "", "remaining_precision_at_first": np.nan,
           "previous_layer": "", "note": "", "precision": precision, "rejoins_at": ""}
    apart = next((k for k, r in enumerate(results)
                  if r.classes[result_i] != r.classes[result_j]), None)
    if not layered:
        row["note"] = "no layers recorded"
    if apart is None:
        row["note"] = row["note"] or "bitwise identical at every layer"
    elif layered:
        result = results[apart]
        rejoin = next((r.layer for r in results[apart + 1:]
                       if r.classes[result_i] == r.classes[result_j]), "")
        row.update({
            "first_layer": result.layer, "first_position": result.position,
            "layer_class": result.layer_class,
            "remaining_precision_at_first": _pair_precision(group[i], group[j], sample,
                                                            result.layer),
            "previous_layer": results[apart - 1].layer if apart else "",
            "rejoins_at": rejoin})
        if np.isnan(row["remaining_precision_at_first"]):
            row["note"] = "different float formats or shapes: no precision shared"
    return row


def pairs_apart(eqc_layers: pd.DataFrame) -> pd.DataFrame:
    """Per (model, sample, precision, layer): the share of device pairs of that precision
    in different classes at that layer, and the share apart at it or at any layer before
    (from ``eqc_layers.csv``). Pairs of two precisions are not compared: their number per
    (model, sample) is ``cross_format_pairs``. Devices that record the final output alone
    where others record layers are left out of the pairs and named in
    ``left_out_devices``. A table without a ``precision`` column
    (older runs) is taken as one precision."""
    if "precision" not in eqc_layers.columns:
        eqc_layers = eqc_layers.assign(precision="")
    rows = []
    for (model, sample), part in eqc_layers.groupby(["model", "sample"], sort=False):
        # A device with fewer layers than the others records the final output alone
        # (bitdrift.analysis.eqc.eqc_tables: the layers are those of the devices that
        # record them): the pairs are those of the devices at every layer, as
        # divergence_table compares them, and the others are named
        layers_of = part.groupby("device", sort=False)["layer"].nunique()
        left_out = " ".join(layers_of.index[layers_of < layers_of.max()])
        part = part[part["device"].isin(layers_of.index[layers_of == layers_of.max()])]
        devices = part.drop_duplicates("device")
        counts = devices["precision"].value_counts()
        total = len(devices) * (len(devices) - 1) // 2
        cross = total - int(sum(n * (n - 1) // 2 for n in counts))
        for precision, rows_of_format in part.groupby("precision", sort=False):
            rows += [{**row, "left_out_devices": left_out}
                     for row in _shares(model, sample, precision, rows_of_format, cross)]
    return pd.DataFrame(rows, columns=["model", "sample", "precision", "layer", "position",
                                       "share_apart", "share_apart_so_far", "n_pairs",
                                       "cross_format_pairs", "left_out_devices"])


def _shares(model, sample, precision, part: pd.DataFrame, cross: int) -> list[dict]:
    part = part.sort_values(["position", "device"], kind="stable")
    devices = list(dict.fromkeys(part["device"]))
    n_pairs = len(devices) * (len(devices) - 1) // 2
    seen_apart = np.zeros((len(devices), len(devices)), dtype=bool)
    upper = np.triu_indices(len(devices), 1)
    rows = []
    for (position, layer), layer_rows in part.groupby(["position", "layer"], sort=True):
        classes = layer_rows.set_index("device").loc[devices, "eqc"].to_numpy()
        apart = classes[:, None] != classes[None, :]
        seen_apart |= apart
        rows.append({"model": model, "sample": sample, "precision": precision,
                     "layer": layer, "position": position,
                     "share_apart": float(apart[upper].mean()) if n_pairs else 0.0,
                     "share_apart_so_far": float(seen_apart[upper].mean())
                     if n_pairs else 0.0, "n_pairs": n_pairs, "cross_format_pairs": cross})
    return rows
