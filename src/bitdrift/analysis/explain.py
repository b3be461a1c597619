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
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bitdrift.analysis.kernels import UNTRACED, divergence_kernels, record_signatures
from bitdrift.errors import RecordError
from bitdrift.record.hdf5 import OUTPUT
from bitdrift.record.reader import Record
from bitdrift.runtimes import FRAMEWORKS, KNOBS, USES

MISSING = "missing"
FLAG_PREFIX = "cpu.flags["
EXPLAIN_COLUMNS = ["model", "sample", "layer", "n_eqc", "n_devices", "attributes", "determined",
                   "search", "unexplained_devices", "alternatives", "confounded", "weak",
                   "nondeterministic_devices"]
ALTERNATIVES_SHOWN = 10
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


def _device_config(record: Record) -> dict:
    """The record's device settings (absent: none), of the types read below."""
    config = record.json_attr("device_config", default={})
    if config.get("env") is not None and not isinstance(config["env"], dict):
        raise RecordError(f"{record.path}: attribute 'device_config': 'env' is not an object")
    return config


def device_attributes(record: Record) -> tuple[dict[str, str], list[str]]:
    """(named attributes, CPU flags) of one record, from its root attributes and its
    `fingerprint` JSON; anything absent is ``missing``."""
    fingerprint = record.fingerprint if isinstance(record.fingerprint, dict) else {}
    config = _device_config(record)
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
    backend = attributes["backend"]
    # A runtime's knobs (bitdrift.runtimes.KNOBS), by their device keys; unset is the
    # runtime's default, which a record of another runtime lacks (`missing`).
    for knob in KNOBS.get(backend, ()):
        attributes[knob] = _text(config.get(knob)) if config.get(knob) is not None \
            else "default"
    for module, version in (fingerprint.get("versions") or {}).items():
        framework = FRAMEWORKS.get(module.split("_")[0])
        if framework is not None and framework not in (backend, *USES.get(backend, ())):
            continue  # another framework's version: loaded by the process, not used
        attributes[f"versions.{module}"] = _text(version)
    # Which kernel each layer ran (the traced repeat, bitdrift.analysis.kernels): "classes are
    # decided by kernel.conv2d" is the answer a framework engineer can act on.
    for layer, name in (record_signatures(record) or {}).items():
        attributes[f"kernel.{layer}"] = name
    # ... and the order its Dense and Conv2D layers summed in (bitdrift.analysis.accumulation): the
    # why below
    # the kernel's name
    for layer, entry in (record.accumulation_orders or {}).items():
        attributes[f"order.{layer}"] = _text(entry.get("order", ""))
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
    """Attributes that can explain a class: every attribute that is not constant. One with
    a different value on every device is kept too: where each device has its own GPU, the
    GPU's name may be the answer (such a set is marked weak, see :func:`is_weak`)."""
    return sorted((name for name in table.columns if table[name].nunique() >= 2),
                  key=_attribute_order)


def is_weak(table: pd.DataFrame, attributes: list[str]) -> bool:
    """A set with a value seen on one device only: that class rests on no replication."""
    return any((table[name].value_counts() == 1).any() for name in attributes)


def confounded_groups(table: pd.DataFrame, names: list[str]) -> dict[str, list[str]]:
    """Attributes that split the devices identically, grouped under the first by
    :func:`_attribute_order` (``backend``, ``versions.torch`` and ``versions.torch_mkldnn``
    on a CPU matrix of two frameworks are one group): no set of devices can tell them apart."""
    groups: dict[tuple, list[str]] = {}
    for name in sorted(names, key=_attribute_order):
        partition = tuple(pd.factorize(table[name])[0])
        groups.setdefault(partition, []).append(name)
    return {members[0]: members[1:] for members in groups.values()}


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
    alternatives: list[list[str]] = field(default_factory=list)  # other sets of that size
    confounded: dict[str, list[str]] = field(default_factory=dict)  # chosen -> same split
    weak: bool = False


def _groups_under(table: pd.DataFrame, attributes: list[str]) -> int:
    if not attributes:
        return 1
    return len(table[attributes].drop_duplicates())


