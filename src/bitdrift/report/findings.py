"""Findings, generated per machine: sentences written from the run's own tables about the
CPU it ran on (``results/findings.md``, and the report's first section). Nothing here is a
fact about CPUs in general: another machine's run writes its own findings.

Only pandas and h5py: the tables are read as written, and one record's fingerprint names
the machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from bitdrift import paths

# CPU flags (py-cpuinfo's names) that decide which kernels oneDNN, OpenBLAS, MLAS, XNNPACK
# and OpenVINO pick, in the order of their generations.
INSTRUCTION_SETS = [("SSE4.1", ("sse4_1",)), ("AVX", ("avx",)), ("AVX2", ("avx2",)),
                    ("FMA", ("fma",)), ("AVX-512", ("avx512f",)),
                    ("AVX512_VNNI", ("avx512_vnni", "avx512vnni")),
                    ("AVX512_BF16", ("avx512_bf16",)), ("AVX512_FP16", ("avx512_fp16",)),
                    ("AMX", ("amx_bf16", "amx_tile"))]
# The same for Arm (the Features of /proc/cpuinfo): NEON, half-precision arithmetic, dot
# product, SVE, SVE2, BF16
ARM_INSTRUCTION_SETS = [("NEON", ("asimd",)), ("FP16", ("asimdhp",)), ("DOTPROD", ("asimddp",)),
                        ("SVE", ("sve",)), ("SVE2", ("sve2",)), ("BF16", ("bf16",)),
                        ("I8MM", ("i8mm",))]


def instruction_sets(cpu: dict) -> list[tuple[str, tuple]]:
    """The sets that matter on ``cpu``'s architecture."""
    return ARM_INSTRUCTION_SETS if str(cpu.get("arch", "")).upper() in ("AARCH64", "ARM_8") \
        else INSTRUCTION_SETS
# The tables the findings may read: the core's (bitdrift.paths, the one list) and the
# comparison with the atlas; each is read when a section needs it.
TABLES = (*paths.CORE_TABLES, *paths.ATLAS_TABLES)


class StudySection(NamedTuple):
    """A study's own section of the findings, which the study registers (its package's
    ``findings.SECTION``, gathered by bitdrift.studies.findings_sections): the core knows
    no study, and whoever writes the findings passes the sections in."""

    title: str
    # the tables it reads (results/tables/NAME.csv); the section is written where each
    # is there and not empty (the study has run)
    tables: tuple[str, ...]
    # its sentences from those tables (DataFrames, in the order of ``tables``)
    sentences: Callable[..., list[str]]
    # its place among the studies' sections, which follow the core's
    place: int


def machine(fingerprint: dict) -> list[str]:
    """Sentences naming the CPU and the instruction sets that matter, from a record's
    fingerprint (what the device's process saw)."""
    cpu = fingerprint.get("cpu") or {}
    flags = set(cpu.get("flags") or [])
    have = [name for name, names in instruction_sets(cpu) if flags & set(names)]
    lack = [name for name, names in instruction_sets(cpu) if not flags & set(names)]
    lines = [f"CPU: {cpu.get('brand') or 'unknown'} ({cpu.get('vendor') or '?'}, family "
             f"{cpu.get('family')}, model {cpu.get('model')}; {cpu.get('count')} CPUs, "
             f"{cpu.get('arch')}) on {fingerprint.get('platform', '?')}.",
             f"Instruction sets that steer the kernels: {', '.join(have) or 'none'}"
             + (f"; not present: {', '.join(lack)}." if lack else ".")]
    return lines


def emulated(fingerprints: dict) -> list[str]:
    """The devices that ran under QEMU, grouped by the CPU they saw, with its instruction
    sets."""
    groups: dict[tuple, list[str]] = {}
    for device, found in fingerprints.items():
        emulation = found.get("emulation")
        if not emulation:
            continue
        cpu = found.get("cpu") or {}
        flags = set(cpu.get("flags") or [])
        have = [name for name, names in instruction_sets(cpu) if flags & set(names)]
        key = (emulation.get("model"), (found.get("cpu") or {}).get("brand"),
               ", ".join(have) or "none of the sets above",
               str(emulation.get("qemu", "")).split(" ")[0])
        groups.setdefault(key, []).append(device)
    return [f"Emulated by QEMU {qemu} as {model} ({brand}; it saw {sets}): "
            f"{', '.join(devices)}." for (model, brand, sets, qemu), devices in groups.items()]


