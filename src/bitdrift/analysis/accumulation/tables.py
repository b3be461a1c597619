"""The orders over records: ``accumulation_orders.csv``, and the pair of devices whose
orders contrast best at a divergence (the kernels figure).
"""

from __future__ import annotations

from bitdrift.analysis.accumulation.probes import PROBED_CLASSES
from bitdrift.analysis.accumulation.trees import from_flat

# -- the table over records ------------------------------------------------------------------
TABLE_COLUMNS = ["model", "device", "backend", "layer", "terms", "order", "replay",
                 "fused_product"]


def orders_table(records) -> list[dict]:
    """``accumulation_orders.csv``: per device and Dense layer, the revealed order and its
    replay, and where it replayed with FMA and two products meet, the one the kernel fuses
    (``fused_product``: bitdrift.record.orders.FUSED_PRODUCTS; empty elsewhere, and in
    records made before the replay tried both). Records without orders are left out."""
    rows = []
    for record in records:
        for layer, entry in (record.accumulation_orders or {}).items():
            rows.append({"model": record.model, "device": record.device,
                         "backend": record.attr("backend"), "layer": layer,
                         "terms": entry.get("terms", ""), "order": entry.get("order", ""),
                         "replay": entry.get("replay", ""),
                         "fused_product": entry.get("fused_product", "")})
    return rows


def contrasting_pair(divergence, records, model: str | None = None) -> dict | None:
    """The two devices whose orders the figure draws: a class pair whose first divergent
    layer is a Dense or Conv2D layer with both orders revealed and different (float32
    first), else the two largest groups of devices by order at the first layer where revealed
    orders differ (``first_divergence`` False); None where no two orders differ.
    Returns {"model", "layer", "devices": [a, b], "orders": [...], "trees": [Node, Node],
    "bias": bool, "first_divergence": bool}. With ``model``, that model's pair only."""
    found = {(record.model, record.device): record.accumulation_orders or {}
             for record in records if model is None or record.model == model}
    if model is not None and len(divergence):
        divergence = divergence[divergence["model"] == model]

    def entry(model, device, layer):
        return found.get((model, device), {}).get(layer) or {}

    def revealed(item):
        return "trees" in item and len(item["trees"]) == 1

    def pick(model, layer, devices, first):
        items = [entry(model, device, layer) for device in devices]
        return {"model": model, "layer": layer, "devices": list(devices),
                "orders": [item["order"] for item in items],
                "trees": [from_flat(item["trees"][0], item["terms"]) for item in items],
                # records written before the entry kept "bias" say it in the order's name
                "bias": bool(items[0].get("bias", ", bias " in items[0]["order"])),
                "first_divergence": first}

    rows = divergence[divergence["layer_class"].astype(str).isin(PROBED_CLASSES)] \
        if len(divergence) else divergence
    for precision in ("float32", "float64"):
        for row in rows[rows["precision"] == precision].itertuples() if len(rows) else []:
            a = entry(row.model, row.device_a, row.first_layer)
            b = entry(row.model, row.device_b, row.first_layer)
            if revealed(a) and revealed(b) and a["order"] != b["order"]:
                return pick(row.model, row.first_layer, (row.device_a, row.device_b), True)
    by_layer: dict[tuple[str, str], dict[str, list[str]]] = {}
    for (model, device), orders in found.items():
        for layer, item in orders.items():
            if revealed(item):
                by_layer.setdefault((model, layer), {}).setdefault(item["order"], []).append(
                    device)
    for (model, layer), groups in by_layer.items():
        if len(groups) > 1:
            largest = sorted(groups.values(), key=len, reverse=True)[:2]
            return pick(model, layer, (largest[0][0], largest[1][0]), False)
    return None
