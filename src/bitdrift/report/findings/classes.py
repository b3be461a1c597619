"""The equivalence classes per model and precision, what explains them (explain.csv), the
devices computing below their declared format, and how often each runtime's predicted
label is TensorFlow's."""

from __future__ import annotations

import pandas as pd

from bitdrift.report.findings.text import (
    LISTED,
    SHOWN,
    and_list,
    cut,
    first_listed,
    first_within,
    largest_kept,
    sample_names,
    samples_phrase,
)


def _class_counts(per_sample: pd.Series, devices: str) -> str:
    """How many classes the devices form on each sample (``per_sample``: sample -> count;
    ``devices``: what they count, ``21 float32 devices``), as a sentence's middle: each
    count in full up to LISTED samples; more: the range, each count with its number of
    samples, the samples of the rarer counts."""
    if len(per_sample) <= LISTED:
        counts = "/".join(str(per_sample[sample]) for sample in sorted(per_sample.index))
        return (f"{counts} classes among {devices} on test samples "
                f"{sample_names(per_sample.index)} (final output)")
    where = "each sample's classes, device by device, in results/tables/eqc.csv"
    if per_sample.nunique() == 1:
        return (f"{per_sample.iloc[0]} classes among {devices} on each of the "
                f"{len(per_sample)} test samples (final output; {where})")
    from bitdrift.analysis.eqc import class_count_frequency

    (common, times), *rarer = class_count_frequency(per_sample).items()
    parts = [f"{common} on {times} of them"] + [
        f"{count} on {samples} ({sample_names(per_sample.index[per_sample == count])})"
        for count, samples in rarer[:SHOWN]]
    if len(rarer) > SHOWN:
        left = rarer[SHOWN:]
        parts.append(f"… and {len(left)} more counts on {sum(n for _, n in left)} samples")
    return (f"{per_sample.min()} to {per_sample.max()} classes among {devices} over "
            f"the {len(per_sample)} test samples (final output): {', '.join(parts)}; {where}")


# Devices per row of the table of identical devices: a longer group goes on over rows
DEVICES_PER_ROW = 6


def _group_rows(precision: str, groups: list[list[str]]) -> list[dict]:
    """Rows of the table of devices that agree bit for bit on every sample: a group per
    row (its devices DEVICES_PER_ROW at a time), then those in a class of their own."""
    rows = []
    together = [members for members in groups if len(members) > 1]
    alone = [members[0] for members in groups if len(members) == 1]
    named = [(f"{len(members)} devices, identical", members) for members in together]
    if alone:
        named.append(("each in a class of its own", alone))
    for what, members in named:
        for start in range(0, len(members), DEVICES_PER_ROW):
            rows.append({"precision": precision if not start else "",
                         "on every sample": what if not start else "",
                         "devices": ", ".join(members[start:start + DEVICES_PER_ROW])})
    return rows


def classes(eqc: pd.DataFrame, precisions: dict) -> list:
    """Classes per model and precision, and a table of the devices that agree bit for bit
    on every sample."""
    lines: list = []
    for model, rows in eqc.groupby("model", sort=False):
        rows = rows.assign(precision=rows["device"].map(precisions).fillna("unknown"))
        table = []
        for precision, part in rows.groupby("precision", sort=False):
            devices = list(dict.fromkeys(part["device"]))
            per_sample = part.groupby("sample")["eqc"].nunique().sort_index()
            # the classes of one precision: the counts of the EQC figure's grid, which
            # holds every precision, are the answer's second count
            counted = f"{len(devices)} {precision} device{'s' if len(devices) > 1 else ''}"
            lines.append(f"{model}, {precision}: {_class_counts(per_sample, counted)}.")
            # the same class on every sample: bit for bit identical outputs throughout
            signature = part.pivot_table(index="device", columns="sample", values="eqc",
                                         aggfunc="first")
            groups: dict[tuple, list[str]] = {}
            for device in devices:
                groups.setdefault(tuple(signature.loc[device]), []).append(device)
            if len(devices) > 1 and all(len(members) == 1 for members in groups.values()):
                lines.append(f"{model}, {precision}: no two devices agree bit for bit on "
                             "every sample.")
            elif len(devices) > 1:
                table += _group_rows(precision, list(groups.values()))
            nondeterministic = part.loc[~part["deterministic"].astype(bool), "device"].unique()
            if len(nondeterministic):
                lines.append(f"{model}, {precision}: not deterministic across repeats: "
                             f"{first_listed(nondeterministic)}.")
        if table:
            lines.append(f"{model}: the devices bit for bit identical on every sample, by "
                         "precision:")
            lines.append(pd.DataFrame(table))
    return lines


