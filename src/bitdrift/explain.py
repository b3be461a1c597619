"""Why devices part ways: device attributes from the records, CPU flag groups (Table SUP-3),
the smallest set of attributes that determines every device's class (a set cover, solved
exactly with an integer program within a time budget, greedily beyond it), paper-style
device classes (Table SUP-1), and identifying the class of a record of unknown origin.

Only NumPy, pandas and PuLP (no TensorFlow or torch): records from machines bitdrift never
saw, and hand-written ones, are explained the same way. A value a record lacks is its own
value, ``missing``, never an error.
"""

from __future__ import annotations

import itertools
import json
import time
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from bitdrift.record import Record

MISSING = "missing"
FLAG_PREFIX = "cpu.flags["
EXPLAIN_COLUMNS = ["model", "sample", "layer", "n_eqc", "n_devices", "attributes", "determined",
                   "search", "unexplained_devices"]
# Attributes that describe a device in the class tables (Table SUP-1/SUP-2 columns).
DESCRIPTIVE = ("cpu.vendor", "cpu.brand", "cpu.count", "accelerator", "accelerator.gpu_name",
               "backend", "threads", "batch_size", "precision")


def _text(value) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _json(record: Record, key: str) -> dict:
    try:
        return json.loads(record.attr(key)) if record.has_attr(key) else {}
    except (TypeError, ValueError):
        return {}


def device_attributes(record: Record) -> tuple[dict[str, str], list[str]]:
    """(named attributes, CPU flags) of one record, from its root attributes and its
    `fingerprint` JSON; anything absent is ``missing``."""
    fingerprint = record.fingerprint if isinstance(record.fingerprint, dict) else {}
    config = _json(record, "device_config")
    def first(*values):
        return next((v for v in values if v is not None), None)

    def root_attr(key):
        return record.attr(key) if record.has_attr(key) else None

    accelerator = fingerprint.get("accelerator") or {}
    cpu = fingerprint.get("cpu") or {}
    attributes = {
        "backend": _text(root_attr("backend")),
        "precision": _text(root_attr("precision")),
        "batch_size": _text(first(root_attr("batch_size"), config.get("batch_size"))),
        "threads": _text(first(fingerprint.get("threads"), config.get("threads"))),
        "accelerator": _text(first(root_attr("accelerator"), accelerator.get("accelerator"),
                                   config.get("accelerator"))),
        "accelerator.gpu_name": _text(accelerator.get("gpu_name")),
        "accelerator.compute_capability": _text(accelerator.get("compute_capability")),
        "cpu.count": _text(cpu.get("count")),
        "cpu.brand": _text(cpu.get("brand")),
        "cpu.vendor": _text(cpu.get("vendor")),
    }
    for name, value in (fingerprint.get("environment") or config.get("env") or {}).items():
        attributes[f"env.{name}"] = _text(value)
    for module, version in (fingerprint.get("versions") or {}).items():
        attributes[f"versions.{module}"] = _text(version)
    flags = cpu.get("flags")
    return attributes, sorted(set(flags)) if isinstance(flags, list) else []


def flag_groups(flags_per_device: list[list[str]]) -> tuple[pd.DataFrame, dict[str, list[bool]]]:
    """Table SUP-3: flags on every device are common (group ``C``); the others are grouped by
    identical presence over the devices, numbered 1, 2, ... in order of first appearance
    over the sorted flags. Returns the ``flag, group`` table and one true/false attribute
    per group, named ``cpu.flags[<its flags joined by +>]``."""
    sets = [set(flags) for flags in flags_per_device]
    every = sorted(set().union(*sets)) if sets else []
    groups: dict[tuple, list[str]] = {}
    rows = []
    for flag in every:
        presence = tuple(flag in flags for flags in sets)
        if all(presence):
            rows.append({"flag": flag, "group": "C"})
            continue
        groups.setdefault(presence, []).append(flag)
    number = {presence: index for index, presence in enumerate(groups, start=1)}
    for flag in every:
        presence = tuple(flag in flags for flags in sets)
        if not all(presence):
            rows.append({"flag": flag, "group": str(number[presence])})
    rows.sort(key=lambda row: row["flag"])
    attributes = {f"{FLAG_PREFIX}{'+'.join(members)}]": list(presence)
                  for presence, members in groups.items()}
    return pd.DataFrame(rows, columns=["flag", "group"]), attributes


