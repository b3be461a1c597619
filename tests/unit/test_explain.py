"""Why and where devices part ways: attributes, flag groups, the smallest determining
attribute set, first divergent layers, class tables and identification, on hand-made
records and tables with known answers."""

import json

import h5py
import numpy as np
import pandas as pd
import pytest

from bitdrift.analysis.divergence import divergence_table, pairs_apart
from bitdrift.analysis.eqc import eqc_tables
from bitdrift.analysis.explain import (
    MISSING,
    attribute_table,
    class_table,
    device_attributes,
    explain_table,
    flag_groups,
    identify,
    informative,
    smallest_determining_set,
)
from bitdrift.cli import main
from bitdrift.errors import RecordError
from bitdrift.record.reader import open_records


def test_flag_groups_common_and_identical_presence():
    flags = [["avx", "sse", "fma", "avx512f"], ["avx", "sse", "fma"], ["sse", "avx512f"]]
    table, attributes = flag_groups(flags)
    groups = table.set_index("flag")["group"].to_dict()
    assert groups["sse"] == "C"  # on every device
    # avx and fma: present on devices 0 and 1 -> one group; avx512f: devices 0 and 2
    assert groups["avx"] == groups["fma"] and groups["avx512f"] != groups["avx"]
    assert groups["avx"] == "1" and groups["avx512f"] == "2"  # first appearance, sorted flags
    assert attributes == {"cpu.flags[avx512f]": [True, False, True],
                          "cpu.flags[avx+fma]": [True, True, False]}


def table_of(rows):
    return pd.DataFrame(rows, index=[f"d{i}" for i in range(len(rows))]).astype(str)


def test_one_attribute_determines_the_classes():
    table = table_of([{"threads": 1, "backend": "tf", "host": "a"},
                      {"threads": 2, "backend": "tf", "host": "b"},
                      {"threads": 1, "backend": "torch", "host": "c"},
                      {"threads": 2, "backend": "torch", "host": "d"}])
    explanation = smallest_determining_set(table, [1, 2, 1, 2])
    assert explanation.attributes == ["threads"] and explanation.determined
    assert explanation.search == "exact" and explanation.unexplained == []
    # `host` determines too (a value per device) but splits into 4 groups, not 2
    assert "host" in informative(table) and not explanation.weak
    assert explanation.alternatives == [["host"]]


def test_a_name_per_device_is_the_answer_when_it_is_one():
    """11 GPUs (Table SUP-2's shape): each device its own name, compute capability shared
    by devices of different classes. The name determines every class; marked weak, since
    each name is seen once."""
    capability = ["7.0", "7.0", "7.5", "7.5", "8.0", "8.0", "8.0", "8.6", "8.6", "8.9", "9.0"]
    classes = [1, 2, 3, 3, 4, 5, 4, 6, 7, 8, 8]
    table = table_of([{"accelerator.gpu_name": f"GPU-{i}", "accelerator.compute_capability":
                       cc} for i, cc in enumerate(capability)])
    explanation = smallest_determining_set(table, classes)
    assert explanation.attributes == ["accelerator.gpu_name"]
    assert explanation.determined and explanation.weak


def test_threads_alone_when_each_device_has_its_own_count():
    table = table_of([{"threads": t, "isa": isa} for t, isa in
                      [(1, "avx"), (2, "avx"), (4, "sse"), (8, "sse")]])
    explanation = smallest_determining_set(table, [1, 2, 3, 4])
    assert explanation.attributes == ["threads"] and explanation.weak


def test_confounded_attributes_are_named_together():
    """backend, the torch version and torch's mkldnn flag split the devices identically:
    one is chosen, the others listed as confounded with it, not offered as alternatives."""
    table = table_of([{"backend": b, "versions.torch": v, "versions.torch_mkldnn": m,
                       "threads": t} for b, v, m, t in
                      [("tf", "missing", "missing", 1), ("tf", "missing", "missing", 2),
                       ("torch", "2.13", "true", 1), ("torch", "2.13", "true", 2)]])
    explanation = smallest_determining_set(table, [1, 1, 2, 2])
    assert explanation.attributes == ["backend"]
    assert explanation.confounded == {"backend": ["versions.torch", "versions.torch_mkldnn"]}
    assert explanation.alternatives == [] and not explanation.weak


