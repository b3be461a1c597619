"""How the layers sum: each Dense and Conv2D layer's revealed accumulation order in words,
and what numpy's replay in that order gave (accumulation_orders.csv)."""

from __future__ import annotations

import re

import pandas as pd

from bitdrift.record.orders import EITHER_FUSED
from bitdrift.report.findings.text import cut, first_within

# How an order label of accumulation_orders.csv
# (bitdrift.analysis.accumulation.names.summary) reads in a sentence; a label not listed is
# quoted as it is.
_SHAPES = [(r"^sequential, bias first$", "sequentially, starting from the bias"),
           (r"^sequential$", "sequentially, in index order"),
           (r"^pairwise$", "pairwise (balanced halves)"),
           (r"^single$", "as a single product"),
           (r"^(\d+) interleaved lanes$", r"in \1 interleaved partial sums"),
           (r"^blocks of (\d+)$", r"in blocks of \1 terms, then the blocks' sums"),
           (r"^other \(height (\d+)\)$", r"in an order of none of the shapes looked for "
            r"(sequential, pairwise, interleaved, blocks), \1 additions deep")]
_BIAS = {", bias last": ", the bias added last", ", bias inside": ", the bias added inside "
         "the sum"}


def order_phrase(order: str) -> str:
    """An order label as words: ``4 interleaved lanes, bias last`` -> ``in 4 interleaved
    partial sums, the bias added last``; per batch row where the rows differ; where the
    search looked at a sample of the output positions, saying the words hold there."""
    order = str(order)
    sampled = re.match(r"^(.*) \(order searched at (\d+) of (\d+) positions\)$", order)
    if sampled:
        return (f"{order_phrase(sampled[1])}, at the {sampled[2]} of {sampled[3]} output "
                "positions searched (the others' order not searched)")
    varies = re.match(r"^varies by position \((\d+) trees; searched at (.*) of (\d+x\d+)\): "
                      r"(.*)$", order)
    if varies:
        return (f"in an order that varies with the output position ({varies[1]} trees, "
                f"searched at {varies[2]} of the {varies[3]} grid: "
                + "; ".join(_place_phrase(part) for part in varies[4].split("; ")) + ")")
    if order.startswith("by batch row: "):
        return "by batch row (" + "; ".join(
            f"{rows}: {order_phrase(name)}" for rows, name in
            (part.split(": ", 1) for part in order[len("by batch row: "):].split("; "))) + ")"
    bias = next((suffix for suffix in _BIAS if order.endswith(suffix)), "")
    shape = order[:len(order) - len(bias)]
    parts = _parts_phrase(shape)
    if parts:
        return parts + _BIAS.get(bias, "")
    for pattern, words in _SHAPES:
        if re.match(pattern, shape):
            return re.sub(pattern, words, shape) + _BIAS.get(bias, "")
    return f"in the order `{order}`"


def _parts_phrase(shape: str) -> str | None:
    """Lanes or blocks whose parts do not sum in index order
    (bitdrift.analysis.accumulation.names.shape_name): ``blocks of 160, each other (height
    79)`` -> ``in blocks of 160 terms, each summed in an order of none of the shapes ...,
    79 additions deep, then the blocks' sums``; None for another label."""
    found = re.match(r"^(\d+ interleaved lanes|blocks of \d+), (each (.*)|of mixed orders "
                     r"\(height (\d+)\))$", shape)
    if not found:
        return None
    outer = order_phrase(found[1])
    each = (f"each summed {order_phrase(found[3])}" if found[3] else
            f"each in an order of its own, the deepest {found[4]} additions deep")
    if found[1].startswith("blocks"):  # "in blocks of B terms, then the blocks' sums"
        head, tail = outer.split(", then ", 1)
        return f"{head}, {each}, then {tail}"
    return f"{outer}, {each}"