def attribute_table(records: list[Record]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Devices x attributes (strings; absent values ``missing``), flag groups included;
    and the flag-group table."""
    named, flags = zip(*(device_attributes(record) for record in records), strict=True)
    table = pd.DataFrame(list(named), index=[record.device for record in records])
    table = table.fillna(MISSING)
    groups, flag_attributes = flag_groups(list(flags))
    for name, presence in flag_attributes.items():
        table[name] = [_text(value) for value in presence]
    return table, groups


def informative(table: pd.DataFrame) -> list[str]:
    """Attributes that can explain a class: not constant, and not different on (nearly)
    every device (hostnames, serial numbers, clock readings explain nothing)."""
    devices = len(table)
    keep = []
    for name in table.columns:
        distinct = table[name].nunique()
        if distinct < 2:
            continue
        if devices >= 3 and distinct >= max(devices - devices // 10, 3):
            continue
        keep.append(name)
    return sorted(keep, key=_attribute_order)


def _attribute_order(name: str):
    # Configured settings first, then hardware, environment, versions, flag groups.
    rank = (0 if "." not in name else 1 if name.startswith(("accelerator", "cpu.count",
                                                            "cpu.brand", "cpu.vendor"))
            else 2 if name.startswith("env.") else 3 if name.startswith("versions.") else 4)
    return rank, name


@dataclass
class Explanation:
    attributes: list[str]
    determined: bool
    search: str  # exact | greedy
    unexplained: list[str]


def _groups_under(table: pd.DataFrame, attributes: list[str]) -> int:
    if not attributes:
        return 1
    return len(table[attributes].drop_duplicates())


def smallest_determining_set(table: pd.DataFrame, classes: list[int],
                             time_budget: float = 10.0) -> Explanation:
    """A smallest set of attributes whose joint value determines every device's class:
    every two devices of different classes differ in a chosen attribute. Among sets of
    the smallest size, the one that splits the devices into the fewest groups. Exact
    (integer program, PuLP/CBC) within ``time_budget`` seconds; greedy beyond it."""
    candidates = informative(table)
    values = table[candidates].to_numpy(dtype=object) if candidates else \
        np.empty((len(table), 0), dtype=object)
    devices = list(table.index)
    # Devices with the same values in every candidate cannot be told apart: one profile.
    profiles: dict[tuple, list[int]] = {}
    for index, row in enumerate(values):
        profiles.setdefault(tuple(row), []).append(index)
    unexplained = sorted({devices[i] for members in profiles.values()
                          if len({classes[i] for i in members}) > 1 for i in members},
                         key=devices.index)
    keys = list(profiles)
    profile_classes = [{classes[i] for i in profiles[key]} for key in keys]
    constraints = set()
    for a, b in itertools.combinations(range(len(keys)), 2):
        if profile_classes[a] == profile_classes[b] and len(profile_classes[a]) == 1:
            continue  # same single class: no need to tell apart
        differing = frozenset(k for k in range(len(candidates)) if keys[a][k] != keys[b][k])
        constraints.add(differing)
    # A constraint implied by a smaller one (its subset) adds nothing.
    ordered = sorted(constraints, key=len)
    kept: list[frozenset] = []
    for constraint in ordered:
        if not any(other <= constraint for other in kept):
            kept.append(constraint)
    if not kept:
        return Explanation([], not unexplained, "exact", unexplained)
    chosen, search = _solve(kept, len(candidates), table[candidates], time_budget)
    return Explanation([candidates[k] for k in sorted(chosen, key=lambda k: _attribute_order(
        candidates[k]))], not unexplained, search, unexplained)


def _solve(constraints: list[frozenset], n: int, table: pd.DataFrame,
           time_budget: float) -> tuple[set[int], str]:
    import pulp

    started = time.monotonic()
    problem = pulp.LpProblem("determining_set", pulp.LpMinimize)
    chosen = [problem.add_variable(f"a{k}", cat="Binary") for k in range(n)]
    problem += pulp.lpSum(chosen)
    for constraint in constraints:
        problem += pulp.lpSum(chosen[k] for k in constraint) >= 1
    with warnings.catch_warnings():
        # The CBC binary PuLP ships is the only solver installed; PuLP 4 renames its class.
        warnings.simplefilter("ignore", DeprecationWarning)
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=max(time_budget, 1))
    status = problem.solve(solver)
    if pulp.LpStatus[status] != "Optimal" or time.monotonic() - started > time_budget:
        return _greedy(constraints), "greedy"
    best = {k for k in range(n) if chosen[k].value() > 0.5}
    size = len(best)
    columns = list(table.columns)
    # Other sets of the same size: keep the one with the fewest groups (no-good cuts).
    options = [best]
    problem += pulp.lpSum(chosen) == size
    while len(options) < 50 and time.monotonic() - started < time_budget:
        problem += pulp.lpSum(chosen[k] for k in options[-1]) <= size - 1
        status = problem.solve(solver)
        if pulp.LpStatus[status] != "Optimal":
            break
        options.append({k for k in range(n) if chosen[k].value() > 0.5})
    best = min(options, key=lambda option: (
        _groups_under(table, [columns[k] for k in option]),
        sorted(_attribute_order(columns[k]) for k in option)))
    return best, "exact"


def _greedy(constraints: list[frozenset]) -> set[int]:
    left, chosen = list(constraints), set()
    while left:
        counts: dict[int, int] = {}
        for constraint in left:
            for k in constraint:
                counts[k] = counts.get(k, 0) + 1
        pick = max(sorted(counts), key=counts.get)
        chosen.add(pick)
        left = [constraint for constraint in left if pick not in constraint]
    return chosen


def explain_table(records: list[Record], layers: bool = False,
                  time_budget: float = 10.0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``explain.csv`` rows per (model, sample[, layer]); the flag groups; and each
    device's class under the attributes used anywhere (``device_classes.csv``)."""
    from bitdrift.eqc import analyse
    from bitdrift.record import group_by_model

    rows, used, tables = [], [], {}
    flag_tables = []
    for model, group in group_by_model(records):
        table, flags = attribute_table(group)
        tables[model] = table
        flag_tables.append(flags)
        cache: dict[tuple, Explanation] = {}
        for result in analyse(group, layers=layers, remaining_precision=False):
            key = tuple(result.classes)
            if key not in cache:
                cache[key] = smallest_determining_set(table, result.classes, time_budget)
            explanation = cache[key]
            used += [name for name in explanation.attributes if name not in used]
            rows.append({
                "model": model, "sample": result.sample, "layer": result.layer,
                "n_eqc": len(set(result.classes)), "n_devices": len(result.classes),
                "attributes": ";".join(explanation.attributes),
                "determined": explanation.determined, "search": explanation.search,
                "unexplained_devices": ";".join(explanation.unexplained),
            })
    flags = flag_tables[0] if len(flag_tables) == 1 else (
        pd.concat(flag_tables).drop_duplicates("flag") if flag_tables else
        pd.DataFrame(columns=["flag", "group"]))
    return (pd.DataFrame(rows, columns=EXPLAIN_COLUMNS), flags,
            device_classes(tables, used))


def device_classes(tables: dict[str, pd.DataFrame], used: list[str]) -> pd.DataFrame:
    """Each device's class under the attributes used anywhere (the paper's "CPU class"
    column), numbered by first appearance in device order, with those values."""
    rows = []
    for model, table in tables.items():
        columns = [name for name in used if name in table.columns]
        profiles: dict[tuple, int] = {}
        for device, values in table[columns].iterrows():
            key = tuple(values)
            number = profiles.setdefault(key, len(profiles) + 1)
            rows.append({"model": model, "device": device, "device_class": number,
                         **dict(zip(columns, key, strict=True))})
    return pd.DataFrame(rows)


# -- identify: the forensic question -------------------------------------------------------
@dataclass
class Identification:
    matched: bool
    devices: list[str]  # devices whose outputs equal the record's on every sample
    classes: dict[int, int]  # sample -> class id of the match
    nearest: list[str]  # when not matched: devices of the nearest class
    remaining_precision: float  # of the record against the nearest class (matched: full)
    shared: dict[str, str]  # attributes the matched (or nearest) devices share
    differing: dict[str, tuple[str, str]]  # shared ones the record itself has otherwise


def identify(unknown: Record, known: list[Record]) -> Identification:
    """Name the known class a record falls in, bitwise, on every sample it shares with the
    known records of its model; else the nearest class by remaining precision."""
    from bitdrift.eqc import number_classes, summarize_repeats
    from bitdrift.precision import MANTISSA_BITS, dropped_bits

    known = [record for record in known if record.model == unknown.model]
    if not known:
        from bitdrift.errors import RecordError

        raise RecordError(f"{unknown.path}: no known record of model {unknown.model!r}")
    samples = [s for s in unknown.samples if all(s in record.samples for record in known)]
    if not samples:
        from bitdrift.errors import RecordError

        raise RecordError(f"{unknown.path}: shares no sample with the known records")
    same = set(range(len(known)))
    classes, dropped = {}, np.zeros(len(known))
    mantissa = None
    for sample in samples:
        keys, outputs = [], []
        for record in [*known, unknown]:
            tensor = record.tensor(sample, "output")
            summary, representative = summarize_repeats(record.device, tensor.values,
                                                        tensor.float_format)
            keys.append(summary.key)
            outputs.append(representative)
            mantissa = MANTISSA_BITS[tensor.float_format]
        ids = number_classes(keys)
        same &= {i for i in range(len(known)) if keys[i] == keys[-1]}
        classes[sample] = ids[-1]
        for i, output in enumerate(outputs[:-1]):
            if output.shape != outputs[-1].shape or output.dtype != outputs[-1].dtype:
                dropped[i] = np.inf  # not the same tensor: no precision in common
                continue
            dropped[i] = max(dropped[i], dropped_bits(output, outputs[-1], tensor.float_format))
    table, _ = attribute_table(known)
    own, _ = device_attributes(unknown)

    def differing(shared):
        return {name: (own.get(name, MISSING), value) for name, value in shared.items()
                if not name.startswith(FLAG_PREFIX) and own.get(name, MISSING) != value}

    if same:
        devices = [known[i].device for i in sorted(same)]
        shared = _shared(table, devices)
        return Identification(True, devices, classes, [], float(mantissa), shared,
                              differing(shared))
    best = float(np.min(dropped))
    nearest = [known[i].device for i in range(len(known)) if dropped[i] == best]
    shared = _shared(table, nearest)
    return Identification(False, [], {}, nearest, float(max(mantissa - best, 0)), shared,
                          differing(shared))


def _shared(table: pd.DataFrame, devices: list[str]) -> dict[str, str]:
    part = table.loc[devices]
    return {name: str(part[name].iloc[0]) for name in informative(table)
            if part[name].nunique() == 1}


# -- the paper's class tables (Tables SUP-1, SUP-2) ------------------------------------------
def _describe(attributes: pd.Series) -> dict:
    environment = ";".join(f"{name[4:]}={value}" for name, value in attributes.items()
                           if name.startswith("env.") and value != MISSING)
    gpu = attributes.get("accelerator.gpu_name", MISSING)
    return {"vendor": attributes.get("cpu.vendor", MISSING),
            "cores": attributes.get("cpu.count", MISSING),
            "processor": gpu if gpu != MISSING else attributes.get("cpu.brand", MISSING),
            "backend": attributes.get("backend", MISSING),
            "threads": attributes.get("threads", MISSING),
            "batch_size": attributes.get("batch_size", MISSING),
            "precision": attributes.get("precision", MISSING), "env": environment}


def class_table(records: list[Record], eqc: pd.DataFrame,
                classes: pd.DataFrame) -> pd.DataFrame:
    """One row per device: what it is, its device class, and its class in each (model,
    sample) column with `*` for a non-deterministic device; sorted by device class, then
    in the records' order (Tables SUP-1/SUP-2)."""
    table, _ = attribute_table(records)
    devices = list(dict.fromkeys(eqc["device"]))
    device_class = (classes.drop_duplicates("device").set_index("device")["device_class"]
                    if len(classes) else pd.Series(dtype=int))
    rows = []
    for order, device in enumerate(devices):
        attributes = table.loc[device] if device in table.index else pd.Series(dtype=object)
        row = {"device": device, **_describe(attributes),
               "device_class": int(device_class.get(device, 0)), "_order": order}
        for item in eqc[eqc["device"] == device].itertuples():
            row[f"{item.model}#{item.sample}"] = f"{item.eqc}" + (
                "" if item.deterministic else "*")
        rows.append(row)
    out = pd.DataFrame(rows).sort_values(["device_class", "_order"], kind="stable")
    return out.drop(columns="_order").reset_index(drop=True)