def test_only_two_attributes_together_determine():
    # class = threads XOR isa: neither alone separates the classes
    table = table_of([{"threads": 1, "isa": "avx"}, {"threads": 2, "isa": "avx"},
                      {"threads": 1, "isa": "sse"}, {"threads": 2, "isa": "sse"},
                      {"threads": 1, "isa": "avx"}])
    explanation = smallest_determining_set(table, [1, 2, 2, 1, 1])
    assert explanation.attributes == ["threads", "isa"] or \
        sorted(explanation.attributes) == ["isa", "threads"]
    assert explanation.determined


def test_among_equal_sizes_the_fewest_groups_wins():
    # both `a` and `b` separate the classes; `b` splits class 1 further (3 groups vs 2)
    table = table_of([{"a": "x", "b": "p"}, {"a": "x", "b": "q"}, {"a": "y", "b": "r"},
                      {"a": "y", "b": "r"}, {"a": "x", "b": "p"}])
    assert smallest_determining_set(table, [1, 1, 2, 2, 1]).attributes == ["a"]


def test_undetermined_when_identical_devices_differ():
    table = table_of([{"threads": 1}, {"threads": 1}, {"threads": 2}])
    explanation = smallest_determining_set(table, [1, 2, 3])
    assert not explanation.determined
    assert explanation.unexplained == ["d0", "d1"]
    assert explanation.attributes == ["threads"]  # still separates what it can


def test_greedy_beyond_the_time_budget():
    table = table_of([{"a": 1, "b": 1}, {"a": 2, "b": 1}, {"a": 1, "b": 2}])
    explanation = smallest_determining_set(table, [1, 2, 3], time_budget=-1)
    assert explanation.search == "greedy" and set(explanation.attributes) == {"a", "b"}


A = np.array([1.0, 2.0, 3.0], np.float32)
B = np.array([1.0, 2.0, 3.0000002], np.float32)
C = np.array([1.0, 2.0000002, 3.0], np.float32)


def test_records_without_fingerprint_keys(make_record):
    bare = make_record("bare", {0: A[None]}, fingerprint={})
    attributes, flags = device_attributes(open_records([bare])[0])
    assert attributes["cpu.count"] == MISSING and attributes["threads"] == MISSING
    assert attributes["backend"] == "tensorflow" and flags == []


def fingerprint(flags, count, threads, env=None):
    return {"cpu": {"flags": flags, "count": count, "brand": "EPYC", "vendor": "AMD"},
            "threads": threads, "environment": env or {}, "versions": {"keras": "3"}}


def test_explain_names_the_attributes_of_hand_built_devices(make_record, tmp_path):
    devices = [("t1", A, 1, None), ("t2", B, 2, None), ("t2b", B, 2, None),
               ("sse", A, 2, {"ONEDNN_MAX_CPU_ISA": "SSE41"})]
    files = [make_record(name, {0: output[None]},
                         fingerprint=fingerprint(["sse", "avx"], 2, threads, env))
             for name, output, threads, env in devices]
    explain, flags, classes = explain_table(open_records(files))
    row = explain.iloc[0]
    assert row["n_eqc"] == 2 and row["determined"]
    assert row["attributes"] in ("threads;env.ONEDNN_MAX_CPU_ISA", "threads")
    assert set(flags["group"]) == {"C"}
    assert classes.set_index("device").loc["t2", "device_class"] == \
        classes.set_index("device").loc["t2b", "device_class"]
    out = tmp_path / "explain.csv"
    assert main(["explain", *map(str, files), "--out", str(out), "--flags-out",
                 str(tmp_path / "f.csv"), "--classes-out", str(tmp_path / "c.csv")]) == 0
    assert pd.read_csv(out)["determined"].all()