# How a group of attributes reads when there are many (bitdrift.analysis.explain names them
# ``kernel.<layer>``, ``order.<layer>``, ``versions.<module>``, ``env.<name>``)
_PER_LAYER = ("kernel", "order")
# A findings line's most characters (an attribute that splits the devices as the explaining
# one does names as many others as fit, and counts the rest)
LINE_MOST = 300


def _attributes(names) -> list[str]:
    """Attribute names as a sentence's items, quoted: each one up to LISTED names; more:
    those of one prefix together, counted, with a few examples (``kernel.*`` at 176 layers
    (``kernel.avg_pool``, … and 173 more)); names without a prefix one by one."""
    names = [str(name) for name in names]
    if len(names) <= LISTED:
        return [f"`{name}`" for name in names]
    groups: dict[str, list[str]] = {}
    for name in names:
        groups.setdefault(name.split(".", 1)[0] if "." in name else "", []).append(name)
    items = []
    for prefix, members in groups.items():
        # one example of a long group: a line of findings.md stays short (issue 64)
        examples = first_listed((f"`{name}`" for name in members), listed=2, shown=1)
        if not prefix or len(members) == 1:
            items += [f"`{name}`" for name in members]
        elif prefix in _PER_LAYER:
            items.append(f"`{prefix}.*` at {len(members)} layers ({examples})")
        else:
            items.append(f"{len(members)} `{prefix}.*` attributes ({examples})")
    return items


def explanations(explain: pd.DataFrame) -> list[str]:
    """What explain names as determining the final output's classes: one sentence per set
    of attributes, with the samples it explains; over LISTED sets, those explaining the
    most samples, and how many more (explain.csv holds every sample's)."""
    lines = []
    final = explain[explain["layer"].astype(str) == "output"] if "layer" in explain else explain
    found = list(final.groupby(["model", "attributes"], sort=False))
    shown = largest_kept([rows["sample"].nunique() for _, rows in found])
    for (model, attributes), rows in (found[index] for index in shown):
        determined = rows["determined"].astype(bool).all()
        named = ", ".join(_attributes(name for name in str(attributes).split(";") if name)) \
            or "nothing (one class)"
        first = rows.iloc[0]
        caveats = [f"{first['search']} search"]
        if str(first.get("weak", "")).lower() == "true":
            caveats.append("weak: a value of one of them only one device holds")
        # "name=other+other;...": attributes that split the devices as the chosen one
        # does, each said in a sentence after the set's
        confounded = []
        for group in str(first.get("confounded") or "").split(";"):
            if "=" in group:
                name, others = group.split("=", 1)
                others = _attributes(others.split("+"))
                start = f"{model}: `{name}` splits the devices as "
                end = " does." if len(others) == 1 else " do."
                # as many named as the line holds, the rest counted (a CPU's flags can be
                # dozens of long names)
                named_others = others
                for count in range(len(others), 0, -1):
                    named_others = others[:count] + (
                        [f"{len(others) - count} more (explain.csv)"]
                        if count < len(others) else [])
                    if len(start + and_list(named_others) + end) <= LINE_MOST:
                        break
                confounded.append(cut(start + and_list(named_others) + end, LINE_MOST))
        alternatives = [item for item in str(first.get("alternatives") or "").split("|")
                        if item and item != "nan"]
        if alternatives:
            caveats.append(f"{len(alternatives)} other "
                           + ("set does" if len(alternatives) == 1 else "sets do")
                           + " as well: explain.csv")
        lines.append(f"{model}, {samples_phrase(rows)}: the classes are "
                     f"{'determined' if determined else 'not fully determined'} by {named} "
                     f"({'; '.join(caveats)}).")
        lines += confounded
    if len(shown) < len(found):
        left = [rows for index, (_, rows) in enumerate(found) if index not in shown]
        samples = pd.concat(left)[["model", "sample"]].drop_duplicates()
        lines.append(f"… and {len(left)} more sets of attributes, on {len(samples)} "
                     "(model, sample) pairs; every sample's in results/tables/explain.csv.")
    return lines