def _place_phrase(part: str) -> str:
    """One part of a ``varies by position`` label (bitdrift.analysis.accumulation.names.order_name)
    as
    words: ``other (height 8), bias last: 4 trees at 257/256/255/256 pixels`` -> ``4
    trees, each 8 additions deep, ... over 257/256/255/256 pixels``."""
    unknown = re.match(r"^order unknown at (\d+) (pixels|places)$", part)
    if unknown:
        return f"the order is unknown at {unknown[1]} {unknown[2]}"
    found = re.match(r"^(.*?)(?:: (\d+) trees)? at ([\d/]+) (pixels|places)$", part)
    if not found:
        return f"`{part}`"
    trees = f"{found[2]} trees summing " if found[2] else "one tree summing "
    return f"{trees}{order_phrase(found[1])}, over {found[3]} {found[4]}"


def _replay_outcome(replay: str, fused_product: str = "") -> tuple[str, str]:
    """(kind, words) of a replay cell: ``same`` (the record's bits; with FMA, the product
    fused where two meet in the words, from the table's ``fused_product``), ``differs``,
    ``format`` (not replayed: computed in another format than float32), ``skipped`` (not
    replayed for another reason) or ``other`` (a cell this reader does not know, quoted)."""
    replay = str(replay)
    if replay.startswith("bit-identical "):
        words = replay[len("bit-identical "):]
        if fused_product == EITHER_FUSED:
            words += " (either product fused where two meet: the values do not tell which)"
        elif fused_product:
            words += f" (the product of {fused_product} fused where two meet)"
        return "same", words
    found = re.match(r"differs: (\d+) of (\d+) values bit-identical at best \((.*)\)$", replay)
    if found:
        return "differs", f"{found[1]} of {found[2]} values at best ({found[3]})"
    if replay.startswith("not replayed: "):
        reason = replay[len("not replayed: "):]
        return ("format", reason) if re.fullmatch(r"b?float\d+", reason) else \
            ("skipped", reason)
    return "other", replay


# A layer per column up to this many layers; more: a row per device summing its layers
ORDER_COLUMNS = 5
# The characters a cell keeps of an order's name or a reason (the table holds it whole)
CELL = 40
_ORDERS_SHOWN = 3  # a device's commonest orders named in the summary table


def _cut(text: str, most: int = CELL) -> str:
    return cut(text, most)


def short_order(order: str) -> str:
    """An order's name as a table cell says it: the positions searched left out (the
    legend says so), an order that varies by position or by batch row named as such."""
    order = re.sub(_SAMPLED_ORDER, "", str(order))
    varies = re.match(r"^varies by position \((\d+) trees", order)
    if varies:
        return f"varies by position ({varies[1]} trees)"
    if order.startswith("by batch row: "):
        return "varies by batch row"
    return _cut(order)


def replay_verdict(replay: str, fused_product: str = "") -> str:
    """What numpy's replay gave, as a table cell says it: ``same, FMA``, ``same, no FMA``
    (the record's bits; the product fused where two meet in brackets), ``264/384 values``
    (the most it reproduced), ``not run (float16)`` or ``not run (reason)``."""
    kind, words = _replay_outcome(str(replay).split("; ")[0], "")
    if kind == "same":
        fused = f" ({fused_product})" if fused_product and "with FMA" in words else ""
        return ("same, FMA" if words.startswith("with FMA") else "same, no FMA") + fused
    if kind == "differs":
        found = re.match(r"(\d+) of (\d+) values", words)
        return f"{found[1]}/{found[2]} values"
    if kind in ("format", "skipped"):
        return f"not run ({_cut(words, 24)})"
    return _cut(words, 24)


def _cell(row: dict) -> str:
    if row["order"] == "not revealed":
        reason = row["replay"].split(":")[0]  # what follows a colon is its detail
        return f"not revealed ({_cut(reason, 44)})" if reason else "not revealed"
    return f"{short_order(row['order'])}: {replay_verdict(row['replay'], row['fused_product'])}"


ORDERS_LEGEND = ("A cell: the order the runtime revealed, then what numpy's replay in "
                 "that order gave: `same` (the record's bits, with or without FMA), `n/m "
                 "values` (only n of m reproduced), `not run` (why); each cell whole in "
                 "results/tables/accumulation_orders.csv.")