def layered(values):
    return [(name, np.asarray(value)[None]) for name, value in values]


def test_first_divergent_layer_on_hand_built_records(make_record):
    same = np.array([0.5, 0.25], np.float32)
    other = np.array([0.5, np.nextafter(np.float32(0.25), np.float32(1))], np.float32)
    files = [
        make_record("a", {0: A[None]}, layers={0: layered([("conv", same), ("relu", same)])}),
        make_record("b", {0: B[None]}, layers={0: layered([("conv", same), ("relu", other)])}),
        make_record("c", {0: A[None]}, layers={0: layered([("conv", other), ("relu", same)])}),
    ]
    table = divergence_table(open_records(files))
    classes = table[table["class_a"] != table["class_b"]].iloc[0]
    assert (classes["device_a"], classes["device_b"]) == ("a", "b")
    assert classes["first_layer"] == "relu" and classes["previous_layer"] == "conv"
    assert classes["remaining_precision_at_first"] == 23 - 1  # last mantissa bit
    against_first = table.set_index("device_b").loc["c"]  # same final class, other conv
    assert against_first["first_layer"] == "conv" and against_first["first_position"] == 0
    assert against_first["rejoins_at"] == "relu"  # parted at conv, equal again after it
    assert classes["rejoins_at"] == "" or pd.isna(classes["rejoins_at"])
    # agrees with the per-layer classes
    _, layers = eqc_tables(open_records(files))
    apart = pairs_apart(layers).set_index("layer")
    assert apart.loc["conv", "share_apart"] == pytest.approx(2 / 3)
    assert apart.loc["output", "share_apart_so_far"] == 1.0


def test_each_class_pair_is_counted_once(make_record, tmp_path):
    """Devices a (class A), b and c (class B, apart from b at conv), d (class C), on two
    samples: the table compares the classes' first devices (a-b, a-d, b-d) and every
    device against a, so a-c meets classes A and B a second time. By hand: 3 distinct
    class pairs per sample, 6 in all; the findings count those, not the table's rows."""
    from bitdrift.analysis.divergence import class_pairs
    from bitdrift.report.findings.divergence import divergence as divergence_lines

    base = np.array([0.5, 0.25], np.float32)
    apart = np.array([0.5, 0.75], np.float32)
    third = np.array([0.125, 0.75], np.float32)
    other = np.array([1.0, 2.0, 4.0], np.float32)  # class C
    devices = [("a", A, base, base), ("b", B, base, apart), ("c", B, apart, apart),
               ("d", other, third, third)]
    files = [make_record(name, {0: output[None], 1: output[None]},
                         layers={sample: layered([("conv", conv), ("dense", dense)])
                                 for sample in (0, 1)})
             for name, output, conv, dense in devices]
    table = divergence_table(open_records(files))
    parted = table[(table["class_a"] != table["class_b"]) & (table["first_layer"] != "")]
    assert len(parted) == 8  # a-b, a-d, b-d, a-c on each sample: a-c repeats A-B
    distinct = class_pairs(table)
    assert len(distinct) == 6
    assert set(zip(distinct["device_a"], distinct["device_b"], strict=True)) == \
        {("a", "b"), ("a", "d"), ("b", "d")}  # the classes' first devices
    (line,) = [line for line in divergence_lines(table, pd.DataFrame())
               if "first divergences" in line]
    assert line.startswith("net: of 6 (class pair, sample) first divergences, ")
    write = tmp_path / "divergence.csv"
    table.to_csv(write, index=False)
    assert len(class_pairs(pd.read_csv(write))) == 6  # read back: empty layers are NaN