def smallest_determining_set(table: pd.DataFrame, classes: list[int],
                             time_budget: float = 10.0) -> Explanation:
    """A smallest set of attributes whose joint value determines every device's class:
    every two devices of different classes differ in a chosen attribute. Smallest among
    all attributes; attributes that split the devices identically count as one (the others
    are listed as ``confounded``). Among sets of the smallest size, the one that splits the
    devices into the fewest groups, then one that is not weak; the others are
    ``alternatives``. Exact (integer program, PuLP/CBC) within ``time_budget`` seconds;
    greedy beyond it."""
    groups = confounded_groups(table, informative(table))
    candidates = sorted(groups, key=_attribute_order)
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
    options, search = _solve(kept, len(candidates), time_budget)

    def named(option):
        return sorted((candidates[k] for k in option), key=_attribute_order)

    ranked = sorted((named(option) for option in options), key=lambda names: (
        _groups_under(table, names), is_weak(table, names),
        [_attribute_order(name) for name in names]))
    chosen = ranked[0]
    return Explanation(chosen, not unexplained, search, unexplained,
                       alternatives=ranked[1:1 + ALTERNATIVES_SHOWN],
                       confounded={name: groups[name] for name in chosen if groups[name]},
                       weak=is_weak(table, chosen))


def _solve(constraints: list[frozenset], n: int,
           time_budget: float) -> tuple[list[set[int]], str]:
    """Every set of the smallest size (up to 50, by no-good cuts) and how it was found."""
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
        return [_greedy(constraints)], "greedy"
    best = {k for k in range(n) if chosen[k].value() > 0.5}
    size = len(best)
    options = [best]
    problem += pulp.lpSum(chosen) == size
    while len(options) < 50 and time.monotonic() - started < time_budget:
        problem += pulp.lpSum(chosen[k] for k in options[-1]) <= size - 1
        status = problem.solve(solver)
        if pulp.LpStatus[status] != "Optimal":
            break
        options.append({k for k in range(n) if chosen[k].value() > 0.5})
    return options, "exact"


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
    from bitdrift.analysis.eqc import analyse
    from bitdrift.record.reader import group_by_model

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
                "alternatives": "|".join(";".join(option)
                                         for option in explanation.alternatives),
                "confounded": ";".join(f"{name}={'+'.join(others)}" for name, others
                                       in explanation.confounded.items()),
                "weak": explanation.weak,
                # Their class is their majority output over the repeats.
                "nondeterministic_devices": ";".join(
                    summary.device for summary in result.devices if not summary.deterministic),
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
    classes: dict[int, int]  # sample -> class id of the match (eqc.csv's numbers)
    nearest: list[str]  # when not matched: devices of the nearest class (of all tied ones)
    remaining_precision: float  # of the record against the nearest class (matched: full)
    shared: dict[str, str]  # attributes the matched (or nearest) devices share
    differing: dict[str, tuple[str, str]]  # shared ones the record itself has otherwise
    # When not matched: each class tied for the highest remaining precision, as
    # ({sample: class id}, its devices); one entry unless classes tie.
    nearest_classes: list[tuple[dict[int, int], list[str]]] = field(default_factory=list)


def _refuse_other_inputs(unknown: Record, known: list[Record]) -> None:
    """A record of another model or other inputs has no class among these (a relabelled
    record would otherwise get a "nearest class")."""
    from bitdrift.errors import RecordError

    for key, what in (("model_sha256", "model"), ("input_sha256", "inputs")):
        theirs = sorted({record.attr(key) for record in known})
        if unknown.attr(key) not in theirs:
            raise RecordError(
                f"{unknown.path}: {key} {unknown.attr(key)[:12]}... differs from the known "
                f"records' ({', '.join(value[:12] + '...' for value in theirs)}): computed "
                f"from other {what}, it cannot be identified against them")


