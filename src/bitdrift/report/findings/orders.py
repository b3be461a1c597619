"""How the layers sum: each Dense and Conv2D layer's revealed accumulation order in words,
and what numpy's replay in that order gave (accumulation_orders.csv)."""

from __future__ import annotations

import re

import pandas as pd

from bitdrift.record.orders import EITHER_FUSED
from bitdrift.report.findings.text import and_list, first_listed, largest_kept

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


def _replay_clause(part: pd.DataFrame) -> str:
    """What numpy's replay gave for the devices of one order at one layer."""
    outcomes: dict[tuple, list[str]] = {}
    for row in part.to_dict("records"):
        outcomes.setdefault(_replay_outcome(row["replay"], row.get("fused_product", "")),
                            []).append(str(row["device"]))
    single = len(outcomes) == 1
    by_kind: dict[str, list] = {}
    for (kind, words), devices in outcomes.items():
        by_kind.setdefault(kind, []).append((words, devices))
    clauses = []
    if "same" in by_kind:
        clauses.append("gives " + " and ".join(
            (f"{'their' if len(devices) > 1 else 'its'} bits {words}" if single
             else f"the bits of {and_list(devices)} {words}")
            for words, devices in by_kind["same"]))
    for words, devices in by_kind.get("differs", []):
        clauses.append(f"reproduces only {words}"
                       + ("" if single else f" for {and_list(devices)}"))
    if "differs" in by_kind:  # what a mismatch says, and what it does not
        clauses[-1] += (" (the kernel rounds some node otherwise than any arithmetic the "
                        "replay tried, or sums in another tree than the one revealed)")
    if "format" in by_kind:  # float16, bfloat16, float64: the replay is float32's
        formats = and_list(words for words, _ in by_kind["format"]).replace(" and ", " or ")
        named = [device for _, devices in by_kind["format"] for device in devices]
        if single:
            they = "they compute" if len(named) > 1 else "it computes"
            clauses.append(f"was not run ({they} in {formats}; the replay is float32 only)")
        else:
            who = and_list(named) if len(named) <= 3 else f"the {len(named)}"
            clauses.append(f"was not run for {who} computing in {formats} (the replay is "
                           "float32 only)")
    for words, devices in by_kind.get("skipped", []):
        clauses.append(f"was not run ({words})" if single
                       else f"was not run for {and_list(devices)} ({words})")
    for words, devices in by_kind.get("other", []):
        clauses.append(f"gave `{words}`" + ("" if single else f" for {and_list(devices)}"))
    return "; ".join(clauses)


# The end of an order's name where the search looked at a sample of a Conv2D's positions
# (bitdrift.analysis.accumulation.names.SAMPLED_NAME); a replay cell's verdict is what precedes its
# first "; " (the rest says what it sampled or left out). Layers that differ in these
# alone sum alike and are said together.
_SAMPLED_ORDER = r" \(order searched at \d+ of \d+ positions\)$"
# Sentences per model; more are counted, and every device is still named once. The
# default run (30 devices, 5 layers) writes 21.
ORDER_SENTENCES = 30