def test_divergence_compares_within_a_precision(make_record):
    """Two float32 devices and two float64 ones: only same-format pairs are compared (a
    float32 and a float64 output differ at every layer by construction)."""
    same32 = np.array([0.5, 0.25], np.float32)
    other32 = np.array([0.5, 0.75], np.float32)
    same64 = same32.astype(np.float64)
    files = [
        make_record("a32", {0: A[None]}, layers={0: layered([("conv", same32)])}),
        make_record("b32", {0: B[None]}, layers={0: layered([("conv", other32)])}),
        make_record("a64", {0: A.astype(np.float64)[None]},
                    layers={0: layered([("conv", same64)])}, precision="float64"),
        make_record("b64", {0: A.astype(np.float64)[None]},
                    layers={0: layered([("conv", same64)])}, precision="float64"),
    ]
    table = divergence_table(open_records(files))
    pairs = {(row.device_a, row.device_b) for row in table.itertuples()}
    assert pairs == {("a32", "b32"), ("a64", "b64")}
    assert set(table["precision"]) == {"float32", "float64"}
    _, layers = eqc_tables(open_records(files))
    apart = pairs_apart(layers).set_index(["precision", "layer"])
    # 6 pairs in all, 2 within a format: 4 cross-format pairs counted, not compared
    assert set(apart["cross_format_pairs"]) == {4}
    assert apart.loc[("float32", "conv"), "share_apart"] == 1.0  # its one pair differs
    assert apart.loc[("float64", "conv"), "share_apart"] == 0.0  # identical
    assert apart.loc[("float64", "conv"), "n_pairs"] == 1


def test_a_record_without_layers_says_so(make_record):
    files = [make_record("a", {0: A[None]}), make_record("b", {0: B[None]})]
    row = divergence_table(open_records(files)).iloc[0]
    assert row["first_layer"] == "" or pd.isna(row["first_layer"])
    assert row["note"] == "no layers recorded"


def test_identify_matched_and_unmatched(make_record, tmp_path):
    four_ulps = np.array([1.0, 2.0, 3.0], np.float32)
    four_ulps.view(np.uint32)[2] += 4
    known = [make_record("t1", {0: A[None], 1: A[None]}, fingerprint=fingerprint([], 2, 1)),
             make_record("t2", {0: four_ulps[None], 1: A[None]},
                         fingerprint=fingerprint([], 2, 2)),
             make_record("t3", {0: A[None], 1: A[None]}, fingerprint=fingerprint([], 2, 1))]
    # t1's result, renamed and with its device attribute changed
    sent = tmp_path / "sent.h5"
    sent.write_bytes(known[0].read_bytes())
    with h5py.File(sent, "r+") as handle:
        handle.attrs["device"] = "unknown"
    found = identify(*open_records([sent]), open_records(known))
    assert found.matched and found.devices == ["t1", "t3"]
    assert found.shared.get("threads") == "1"
    assert main(["identify", str(sent), "--against", *map(str, known)]) == 0
    close = B  # one ulp from t1 and t3 (RP 22), bits 001 vs 100 from t2 (RP 20)
    stranger = make_record("x", {0: close[None], 1: A[None]}, fingerprint=fingerprint([], 8, 4))
    found = identify(*open_records([stranger]), open_records(known))
    assert not found.matched and found.nearest == ["t1", "t3"]
    assert found.remaining_precision == 22
    assert found.nearest_classes == [({0: 1, 1: 1}, ["t1", "t3"])]
    assert main(["identify", str(stranger), "--against", *map(str, known)]) == 1


def test_identify_refuses_a_record_of_another_model(make_record, tmp_path, capsys):
    known = [make_record("t1", {0: A[None]}), make_record("t2", {0: B[None]})]
    other = make_record("relabelled", {0: A[None]}, model_sha256="o" * 64)
    with pytest.raises(RecordError, match="model_sha256 oooooooooooo... differs"):
        identify(*open_records([other]), open_records(known))
    assert main(["identify", str(other), "--against", *map(str, known)]) == 3
    assert "cannot be identified" in capsys.readouterr().err
    inputs = make_record("other_inputs", {0: A[None]}, input_sha256="x" * 64)
    assert main(["identify", str(inputs), "--against", *map(str, known)]) == 3