# A list in a sentence is written in full up to LISTED items; a longer one shows its
# first SHOWN and says how many more (the tables hold them all): a run of 100 samples,
# 177 layers and 30 devices otherwise writes lines of thousands of names.
LISTED = 10
SHOWN = 5


def _first(items, listed: int = LISTED, shown: int = SHOWN) -> str:
    """``a, b, c`` up to ``listed`` items, else the first ``shown`` and ``… and N more``."""
    items = [str(item) for item in items]
    if len(items) <= listed:
        return ", ".join(items)
    return ", ".join(items[:shown]) + f" … and {len(items) - shown} more"


def _largest(sizes: list, listed: int = LISTED, shown: int = SHOWN) -> list[int]:
    """The indices of the items a list keeps, in their order: all up to ``listed``; more:
    the ``shown`` largest (``sizes``), the first of equal ones."""
    if len(sizes) <= listed:
        return list(range(len(sizes)))
    return sorted(sorted(range(len(sizes)), key=lambda index: sizes[index],
                         reverse=True)[:shown])


def _sample_names(samples) -> str:
    return _first(f"#{sample}" for sample in sorted(samples))


def _samples(rows: pd.DataFrame) -> str:
    """``samples #0, #1, #6``; many: ``100 samples (#0, #1, … and 95 more)``."""
    samples = rows["sample"].unique()
    return f"samples {_sample_names(samples)}" if len(samples) <= LISTED else \
        f"{len(samples)} samples ({_sample_names(samples)})"


def _class_counts(per_sample: pd.Series, devices: int) -> str:
    """How many classes the devices form on each sample (``per_sample``: sample -> count),
    as a sentence's middle: each count in full up to LISTED samples; more: the range, each
    count with its number of samples, the samples of the rarer counts."""
    if len(per_sample) <= LISTED:
        counts = "/".join(str(per_sample[sample]) for sample in sorted(per_sample.index))
        return (f"{counts} classes among {devices} devices on test samples "
                f"{_sample_names(per_sample.index)} (final output)")
    where = "each sample's classes, device by device, in results/tables/eqc.csv"
    if per_sample.nunique() == 1:
        return (f"{per_sample.iloc[0]} classes among {devices} devices on each of the "
                f"{len(per_sample)} test samples (final output; {where})")
    from bitdrift.analysis.eqc import class_count_frequency

    (common, times), *rarer = class_count_frequency(per_sample).items()
    parts = [f"{common} on {times} of them"] + [
        f"{count} on {samples} ({_sample_names(per_sample.index[per_sample == count])})"
        for count, samples in rarer[:SHOWN]]
    if len(rarer) > SHOWN:
        left = rarer[SHOWN:]
        parts.append(f"… and {len(left)} more counts on {sum(n for _, n in left)} samples")
    return (f"{per_sample.min()} to {per_sample.max()} classes among {devices} devices over "
            f"the {len(per_sample)} test samples (final output): {', '.join(parts)}; {where}")