def orders(table: pd.DataFrame) -> list[str]:
    """How each Dense and Conv2D layer sums: first, per model, how many revealed and
    replayed (device, layer) pairs numpy's replay reproduces bit for bit; then one
    sentence per order naming the devices that sum in it and what the replay in that order
    gave, said once for all the layers where the same devices sum alike. Over
    ORDER_SENTENCES sentences: those of the most layers, one for each device not named in
    them, and a count of the rest (accumulation_orders.csv holds every layer)."""
    lines = []
    table = table.assign(order=table["order"].astype(str), device=table["device"].astype(str),
                         replay=table["replay"].fillna("").astype(str),
                         # tables made before the replay tried both products have none
                         fused_product=(table["fused_product"].fillna("").astype(str)
                                        if "fused_product" in table else ""))
    for model, rows in table.groupby("model", sort=False):
        hidden = rows["order"] == "not revealed"
        replayed = rows[~hidden & ~rows["replay"].str.startswith("not replayed")]
        same = replayed["replay"].str.startswith("bit-identical")
        lines.append(f"{model}: numpy, summing each Dense and Conv2D layer in the order its "
                     f"device's runtime revealed, gives the record's bits for "
                     f"{int(same.sum())} of the {len(replayed)} (device, layer) pairs it "
                     f"replayed ({int(hidden.sum())} with no revealed order, "
                     f"{len(rows) - int(hidden.sum()) - len(replayed)} not replayed).")
        # (kind, order or reason, devices, replay clause) -> the layers said in it
        groups: dict[tuple, list[dict]] = {}
        for layer, part in rows.groupby("layer", sort=False):
            terms = pd.to_numeric(part["terms"], errors="coerce").dropna() \
                if "terms" in part else pd.Series(dtype=float)
            terms = int(terms.iloc[0]) if len(terms) else None
            where = f"{model}, layer `{layer}`" + (
                f" (sums of {terms} terms)" if terms is not None else "")
            for order, group in part[part["order"] != "not revealed"].groupby(
                    "order", sort=False):
                devices = tuple(dict.fromkeys(group["device"]))
                verdicts = group.assign(replay=group["replay"].str.split("; ").str[0])
                shape = re.sub(_SAMPLED_ORDER, "", order)
                run = ~group["replay"].str.startswith("not replayed")
                key = ("sums", shape, devices, _replay_clause(verdicts))
                groups.setdefault(key, []).append({
                    "layer": layer, "terms": terms,
                    "sentence": f"{where}: {and_list(devices)} "
                                f"{'sum' if len(devices) > 1 else 'sums'} "
                                f"{order_phrase(order)}; numpy's replay in that order "
                                f"{_replay_clause(group)}.",
                    "part": shape != order or bool((verdicts["replay"]
                                                    != group["replay"]).any()),
                    "missed": int((run & ~group["replay"].str.startswith("bit-identical")).sum())})
            for reason, group in part[part["order"] == "not revealed"].groupby(
                    "replay", sort=False):
                devices = tuple(dict.fromkeys(group["device"]))
                groups.setdefault(("hidden", reason, devices, ""), []).append({
                    "layer": layer, "terms": terms, "part": False, "missed": 0,
                    "sentence": f"{where}: the order of {and_list(devices)} was not revealed"
                                + (f" ({reason})." if reason else ".")})
        keys = list(groups)
        # a replay that did not reproduce the record first, then the most layers
        kept = set(largest_kept([(any(layer["missed"] for layer in groups[key]),
                              len(groups[key])) for key in keys],
                            ORDER_SENTENCES, ORDER_SENTENCES))
        named = {device for index in kept for device in keys[index][2]}
        for device in dict.fromkeys(rows["device"]):  # each device said once at least
            if device not in named:
                index = max((index for index, key in enumerate(keys) if device in key[2]),
                            key=lambda index: len(groups[keys[index]]))
                kept.add(index)
                named.update(keys[index][2])
        lines += [_orders_sentence(model, keys[index], groups[keys[index]])
                  for index in sorted(kept)]
        left = [index for index in range(len(keys)) if index not in kept]
        if left:
            pairs = sum(len(keys[index][2]) * len(groups[keys[index]]) for index in left)
            missed = sum(layer["missed"] for index in left for layer in groups[keys[index]])
            lines.append(f"{model}: … and {len(left)} more (order, devices) "
                         f"{'sentence' if len(left) == 1 else 'sentences'}, at {pairs} "
                         f"(device, layer) {'pair' if pairs == 1 else 'pairs'}"
                         + (f", {missed} of them not reproduced by the replay" if missed
                            else "")
                         + "; every layer in results/tables/accumulation_orders.csv.")
    return lines


def _orders_sentence(model: str, key: tuple, layers: list[dict]) -> str:
    """orders' sentence for one (order, devices, replay) at ``layers``: a layer's own
    sentence, or the layers counted with a few named and their sums' range of terms."""
    if len(layers) == 1:
        return layers[0]["sentence"]
    kind, said, devices, clause = key
    terms = sorted({layer["terms"] for layer in layers if layer["terms"] is not None})
    span = "" if not terms else f"; sums of {terms[0]} terms" if len(terms) == 1 else \
        f"; sums of {terms[0]} to {terms[-1]} terms"
    names = first_listed(f"`{layer['layer']}`" for layer in layers)
    where = f"{model}, {len(layers)} layers ({names}{span})"
    if kind == "hidden":
        return (f"{where}: the order of {and_list(devices)} was not revealed"
                + (f" ({said})." if said else "."))
    part = sum(layer["part"] for layer in layers)
    note = "" if not part else (
        f" (at {'each of these layers' if part == len(layers) else f'{part} of them'} the "
        "search or the replay covered part of the output; how much: "
        "results/tables/accumulation_orders.csv)")
    return (f"{where}: {and_list(devices)} {'sum' if len(devices) > 1 else 'sums'} "
            f"{order_phrase(said)}; numpy's replay in that order {clause}{note}.")