def test_identify_numbers_classes_as_eqc_csv_and_lists_ties(make_record, tmp_path, capsys):
    """Both classes share all but the last two bits with the query (its bits end 00, theirs
    10 and 11): they tie and both are named. With eqc.csv the numbers are its own (here
    the reverse of the order given)."""
    middle = np.array([1.0, 2.0, 3.0], np.float32)
    low, high = middle.copy(), middle.copy()
    low.view(np.uint32)[0] += 2
    high.view(np.uint32)[0] += 3
    known = [make_record("lo", {0: low[None]}), make_record("hi", {0: high[None]})]
    query = make_record("q", {0: middle[None]})
    found = identify(*open_records([query]), open_records(known))
    assert not found.matched and len(found.nearest_classes) == 2
    eqc = pd.DataFrame({"model": "net", "sample": 0, "device": ["hi", "lo"], "eqc": [1, 2]})
    found = identify(*open_records([query]), open_records(known), eqc)
    assert sorted(found.nearest_classes, key=lambda item: item[1]) == [
        ({0: 1}, ["hi"]), ({0: 2}, ["lo"])]
    match = identify(*open_records([known[0]]), open_records(known), eqc)
    assert match.matched and match.classes == {0: 2}


def test_class_table_sorts_by_device_class_and_marks_noise(make_record):
    files = [make_record("t1", {0: A[None]}), make_record("t2", {0: np.stack([A, B])}),
             make_record("t3", {0: A[None]})]
    records = open_records(files)
    eqc, _ = eqc_tables(records)
    classes = pd.DataFrame({"model": "net", "device": ["t1", "t2", "t3"],
                            "device_class": [2, 1, 2]})
    table = class_table(records, eqc, classes)
    # the settings group is named as such, never a class: equivalence classes are numbers
    # of the model#sample columns
    assert "settings_group" in table and "device_class" not in table
    assert table["settings_group"].tolist() == [1, 2, 2]
    assert table["device"].tolist() == ["t2", "t1", "t3"]
    assert table.loc[0, "net#0"] == "1*"  # non-deterministic


def test_a_framework_the_device_did_not_use_is_no_attribute(make_record):
    """A torch process that loaded TensorFlow on the side listed its version; that version
    did not compute the result."""
    loaded = {**fingerprint([], 2, 1), "versions": {"keras": "3", "tensorflow": "2.21",
                                                    "tensorflow_onednn": "default",
                                                    "torch": "2.13", "torch_mkldnn": True}}
    torch_record = make_record("pt", {0: A[None]}, backend="torch", fingerprint=loaded)
    tf_record = make_record("tf", {0: A[None]}, backend="tensorflow", fingerprint=loaded)
    torch_attributes, _ = device_attributes(open_records([torch_record])[0])
    tf_attributes, _ = device_attributes(open_records([tf_record])[0])
    assert "versions.tensorflow" not in torch_attributes
    assert "versions.tensorflow_onednn" not in torch_attributes
    assert torch_attributes["versions.torch"] == "2.13"
    assert "versions.torch" not in tf_attributes and tf_attributes["versions.tensorflow"] == "2.21"


def test_explain_names_nondeterministic_devices(make_record, tmp_path):
    files = [make_record("a", {0: A[None]}, fingerprint=fingerprint([], 2, 1)),
             make_record("noisy", {0: np.stack([B, A, B])}, fingerprint=fingerprint([], 2, 2)),
             make_record("c", {0: B[None]}, fingerprint=fingerprint([], 2, 2))]
    explain, _, _ = explain_table(open_records(files))
    row = explain.iloc[0]
    assert row["nondeterministic_devices"] == "noisy"
    assert row["attributes"] == "threads" and row["n_eqc"] == 2  # noisy: its majority, B


def test_attribute_table_reads_environment_and_versions(make_record):
    record = make_record("e", {0: A[None]},
                         fingerprint=fingerprint(["avx"], 4, 2, {"OMP": "1"}))
    table, _ = attribute_table(open_records([record]))
    assert table.loc["e", "env.OMP"] == "1" and table.loc["e", "versions.keras"] == "3"
    assert json.loads(json.dumps(table.loc["e"].to_dict()))  # plain strings