def _layer_grid(rows: pd.DataFrame) -> pd.DataFrame:
    """device x layer: each cell its order and the replay's verdict."""
    terms = pd.to_numeric(rows["terms"], errors="coerce") if "terms" in rows \
        else pd.Series(float("nan"), index=rows.index)
    headers = {}
    for layer, part in rows.assign(terms=terms).groupby("layer", sort=False):
        counted = part["terms"].dropna()
        headers[layer] = f"{layer} ({int(counted.iloc[0])} terms)" if len(counted) else layer
    grid = rows.assign(cell=[_cell(row) for row in rows.to_dict("records")]).pivot_table(
        index="device", columns="layer", values="cell", aggfunc="first", sort=False)
    grid = grid.reindex(index=list(dict.fromkeys(rows["device"])),
                        columns=list(headers)).fillna("")
    grid.columns = [headers[layer] for layer in grid.columns]
    return grid.rename_axis("device").reset_index()


def _device_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """A row per device: its layers, its commonest orders, and what the replay gave."""
    out = []
    for device, part in rows.groupby("device", sort=False):
        revealed = part[part["order"] != "not revealed"]
        counts = revealed["order"].map(short_order).value_counts()
        named = [f"{order} ({count})" for order, count in counts.iloc[:_ORDERS_SHOWN].items()]
        if len(counts) > _ORDERS_SHOWN:
            named.append(f"… {len(counts) - _ORDERS_SHOWN} more")
        hidden = part.loc[part["order"] == "not revealed", "replay"].str.split(":").str[0]
        if len(hidden):  # why, the commonest reason
            named.append(f"not revealed ({len(hidden)}: {_cut(hidden.mode().iloc[0], 80)})")
        run = revealed[~revealed["replay"].str.startswith("not replayed")]
        same = run["replay"].str.startswith("bit-identical")
        missed = list(run.loc[~same, "layer"].astype(str))
        out.append({"device": device, "layers": len(part), "orders (layers)": "; ".join(named),
                    "replay gives the record's bits": f"{int(same.sum())} of {len(run)}"
                    if len(run) else "not run",
                    "not reproduced at": first_within(missed, 60)})
    return pd.DataFrame(out)


# The end of an order's name where the search looked at a sample of a Conv2D's positions
# (bitdrift.analysis.accumulation.names.SAMPLED_NAME)
_SAMPLED_ORDER = r" \(order searched at \d+ of \d+ positions\)$"


def orders(table: pd.DataFrame) -> list:
    """How each Dense and Conv2D layer sums, per model: how many revealed and replayed
    (device, layer) pairs numpy's replay reproduces bit for bit, then a table: up to
    ORDER_COLUMNS layers, device x layer with the order and the replay's verdict in each
    cell; more layers, a row per device (its orders, the replay's count, the layers it
    does not reproduce). The items are sentences and DataFrames (document renders both)."""
    lines: list = []
    table = table.assign(order=table["order"].astype(str), device=table["device"].astype(str),
                         layer=table["layer"].astype(str),
                         replay=table["replay"].fillna("").astype(str),
                         # tables made before the replay tried both products have none
                         fused_product=(table["fused_product"].fillna("").astype(str)
                                        if "fused_product" in table else ""))
    for model, rows in table.groupby("model", sort=False):
        hidden = rows["order"] == "not revealed"
        replayed = rows[~hidden & ~rows["replay"].str.startswith("not replayed")]
        same = replayed["replay"].str.startswith("bit-identical")
        layers = rows["layer"].nunique()
        lines.append(f"{model}: numpy, summing each Dense and Conv2D layer in the order its "
                     f"device's runtime revealed, gives the record's bits for "
                     f"{int(same.sum())} of the {len(replayed)} (device, layer) pairs it "
                     f"replayed ({int(hidden.sum())} with no revealed order, "
                     f"{len(rows) - int(hidden.sum()) - len(replayed)} not replayed)"
                     + ("." if layers <= ORDER_COLUMNS else
                        f"; over its {layers} layers, a row per device."))
        lines.append(_layer_grid(rows) if layers <= ORDER_COLUMNS else _device_summary(rows))
    if lines:  # after the first model's count, before its table
        lines.insert(1, ORDERS_LEGEND)
    return lines