def classes(eqc: pd.DataFrame, precisions: dict) -> list[str]:
    """Classes per model and precision, and the devices that agree bit for bit on every
    sample."""
    lines = []
    for model, rows in eqc.groupby("model", sort=False):
        rows = rows.assign(precision=rows["device"].map(precisions).fillna("unknown"))
        for precision, part in rows.groupby("precision", sort=False):
            devices = list(dict.fromkeys(part["device"]))
            per_sample = part.groupby("sample")["eqc"].nunique().sort_index()
            lines.append(f"{model}, {precision}: {_class_counts(per_sample, len(devices))}.")
            # the same class on every sample: bit for bit identical outputs throughout
            signature = part.pivot_table(index="device", columns="sample", values="eqc",
                                         aggfunc="first")
            groups = {}
            for device in devices:
                groups.setdefault(tuple(signature.loc[device]), []).append(device)
            together = [members for members in groups.values() if len(members) > 1]
            alone = [members[0] for members in groups.values() if len(members) == 1]
            if together:
                lines.append(f"{model}, {precision}: bit for bit identical on every sample: "
                             + "; ".join("{" + ", ".join(g) + "}" for g in together)
                             + (f". In a class of their own: {', '.join(alone)}."
                                if alone else "."))
            elif len(devices) > 1:
                lines.append(f"{model}, {precision}: no two devices agree bit for bit on every "
                             "sample.")
            nondeterministic = part.loc[~part["deterministic"].astype(bool), "device"].unique()
            if len(nondeterministic):
                lines.append(f"{model}, {precision}: not deterministic across repeats: "
                             f"{', '.join(nondeterministic)}.")
    return lines


# How a group of attributes reads when there are many (bitdrift.analysis.explain names them
# ``kernel.<layer>``, ``order.<layer>``, ``versions.<module>``, ``env.<name>``)
_PER_LAYER = ("kernel", "order")


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
        examples = _first((f"`{name}`" for name in members), listed=4, shown=3)
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
    shown = _largest([rows["sample"].nunique() for _, rows in found])
    for (model, attributes), rows in (found[index] for index in shown):
        determined = rows["determined"].astype(bool).all()
        named = ", ".join(_attributes(name for name in str(attributes).split(";") if name)) \
            or "nothing (one class)"
        first = rows.iloc[0]
        caveats = [f"{first['search']} search"]
        if str(first.get("weak", "")).lower() == "true":
            caveats.append("weak: one of these attributes has a value only one device holds")
        # "name=other+other;...": attributes that split the devices as the chosen one does
        for group in str(first.get("confounded") or "").split(";"):
            if "=" in group:
                name, others = group.split("=", 1)
                others = others.split("+")
                caveats.append(f"`{name}` splits the devices as "
                               + _names(_attributes(others))
                               + (" does" if len(others) == 1 else " do"))
        alternatives = [item for item in str(first.get("alternatives") or "").split("|")
                        if item and item != "nan"]
        if alternatives:
            caveats.append(f"explain.csv lists {len(alternatives)} other sets of as many "
                           "attributes that do as well")
        lines.append(f"{model}, {_samples(rows)}: the classes are "
                     f"{'determined' if determined else 'not fully determined'} by {named} "
                     f"({'; '.join(caveats)}).")
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
                     f"checked layers ({_first(rows['layer'].astype(str))}).")
    return lines + note


def divergence(table: pd.DataFrame, coverage: pd.DataFrame) -> list[str]:
    """Where pairs of classes part first, and which kernels differ there."""
    from bitdrift.analysis.divergence import class_pairs

    lines = []
    parted = class_pairs(table)  # each class pair once (not once per device of a class)
    for model, rows in parted.groupby("model", sort=False):
        counts = rows["first_layer"].value_counts()
        at = [f"{count} at `{layer}`" for layer, count in counts.items()]
        if len(at) > LISTED:  # the commonest layers; the rest counted
            rest = counts.iloc[SHOWN:]
            at = at[:SHOWN] + [f"… and {rest.sum()} at {len(rest)} more layers "
                               "(results/tables/divergence.csv)"]
        lines.append(f"{model}: of {len(rows)} (class pair, sample) first divergences, "
                     + ", ".join(at) + ".")
        if "kernels_differ" in rows:
            differ = rows[rows["kernels_differ"].astype(str) == "yes"]
            pairs = differ.apply(lambda row: " vs ".join(sorted(
                [str(row["kernels_a"]), str(row["kernels_b"])])), axis=1).value_counts()
            if len(pairs):  # the three commonest, and any tied with the third
                third = pairs.iloc[min(2, len(pairs) - 1)]
                tied = pairs[pairs >= third]
                said = [f"`{pair}` ({count})" for pair, count in tied.iloc[:LISTED].items()]
                if len(tied) > LISTED:  # those left out all count as many as the third
                    said = said[:SHOWN] + [f"… and {len(tied) - SHOWN} more pairs at "
                                           f"{third} each"]
                lines.append(f"{model}: kernels at the first divergent layer, most often: "
                             + "; ".join(said) + ".")
    for row in coverage.to_dict("records"):
        untraced = pd.to_numeric(pd.Series([row["untraced"]]), errors="coerce").fillna(0)[0]
        deployed_only = int(pd.to_numeric(pd.Series([row.get("deployed_only", 0)]),
                                          errors="coerce").fillna(0)[0])
        lines.append(f"{row['model']}: of {row['first_divergences']} first divergences the "
                     f"recorded kernels differ at {row['kernels_differ']}, the same kernels "
                     f"with other settings (threads, batch) at "
                     f"{row['same_kernels_other_settings']}, {row['unexplained']} unexplained"
                     + (f", {row['untraced']} involve a runtime that names no kernels "
                        "(untraced)" if untraced else "")
                     + (f", {deployed_only} part only at the deployed model's final output, "
                        "every recorded layer agreeing (the observer check below)"
                        if deployed_only else "") + ".")
    return lines or ["No two classes: nothing parts."]