def identify(unknown: Record, known: list[Record], eqc: pd.DataFrame | None = None
             ) -> Identification:
    """Name the known class a record falls in, bitwise, on every sample it shares with the
    known records of its model; else the class nearest by remaining precision (classes
    tied for it are all given). Class numbers are ``eqc``'s (eqc.csv) where given, else by
    first appearance over ``known`` in order (as `bitdrift eqc` numbers them)."""
    from bitdrift.analysis.eqc import number_classes, summarize_repeats
    from bitdrift.analysis.remaining_precision import MANTISSA_BITS, dropped_bits
    from bitdrift.errors import RecordError

    known = [record for record in known if record.model == unknown.model]
    if not known:
        raise RecordError(f"{unknown.path}: no known record of model {unknown.model!r}")
    _refuse_other_inputs(unknown, known)
    samples = [s for s in unknown.samples if all(s in record.samples for record in known)]
    if not samples:
        raise RecordError(f"{unknown.path}: shares no sample with the known records")
    same = set(range(len(known)))
    numbers = {sample: _class_numbers(eqc, unknown.model, sample, known) for sample in samples}
    known_classes = {sample: [] for sample in samples}
    query_class, dropped = {}, np.zeros(len(known))
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
        local = number_classes(keys[:-1])
        # eqc.csv's numbers where given (it has every known device, or was refused)
        known_classes[sample] = [numbers[sample][record.device] if numbers[sample] else number
                                 for record, number in zip(known, local, strict=True)]
        same &= {i for i in range(len(known)) if keys[i] == keys[-1]}
        if same:
            query_class[sample] = known_classes[sample][min(same)]
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
        return Identification(True, devices, {s: query_class[s] for s in samples}, [],
                              float(mantissa), shared, differing(shared))
    # A class is a device's classes over all samples; its precision to the query is the
    # one its members share with it (members of a class hold the same bits).
    by_class: dict[tuple, list[int]] = {}
    for i in range(len(known)):
        by_class.setdefault(tuple(known_classes[s][i] for s in samples), []).append(i)
    best = float(min(dropped))
    tied = [(dict(zip(samples, key, strict=True)), [known[i].device for i in members])
            for key, members in by_class.items() if dropped[members[0]] == best]
    nearest = [device for _, devices in tied for device in devices]
    shared = _shared(table, nearest)
    return Identification(False, [], {}, nearest, float(max(mantissa - best, 0)), shared,
                          differing(shared), nearest_classes=tied)


def _class_numbers(eqc: pd.DataFrame | None, model: str, sample: int,
                   known: list[Record]) -> dict[str, int]:
    """device -> class in eqc.csv for one sample; {} without a table."""
    if eqc is None:
        return {}
    part = eqc[(eqc["model"].astype(str) == model) & (eqc["sample"] == sample)]
    numbers = dict(zip(part["device"].astype(str), part["eqc"].astype(int), strict=True))
    from bitdrift.errors import RecordError

    missing = [record.device for record in known if record.device not in numbers]
    if missing:
        raise RecordError(f"eqc table has no class for device(s) {', '.join(missing)} "
                          f"(model {model!r}, sample {sample}); give the table made from "
                          "these records")
    return numbers


def _shared(table: pd.DataFrame, devices: list[str]) -> dict[str, str]:
    part = table.loc[devices]
    return {name: str(part[name].iloc[0]) for name in informative(table)
            if part[name].nunique() == 1}


# -- the paper's class tables (Tables SUP-1, SUP-2) ------------------------------------------
def _describe(attributes: pd.Series) -> dict:
    environment = ";".join(f"{name[4:]}={value}" for name, value in attributes.items()
                           if name.startswith("env.") and value != MISSING)
    gpu = attributes.get("accelerator.gpu_name", MISSING)
    # The runtime's knobs the device sets (ONNX Runtime's graph optimisation level,
    # OpenVINO's precision hint...): often all that separates two rows
    options = ";".join(f"{knob}={attributes[knob]}"
                       for knob in KNOBS.get(attributes.get("backend", MISSING), ())
                       if attributes.get(knob, "default") not in ("default", MISSING))
    return {"vendor": attributes.get("cpu.vendor", MISSING),
            "cores": attributes.get("cpu.count", MISSING),
            "processor": gpu if gpu != MISSING else attributes.get("cpu.brand", MISSING),
            "backend": attributes.get("backend", MISSING),
            "threads": attributes.get("threads", MISSING),
            "batch_size": attributes.get("batch_size", MISSING),
            "precision": attributes.get("precision", MISSING), "env": environment,
            "options": options}


def class_table(records: list[Record], eqc: pd.DataFrame,
                classes: pd.DataFrame) -> pd.DataFrame:
    """One row per device: what it is (hardware, runtime, threads, batch, precision,
    environment, the runtime's options), its settings group (``device_class`` of
    device_classes.csv: devices with equal values of the attributes that explain the
    classes; a number of its own, not an equivalence class), and its class in each (model,
    sample) column with `*` for a non-deterministic device; sorted by settings group, then
    in the records' order (Tables SUP-1/SUP-2)."""
    from bitdrift.errors import RecordError

    # One row per device: a device measured under several models is described once.
    first = list({record.device: record for record in reversed(records)}.values())[::-1]
    table, _ = attribute_table(first)
    devices = list(dict.fromkeys(eqc["device"].astype(str)))
    missing = [device for device in devices if device not in table.index]
    if missing:
        raise RecordError(f"the eqc table names device(s) {', '.join(missing)} with no "
                          "record among the files given; pass the records it was made from")
    device_class = (classes.drop_duplicates("device").set_index("device")["device_class"]
                    if len(classes) else pd.Series(dtype=int))
    rows = []
    for order, device in enumerate(devices):
        attributes = table.loc[device]
        row = {"device": device, **_describe(attributes),
               "settings_group": int(device_class.get(device, 0)), "_order": order}
        for item in eqc[eqc["device"] == device].itertuples():
            row[f"{item.model}#{item.sample}"] = f"{item.eqc}" + (
                "" if item.deterministic else "*")
        rows.append(row)
    out = pd.DataFrame(rows).sort_values(["settings_group", "_order"], kind="stable")
    # A device measured under one model only has no class in another model's columns.
    columns = [column for column in out.columns if "#" in column]
    out[columns] = out[columns].fillna("-")
    return out.drop(columns="_order").reset_index(drop=True)