def test_the_divergence_figure_of_a_model_with_a_compiled_device_shows_its_layers(
        make_record, tmp_path):
    """A non-Keras model (a .pt2 program's module paths) on three eager devices that
    record ``fc`` and ``act`` and one compiled device that records the final output alone
    (as Inductor does): the layers common to all are the final output alone, yet the
    figure's ticks are the eager devices' layers, its "first layer" is ``fc`` where
    they part (found here by numpy), as the findings say, and the compiled device is
    named as left out. Before, the figure showed one tick, ``output``, "100% of pairs
    already differ at the first layer (output)"."""
    from bitdrift.report.figures.divergence import plot_divergence
    from bitdrift.report.findings.divergence import divergence as divergence_lines

    fc = np.array([0.5, 0.25], np.float32)
    fc_other = np.array([0.5, np.nextafter(np.float32(0.25), np.float32(1))], np.float32)
    act = np.maximum(fc, 0)
    eager = {"eager_1t": (A, fc), "eager_2t": (A, fc), "ort": (B, fc_other)}
    files = [make_record(device, {0: output[None]},
                         layers={0: layered([("fc", values), ("act", np.maximum(values, 0))])})
             for device, (output, values) in eager.items()]
    files.append(make_record("inductor", {0: C[None]}))
    assert act.tobytes() != np.maximum(fc_other, 0).tobytes()
    records = open_records(files)
    table = divergence_table(records)
    first = {row.first_layer for row in class_pairs_of(table)
             if "inductor" not in (row.device_a, row.device_b)}
    assert first == {"fc"}  # ort against the eager class, at fc
    assert "1 at `fc`" in divergence_lines(table, pd.DataFrame())[0]
    _, layers = eqc_tables(records)
    assert set(layers[layers["device"] == "inductor"]["layer"]) == {"output"}
    assert list(layers[layers["device"] == "ort"]["layer"]) == ["fc", "act", "output"]
    apart = pairs_apart(layers)
    assert set(apart["left_out_devices"]) == {"inductor"}
    assert set(apart["n_pairs"]) == {3}  # the eager devices' pairs
    figure = plot_divergence(apart, pd.DataFrame(columns=["model", "layer", "layer_class"]),
                             tmp_path / "divergence.pdf")
    ax = figure.axes[0]
    assert [tick.get_text() for tick in ax.get_xticklabels()] == ["fc", "act", "output"]
    said = " ".join(text.get_text() for text in ax.texts).replace("\n", " ")
    assert "first layer (fc)" in said and "(output)" not in said
    assert "inductor" in ax.get_title(loc="left")
    assert (tmp_path / "divergence.png").is_file()


def class_pairs_of(table):
    from bitdrift.analysis.divergence import class_pairs

    return list(class_pairs(table).itertuples())


def test_a_divergence_panel_of_the_final_output_alone_says_no_layer_is_known(make_record,
                                                                            tmp_path):
    """Two devices of which one records the final output alone (an eager device beside
    Inductor): divergence.csv says "no layers recorded", and the figure's panel says so,
    not that the pairs part at a first layer called ``output``."""
    from bitdrift.report.figures.divergence import plot_divergence

    files = [make_record("eager", {0: A[None]}, layers={0: layered([("fc", A)])}),
             make_record("inductor", {0: B[None]})]
    records = open_records(files)
    (row,) = divergence_table(records).itertuples()
    assert row.note == "no layers recorded"
    _, layers = eqc_tables(records)
    figure = plot_divergence(pairs_apart(layers),
                             pd.DataFrame(columns=["model", "layer", "layer_class"]),
                             tmp_path / "divergence.pdf")
    said = " ".join(text.get_text() for text in figure.axes[0].texts).replace("\n", " ")
    assert "where they part is not known" in said and "first layer" not in said