# How an order label of accumulation_orders.csv (bitdrift.analysis.accumulation.names.summary)
# reads in a
# sentence; a label not listed is quoted as it is.
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
    import re

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
    for pattern, words in _SHAPES:
        if re.match(pattern, shape):
            return re.sub(pattern, words, shape) + _BIAS.get(bias, "")
    return f"in the order `{order}`"


def _place_phrase(part: str) -> str:
    """One part of a ``varies by position`` label (bitdrift.analysis.accumulation.names.order_name)
    as
    words: ``other (height 8), bias last: 4 trees at 257/256/255/256 pixels`` -> ``4
    trees, each 8 additions deep, ... over 257/256/255/256 pixels``."""
    import re

    unknown = re.match(r"^order unknown at (\d+) (pixels|places)$", part)
    if unknown:
        return f"the order is unknown at {unknown[1]} {unknown[2]}"
    found = re.match(r"^(.*?)(?:: (\d+) trees)? at ([\d/]+) (pixels|places)$", part)
    if not found:
        return f"`{part}`"
    trees = f"{found[2]} trees summing " if found[2] else "one tree summing "
    return f"{trees}{order_phrase(found[1])}, over {found[3]} {found[4]}"


def _replay_outcome(replay: str) -> tuple[str, str]:
    """(kind, words) of a replay cell: ``same`` (the record's bits), ``differs``,
    ``format`` (not replayed: computed in another format than float32), ``skipped`` (not
    replayed for another reason) or ``other`` (a cell this reader does not know, quoted)."""
    import re

    replay = str(replay)
    if replay.startswith("bit-identical "):
        return "same", replay[len("bit-identical "):]
    found = re.match(r"differs: (\d+) of (\d+) values bit-identical at best \((.*)\)$", replay)
    if found:
        return "differs", f"{found[1]} of {found[2]} values at best ({found[3]})"
    if replay.startswith("not replayed: "):
        reason = replay[len("not replayed: "):]
        return ("format", reason) if re.fullmatch(r"b?float\d+", reason) else \
            ("skipped", reason)
    return "other", replay


def _names(devices) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    devices = list(devices)
    return devices[0] if len(devices) == 1 else ", ".join(devices[:-1]) + " and " + devices[-1]