# The kernels against the classes: kernel_coverage.csv
COVERAGE_COLUMNS = ["model", "first_divergences", "kernels_differ", "same_kernels_other_settings",
                    "unexplained", "untraced", "deployed_only", "share_kernels_differ",
                    "share_same_kernels_other_settings", "share_unexplained",
                    "adjusted_rand_index_mean", "adjusted_rand_index_min",
                    "adjusted_rand_index_max", "traced_devices"]


def coverage(records, divergence, eqc) -> list[dict]:
    """Per model: of all (class pair, sample) first divergences (each pair of classes
    once: divergence.class_pairs), the share where the recorded kernels differ at that
    layer, where they are the same but another attribute differs
    (threads, batch size: same kernel, other blocking or reduction order), and the share
    left unexplained; pairs with an untraced device are counted apart, and so are pairs
    that part only at the deployed model's final output (every recorded layer agrees: the
    instrumented and the deployed program differ, bitdrift.analysis.observer). And the adjusted
    Rand index between each traced device's kernel signature over all layers and its
    final-output class, per sample (mean, min, max)."""
    from sklearn.metrics import adjusted_rand_score

    from bitdrift.analysis.divergence import class_pairs
    from bitdrift.record.reader import group_by_model

    table = divergence if "kernels_differ" in divergence.columns \
        else divergence_kernels(records, divergence)
    # A pair bit-identical at every layer has no first layer: empty in memory, NaN when
    # read back from the CSV (pandas 3 keeps NaN through astype(str))
    table = table.assign(**{column: table[column].fillna("").astype(str).replace("nan", "")
                            for column in ("first_layer", "kernels_differ")})
    rows = []
    for model, group in group_by_model(records):
        attributes, _ = attribute_table(group)
        settings = [name for name in attributes.columns
                    if not name.startswith(("kernel.", "order."))]
        part = class_pairs(table[table["model"] == model])  # each class pair once
        counts = {"kernels_differ": 0, "same_kernels_other_settings": 0, "unexplained": 0,
                  "untraced": 0, "deployed_only": 0}
        for row in part.itertuples(index=False):
            if row.first_layer == OUTPUT:  # no recorded layer parts: no kernel to compare
                counts["deployed_only"] += 1
            elif row.kernels_differ == "yes":
                counts["kernels_differ"] += 1
            elif row.kernels_differ == "no":
                apart = attributes.loc[row.device_a, settings] != \
                    attributes.loc[row.device_b, settings]
                key = "same_kernels_other_settings" if apart.any() else "unexplained"
                counts[key] += 1
            else:
                counts["untraced"] += 1
        traced_total = len(part) - counts["untraced"] - counts["deployed_only"]
        signatures = {record.device: record_signatures(record) for record in group}
        traced = [device for device, value in signatures.items()
                  if value and not any(s.startswith(UNTRACED) for s in value.values())]
        labels = {device: "|".join(f"{layer}={name}" for layer, name in
                                   sorted(signatures[device].items())) for device in traced}
        scores = []
        for _, final in eqc[eqc["model"] == model].groupby("sample"):
            final = final[final["device"].isin(traced)]
            if len(final) >= 2:
                scores.append(adjusted_rand_score(final["eqc"].tolist(),
                                                  [labels[d] for d in final["device"]]))
        rows.append({"model": model, "first_divergences": len(part), **counts,
                     **{f"share_{key}": (counts[key] / traced_total if traced_total else None)
                        for key in ("kernels_differ", "same_kernels_other_settings",
                                    "unexplained")},
                     "adjusted_rand_index_mean": float(sum(scores) / len(scores))
                     if scores else None,
                     "adjusted_rand_index_min": min(scores) if scores else None,
                     "adjusted_rand_index_max": max(scores) if scores else None,
                     "traced_devices": len(traced)})
    return rows