def reduced_precision(effective: pd.DataFrame) -> list[str]:
    """Devices that compute below their declared format, with the format their errors
    are consistent with (the recomputed effective-precision check). Records whose layers
    keep digests only (analysis.full_samples: 0) are named on a line of their own."""
    from bitdrift.analysis.effective_precision import NO_FULL_SAMPLES

    digests_only = effective[effective["unchecked"] == NO_FULL_SAMPLES] \
        if "unchecked" in effective else effective.iloc[:0]
    note = [f"Unchecked on {', '.join(digests_only['device'].astype(str).unique())}: "
            f"{NO_FULL_SAMPLES}."] if len(digests_only) else []
    effective = effective.drop(digests_only.index)
    if effective.empty or "reduced" not in effective:
        return ["No effective-precision check in the records.", *note]
    reduced = effective[effective["reduced"].astype(str).str.lower() == "true"]
    if reduced.empty:
        checked = effective["device"].nunique()
        return [f"None: every checked Dense/Conv layer of the {checked} devices is within its "
                "declared format's error bound.", *note]
    lines = []
    for (model, device), rows in reduced.groupby(["model", "device"], sort=False):
        formats = sorted(set(rows["format"].astype(str)), key=list(rows["format"]).index)
        lines.append(f"{device} ({model}) declares {rows['precision'].iloc[0]} but computes "
                     f"{' and '.join(f + '-like' for f in formats)}: "
                     f"{rows['effective_bits'].min():.1f} effective bits at worst, in "
                     f"{len(rows)} of {len(effective[effective['device'] == device])} "
                     f"checked layers ({first_within(rows['layer'].astype(str))}).")
    return lines + note


def agreement(table: pd.DataFrame, between: dict[str, str] | None = None) -> list[str]:
    """Per model, on how many test images each runtime's predicted label (the argmax of
    its output) equals TensorFlow's float32 one; the fewest named with every device tied
    at it. A model that has no TensorFlow reference (a model file of another format than
    Keras) is said by ``between`` ({model: its labels compared between its devices on the
    recorded samples}, bitdrift.report.findings.answer)."""
    between = between or {}
    shares = pd.to_numeric(table["share"], errors="coerce") if "share" in table \
        else pd.Series(dtype=float)
    checked = table[shares.notna()].assign(share=shares[shares.notna()])
    models = list(dict.fromkeys([*table.get("model", []), *between]))
    lines = [between.get(model) or f"{model}: no label compared (the argmax check compares a "
             "Keras model's labels with TensorFlow's, and no record of it was read)."
             for model in models if model not in set(checked["model"])]
    for model, rows in checked.groupby("model", sort=False):
        images = pd.to_numeric(rows["images"], errors="coerce").astype(int)
        agreeing = pd.to_numeric(rows["agreeing"], errors="coerce") if "agreeing" in rows \
            else rows["share"] * images
        rows = rows.assign(images=images, agreeing=agreeing.round().astype(int))
        devices, most = rows["device"].nunique(), int(rows["images"].max())
        every = rows["agreeing"] == rows["images"]
        if every.all():
            lines.append(f"{model}: all {devices} checked devices predict TensorFlow's "
                         f"(float32) label on each of the {most} test images.")
            continue
        low = rows.loc[(rows["agreeing"] / rows["images"]).idxmin()]
        share = low["agreeing"] / low["images"]
        lowest = list(dict.fromkeys(rows.loc[rows["agreeing"] / rows["images"] == share,
                                             "device"]))
        lines.append(f"{model}: of {devices} checked devices, {int(every.sum())} predict "
                     f"TensorFlow's (float32) label on each of the {most} test images; the "
                     f"fewest agreeing labels are {low['agreeing']} of {low['images']} "
                     f"({share:.1%}), by {and_list(lowest)}"
                     + (f" ({len(lowest)} tied)." if len(lowest) > 1 else "."))
    return lines