def _replay_clause(part: pd.DataFrame) -> str:
    """What numpy's replay gave for the devices of one order at one layer."""
    outcomes: dict[tuple, list[str]] = {}
    for row in part.to_dict("records"):
        outcomes.setdefault(_replay_outcome(row["replay"]), []).append(str(row["device"]))
    single = len(outcomes) == 1
    by_kind: dict[str, list] = {}
    for (kind, words), devices in outcomes.items():
        by_kind.setdefault(kind, []).append((words, devices))
    clauses = []
    if "same" in by_kind:
        clauses.append("gives " + " and ".join(
            (f"{'their' if len(devices) > 1 else 'its'} bits {words}" if single
             else f"the bits of {_names(devices)} {words}")
            for words, devices in by_kind["same"]))
    for words, devices in by_kind.get("differs", []):
        clauses.append(f"matches only {words}" + ("" if single else f" for {_names(devices)}"))
    if "format" in by_kind:  # float16, bfloat16, float64: the replay is float32's
        formats = _names(words for words, _ in by_kind["format"]).replace(" and ", " or ")
        named = [device for _, devices in by_kind["format"] for device in devices]
        if single:
            they = "they compute" if len(named) > 1 else "it computes"
            clauses.append(f"was not run ({they} in {formats}; the replay is float32 only)")
        else:
            who = _names(named) if len(named) <= 3 else f"the {len(named)}"
            clauses.append(f"was not run for {who} computing in {formats} (the replay is "
                           "float32 only)")
    for words, devices in by_kind.get("skipped", []):
        clauses.append(f"was not run ({words})" if single
                       else f"was not run for {_names(devices)} ({words})")
    for words, devices in by_kind.get("other", []):
        clauses.append(f"gave `{words}`" + ("" if single else f" for {_names(devices)}"))
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
    import re

    lines = []
    table = table.assign(order=table["order"].astype(str), device=table["device"].astype(str),
                         replay=table["replay"].fillna("").astype(str))
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
                    "sentence": f"{where}: {_names(devices)} "
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
                    "sentence": f"{where}: the order of {_names(devices)} was not revealed"
                                + (f" ({reason})." if reason else ".")})
        keys = list(groups)
        # a replay that did not reproduce the record first, then the most layers
        kept = set(_largest([(any(layer["missed"] for layer in groups[key]),
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
    names = _first(f"`{layer['layer']}`" for layer in layers)
    where = f"{model}, {len(layers)} layers ({names}{span})"
    if kind == "hidden":
        return (f"{where}: the order of {_names(devices)} was not revealed"
                + (f" ({said})." if said else "."))
    part = sum(layer["part"] for layer in layers)
    note = "" if not part else (
        f" (at {'each of these layers' if part == len(layers) else f'{part} of them'} the "
        "search or the replay covered part of the output; how much: "
        "results/tables/accumulation_orders.csv)")
    return (f"{where}: {_names(devices)} {'sum' if len(devices) > 1 else 'sums'} "
            f"{order_phrase(said)}; numpy's replay in that order {clause}{note}.")


def agreement(table: pd.DataFrame) -> list[str]:
    """Per model, on how many test images each runtime's predicted label (the argmax of
    its output) equals TensorFlow's float32 one; the fewest named with every device tied
    at it."""
    shares = pd.to_numeric(table["share"], errors="coerce")
    checked = table[shares.notna()].assign(share=shares[shares.notna()])
    lines = [f"{model}: not checked on any device (the argmax check compares a Keras "
             "model's labels with TensorFlow's; TensorFlow's own devices are the reference, "
             "and a model file of another format has none)."
             for model in dict.fromkeys(table["model"]) if model not in set(checked["model"])]
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
                     f"({share:.1%}), by {_names(lowest)}"
                     + (f" ({len(lowest)} tied)." if len(lowest) > 1 else "."))
    return lines


def observer(table: pd.DataFrame) -> list[str]:
    """The observer check (bitdrift.analysis.observer): devices whose instrumentation changed the
    final output."""
    checked = table[table["observer_equal"].astype(str) != "unchecked"]
    changed = checked[checked["observer_equal"].astype(str) == "no"]
    lines = [f"The deployed model (final output only) gives the instrumented run's final "
             f"output bit for bit on {len(checked) - len(changed)} of {len(checked)} checked "
             "devices."]
    for row in changed.to_dict("records"):
        lines.append(f"{row['device']} ({row['model']}): the deployed model "
                     f"({row['deployed_program']}) differs from the instrumented run on "
                     f"{int(row['samples']) - int(row['equal_samples'])} of "
                     f"{int(row['samples'])} samples: its final-output classes are the "
                     "deployed outputs', its per-layer analyses describe the instrumented "
                     "program.")
    return lines


def failures(table: pd.DataFrame) -> list[str]:
    if table.empty:
        return ["None: every scheduled device ran."]
    return [f"{row['device']} ({row['model']}): {row['reason']} (log: {row['log']})"
            for row in table.to_dict("records")]


ATLAS_HEADING = "This machine among the machines measured"


def atlas(table: pd.DataFrame, refused: pd.DataFrame) -> list[str]:
    """The reference model's devices on this machine against the atlas's machines
    (atlas.csv, bitdrift.atlas.entries): per device, the machines of the same bits and
    where the others part; the entries that could not be read, one line each."""
    from bitdrift.atlas.entries import THIS_MACHINE, rows_from_table, summary_lines

    lines = []
    if not table.empty:
        others = table[table["machine"] != THIS_MACHINE]
        names = dict(zip(others["machine"], others["name"], strict=False))
        lines.append(f"The atlas holds {len(names)} machine(s): "
                     + (", ".join(f"{name} [{entry}]" for entry, name in names.items())
                        or "none yet")
                     + "; the reference model ran here on "
                     + ", ".join(table.loc[table["machine"] == THIS_MACHINE, "device"])
                     + " (figure atlas.png: machines x devices, colour = class across "
                     "machines).")
        lines += summary_lines(rows_from_table(table))
    elif refused.empty:
        lines.append("No device ran the reference model.")
    lines += [f"Entry {row.entry} left out: {row.reason}" for row in refused.itertuples()]
    return lines


def _read(path) -> pd.DataFrame:
    return pd.read_csv(path) if path and Path(path).is_file() else pd.DataFrame()


class _Tables(dict):
    """{name: table}, each read from its path on first use (an absent one: empty), so the
    findings read only the tables their sections quote."""

    def __init__(self, files: dict):
        super().__init__()
        self.files = files

    def __missing__(self, name: str) -> pd.DataFrame:
        self[name] = _read(self.files.get(name))
        return self[name]


def findings(tables: dict, fingerprints: dict,
             study_sections=()) -> list[tuple[str, list[str]]]:
    """(heading, sentences) sections from the tables (``tables``: name -> CSV path) and the
    records' fingerprints ({device: fingerprint}: the first native one names the machine);
    then the studies' sections (StudySection) whose tables are there."""
    fingerprint = next((found for found in fingerprints.values()
                        if not found.get("emulation")), None)
    read = _Tables(tables)
    precisions = dict(zip(read["eqc_layers"].get("device", []),
                          read["eqc_layers"].get("precision", []), strict=False)) \
        if not read["eqc_layers"].empty else {}
    eqc = read["eqc"]
    ran = sorted(set(eqc["device"])) if not eqc.empty else []
    sections = [("Machine", (machine(fingerprint) if fingerprint else ["No record ran."])
                 + [f"Devices that ran: {len(ran)}; failed: {len(read['device_failures'])}."]
                 + emulated(fingerprints))]
    sections.append(("Equivalence classes", classes(eqc, precisions) if not eqc.empty
                     else ["No classes: no record."]))
    if not read["explain"].empty:
        sections.append(("What explains the classes", explanations(read["explain"])))
    sections.append(("Devices computing below their declared format",
                     reduced_precision(read["effective_precision"])))
    if not read["divergence"].empty:
        sections.append(("Where devices part", divergence(read["divergence"],
                                                          read["kernel_coverage"])))
    if not read["accumulation_orders"].empty:
        sections.append(("How the layers sum", orders(read["accumulation_orders"])))
    if not read["argmax_agreement"].empty:
        sections.append(("Predicted labels against TensorFlow's",
                         agreement(read["argmax_agreement"])))
    if not read["observer_check"].empty:
        sections.append(("Instrumentation and the deployed model",
                         observer(read["observer_check"])))
    if not read["atlas"].empty or not read["atlas_refused"].empty:
        sections.append((ATLAS_HEADING, atlas(read["atlas"], read["atlas_refused"])))
    sections.append(("Devices that failed", failures(read["device_failures"])))
    for study in sorted(study_sections, key=lambda section: section.place):
        frames = [read[name] for name in study.tables]
        if not any(frame.empty for frame in frames):
            sections.append((study.title, study.sentences(*frames)))
    return sections


TITLE = "Findings on this machine"
PREAMBLE = ("Written by the run from its own tables (results/tables/): what this machine "
            "showed. Another CPU, runtime version or configuration gives other findings.")


def markdown(sections, figure=None, out_path=None) -> str:
    out = [f"# {TITLE}", "", PREAMBLE, ""]
    for heading, sentences in sections:
        out += [f"## {heading}", ""] + [f"- {sentence}" for sentence in sentences] + [""]
        if figure and heading == FIGURE_AFTER:
            import os

            where = os.path.relpath(figure, Path(out_path).parent) if out_path else figure
            out += [f"![equivalence classes]({where})", "", FIGURE_CAPTION, ""]
    return "\n".join(out)


FIGURE_AFTER = "Equivalence classes"  # the section the EQC figure follows
FIGURE_CAPTION = ("The equivalence classes (eqc.png): a column per test sample, a row per "
                  "device; equal numbers in a column are bit-identical outputs; a colour "
                  "follows one group of devices. The dendrogram joins the devices of the "
                  "analysed precision (float32 by default) by the leading mantissa bits their "
                  "outputs share (its axis, remaining precision): bit-identical devices join "
                  "at the format's full mantissa (23 bits in float32), at its right edge, and "
                  "the further left two groups join, the fewer bits they share.")


def embedded_figure(png) -> list[str]:
    """reST lines showing the PNG inline (a data URI: the report is one file)."""
    import base64

    # wrapped: docutils refuses a line over 10,000 characters, and a data URI's base64
    # may hold line breaks (browsers drop whitespace when they decode it)
    data = base64.encodebytes(Path(png).read_bytes()).decode().split()
    return [".. raw:: html", "",
            '   <figure><img alt="equivalence classes" style="max-width:100%"',
            '   src="data:image/png;base64,', *(f"   {line}" for line in data),
            f'   "><figcaption>{FIGURE_CAPTION}</figcaption></figure>', ""]


def restructured_text(sections, figure=None) -> str:
    """The same sections as reStructuredText, for the report's first screen; ``figure``
    (the EQC figure's PNG) is shown after the classes."""
    import re

    def literal(sentence: str) -> str:  # reST's literal is double backticks
        return re.sub(r"`([^`]+)`", r"``\1``", sentence)

    out = [TITLE, "=" * len(TITLE), "", PREAMBLE, ""]
    for heading, sentences in sections:
        out += [heading, "-" * len(heading), ""] + [f"- {literal(sentence)}"
                                                     for sentence in sentences] + [""]
        if figure and heading == FIGURE_AFTER:
            out += embedded_figure(figure)
    return "\n".join(out)


def fingerprints(records) -> dict:
    """{device: fingerprint} of the records that ran (failure records have none)."""
    import h5py

    from bitdrift.record.hdf5 import FAILED
    from bitdrift.record.reader import checked_fingerprint

    found = {}
    for path in records:
        try:
            with h5py.File(path, "r") as handle:
                if FAILED in handle.attrs or "fingerprint" not in handle.attrs:
                    continue
                value, device = handle.attrs["fingerprint"], handle.attrs["device"]
                value = json.loads(value.decode() if isinstance(value, bytes) else value)
                device = device.decode() if isinstance(device, bytes) else str(device)
        except (OSError, ValueError, KeyError):
            continue
        value = checked_fingerprint(value, path)  # read as an object below: refused else
        if value:
            found.setdefault(device, value)
    return found


def write_findings(tables: dict, records, out_markdown, out_rst=None, figure=None,
                   study_sections=()) -> list:
    """findings.md (and the report's .rst) from the tables and the first record, with the
    studies' sections (StudySection); the EQC figure's PNG (``figure``) follows the
    classes (linked in the Markdown, inline in the report)."""
    from bitdrift.atomic import atomic_output

    sections = findings(tables, fingerprints(records), study_sections)
    for path, text in ((out_markdown, markdown(sections, figure, out_markdown)),
                       (out_rst, restructured_text(sections, figure) if out_rst else None)):
        if path:
            with atomic_output(path) as tmp:
                Path(tmp).write_text(text)
    return sections
