"""Findings are generated from the tables: hand-built tables whose answers are known."""

import pandas as pd

from bitdrift.report.findings import findings
from bitdrift.report.findings.document import markdown, restructured_text
from bitdrift.report.findings.machine import machine

# Four float32 devices over two samples: a and b agree on both, c apart on both, d joins c
# on sample 1 only; one bfloat16 device.
EQC = [("a", 0, 1), ("b", 0, 1), ("c", 0, 2), ("d", 0, 3), ("e", 0, 1),
       ("a", 1, 1), ("b", 1, 1), ("c", 1, 2), ("d", 1, 2), ("e", 1, 1)]
PRECISION = {"a": "float32", "b": "float32", "c": "float32", "d": "float32", "e": "bfloat16"}


def _tables(tmp_path, failed=True):
    eqc = pd.DataFrame([{"model": "m", "sample": sample, "device": device, "eqc": eqc,
                         "deterministic": True, "distinct_outputs": 1, "majority_count": 2}
                        for device, sample, eqc in EQC])
    layers = pd.DataFrame([{"model": "m", "sample": 0, "layer": "dense", "device": device,
                            "precision": precision} for device, precision in PRECISION.items()])
    effective = pd.DataFrame([
        {"model": "m", "device": "c", "precision": "float32", "layer": "conv",
         "reduced": True, "format": "bfloat16", "effective_bits": 7.6},
        {"model": "m", "device": "c", "precision": "float32", "layer": "dense",
         "reduced": False, "format": "float32", "effective_bits": 22.0},
        {"model": "m", "device": "a", "precision": "float32", "layer": "conv",
         "reduced": False, "format": "float32", "effective_bits": 23.0}])
    failures = pd.DataFrame([{"model": "m", "device": "ov_gpu", "backend": "openvino",
                              "reason": "asks for a GPU", "log": "logs/x.log"}] if failed
                            else [], columns=["model", "device", "backend", "reason", "log"])
    paths = {}
    for name, table in (("eqc", eqc), ("eqc_layers", layers), ("effective_precision",
                                                               effective),
                        ("device_failures", failures)):
        paths[name] = tmp_path / f"{name}.csv"
        table.to_csv(paths[name], index=False)
    return paths


FINGERPRINT = {"platform": "Linux", "cpu": {
    "brand": "Test CPU", "vendor": "GenuineIntel", "family": 6, "model": 1, "count": 2,
    "arch": "X86_64", "flags": ["sse4_1", "avx", "avx2", "fma", "avx512f", "avx512_bf16"]}}


HASWELL = {"cpu": {"brand": "Intel Core Processor (Haswell)", "flags": ["avx", "avx2", "fma"]},
           "emulation": {"model": "Haswell-v4", "qemu": "7.2"}}


def _sentences(items) -> list[str]:
    """A section's sentences (its items that are not tables)."""
    return [item for item in items if isinstance(item, str)]


def _frames(items) -> list[pd.DataFrame]:
    return [item for item in items if isinstance(item, pd.DataFrame)]


def test_findings_say_what_the_tables_hold(tmp_path):
    sections = dict(findings(_tables(tmp_path), {"a": FINGERPRINT, "haswell": HASWELL}))
    classes = _sentences(sections["Equivalence classes"])
    # sample 0: {a, b}, c, d -> 3 classes; sample 1: {a, b}, {c, d} -> 2
    assert "m, float32: 3/2 classes among 4 float32 devices on test samples #0, #1 (final " \
        "output)." in classes
    # the devices identical on every sample: a table, a group a row
    (identical,) = _frames(sections["Equivalence classes"])
    assert identical.to_dict("records") == [
        {"precision": "float32", "on every sample": "2 devices, identical", "devices": "a, b"},
        {"precision": "float32", "on every sample": "each in a class of its own",
         "devices": "c, d"}]
    assert any(line.startswith("m, bfloat16: 1/1 classes among 1 bfloat16 device ")
               for line in classes)
    (reduced,) = sections["Devices computing below their declared format"]
    assert reduced.startswith("c (m) declares float32 but computes bfloat16-like: 7.6 "
                              "effective bits at worst, in 1 of 2 checked layers (conv)")
    assert sections["Devices that failed"] == ["ov_gpu (m): asks for a GPU (log: logs/x.log)"]
    assert "Devices that ran: 5; failed: 1." in sections["Machine"]
    assert "Emulated by QEMU 7.2 as Haswell-v4 (Intel Core Processor (Haswell); it saw AVX, " \
        "AVX2, FMA): haswell." in sections["Machine"]
    assert "Test CPU" in sections["Machine"][0]  # the machine is the native record's
    text = markdown(findings(_tables(tmp_path), {"a": FINGERPRINT, "haswell": HASWELL}))
    assert text.startswith("# Findings on this machine") and "## Devices that failed" in text


def test_the_machine_is_named_with_the_instruction_sets_it_has_and_lacks():
    lines = machine(FINGERPRINT)
    assert "Test CPU" in lines[0]
    assert lines[1] == ("Instruction sets that steer the kernels: SSE4.1, AVX, AVX2, FMA, "
                        "AVX-512, AVX512_BF16; not present: AVX512_VNNI, AVX512_FP16, AMX.")


def test_the_fingerprints_are_those_of_the_records_that_ran(make_record, tmp_path):
    """findings.fingerprints reads each record's root attributes through the record
    package: the first record of a device gives its fingerprint; failure records, files
    that are missing or not HDF5, a record without a fingerprint, one whose fingerprint is
    not JSON and an empty one are left out; a fingerprint of the wrong shape is refused,
    naming its file."""
    import re

    import h5py
    import numpy as np
    import pytest

    from bitdrift.errors import RecordError
    from bitdrift.record.writer import write_failure
    from bitdrift.report.findings.document import fingerprints

    output = {0: np.ones((1, 3), np.float32)}
    native = make_record("a", output, fingerprint=FINGERPRINT)
    again = make_record("a", output, model="other", fingerprint=HASWELL)  # a's second
    emulated = make_record("haswell", output, fingerprint=HASWELL)
    failed = tmp_path / "failed.h5"
    write_failure(failed, {"model": "net", "device": "ov_gpu"}, "asks for a GPU")
    not_hdf5 = tmp_path / "not_hdf5.h5"
    not_hdf5.write_text("a log, not a record")
    unfingerprinted, not_json, empty = (make_record(device, output, model=device)
                                        for device in ("bare", "garbled", "empty"))
    with h5py.File(unfingerprinted, "r+") as handle:
        del handle.attrs["fingerprint"]
    with h5py.File(not_json, "r+") as handle:
        handle.attrs["fingerprint"] = "{not json"
    with h5py.File(empty, "r+") as handle:
        handle.attrs["fingerprint"] = "null"
    found = fingerprints([failed, tmp_path / "missing.h5", not_hdf5, native, again,
                          emulated, unfingerprinted, not_json, empty])
    assert found == {"a": FINGERPRINT, "haswell": HASWELL}
    wrong = make_record("wrong", output, fingerprint={"cpu": {"flags": "avx2 fma"}})
    with pytest.raises(RecordError, match=f"^{re.escape(str(wrong))}: root attribute "
                       "'fingerprint': 'cpu.flags' is a string, not a list$"):
        fingerprints([native, wrong])


def test_no_failure_and_the_report_text_is_valid_rest(tmp_path):
    from docutils.core import publish_parts
    from docutils.utils import Reporter

    sections = findings(_tables(tmp_path, failed=False), {"a": FINGERPRINT})
    assert dict(sections)["Devices that failed"] == ["None: every scheduled device ran."]
    html = publish_parts(restructured_text(sections), writer="html",
                         settings_overrides={"halt_level": Reporter.WARNING_LEVEL})["body"]
    assert "Findings on this machine" in html or "Machine" in html


def test_devices_left_out_and_a_lone_device_are_said_and_nothing_else_changes(tmp_path):
    """Issue 63: findings said 'Devices that ran: 1; failed: 0' and '1/1 classes among 1
    devices' of a model whose other devices' runtimes cannot run its format. The plan's
    notes (bitdrift.plan.Plan.device_plan) are said in the Machine section and before the
    classes; without notes the text is the same, byte for byte."""
    planned = {"m": {"devices": ["a"], "format": "a LiteRT .tflite flatbuffer",
                     "skipped": {"tensorflow": ["tf_1", "tf_2"], "torch": ["torch_1"]}},
               "n": {"devices": ["a", "b"], "format": "an ONNX model",
                     "skipped": {"tensorflow": ["tf_1"]}},
               "o": {"devices": ["a"], "format": "an ONNX model", "skipped": {}}}
    plain = findings(_tables(tmp_path), {"a": FINGERPRINT})
    noted = dict(findings(_tables(tmp_path), {"a": FINGERPRINT}, planned=planned))
    assert noted["Machine"] == dict(plain)["Machine"] + [
        "Skipped for model m: tensorflow, torch cannot run a LiteRT .tflite flatbuffer "
        "(devices tf_1, tf_2, torch_1).",
        "Skipped for model n: tensorflow cannot run an ONNX model (device tf_1)."]
    assert noted["Equivalence classes"][:2] == [
        "Only one device runs model m (a): nothing to compare.",
        "Only one device runs model o (a): nothing to compare."]
    # the rest as without the notes (its table compared as the text it renders)
    assert markdown([("classes", noted["Equivalence classes"][2:])]) \
        == markdown([("classes", dict(plain)["Equivalence classes"])])
    assert markdown(findings(_tables(tmp_path), {"a": FINGERPRINT}, planned={})) \
        == markdown(plain)


def test_the_replay_count_leaves_out_what_was_not_revealed_or_replayed():
    """Five Dense layers by hand: two reproduced, one that differs, one whose order was not
    revealed, one not replayed (float64): "2 of the 3", and each device's cell says its
    order and the replay's verdict."""
    from bitdrift.report.findings.orders import ORDERS_LEGEND, orders

    table = pd.DataFrame({
        "model": ["m"] * 5, "device": ["a", "b", "c", "d", "e"], "layer": ["dense"] * 5,
        "terms": [11, 11, 11, "", 11],
        "order": ["sequential, bias last"] * 3 + ["not revealed", "sequential, bias last"],
        "replay": ["bit-identical with FMA", "bit-identical without FMA",
                   "differs: 3 of 10 values bit-identical at best (with FMA)",
                   "the runtime computes in bfloat16", "not replayed: float64"]})
    count, legend, grid = orders(table)
    assert "gives the record's bits for 2 of the 3 (device, layer) pairs it replayed (1 with " \
        "no revealed order, 1 not replayed)." in count
    assert legend == ORDERS_LEGEND
    assert grid.to_dict("list") == {
        "device": ["a", "b", "c", "d", "e"],
        "dense (11 terms)": ["sequential, bias last: same, FMA",
                             "sequential, bias last: same, no FMA",
                             "sequential, bias last: 3/10 values",
                             "not revealed (the runtime computes in bfloat16)",
                             "sequential, bias last: not run (float64)"]}


def test_the_fused_product_is_said_with_the_devices_that_fuse_it():
    """accumulation_orders.csv's fused_product: each device's cell names the product it
    fuses where two meet; ``either`` says the values do not tell; a table written before
    the column reads as before."""
    from bitdrift.report.findings.orders import orders

    table = pd.DataFrame({
        "model": ["m"] * 4, "device": ["a", "b", "c", "d"], "layer": ["dense"] * 4,
        "terms": [11] * 4, "order": ["sequential, bias last"] * 4,
        "replay": ["bit-identical with FMA"] * 3 + ["bit-identical without FMA"],
        "fused_product": ["lower index", "higher index", "either", None]})
    grid = orders(table)[-1]
    assert list(grid["dense (11 terms)"]) == [
        "sequential, bias last: same, FMA (lower index)",
        "sequential, bias last: same, FMA (higher index)",
        "sequential, bias last: same, FMA (either)",
        "sequential, bias last: same, no FMA"]
    assert list(orders(table.drop(columns="fused_product"))[-1]["dense (11 terms)"]) == \
        ["sequential, bias last: same, FMA"] * 3 + ["sequential, bias last: same, no FMA"]


def test_the_orders_table_has_a_row_per_device_and_a_column_per_layer():
    """Two devices at three layers, in orders of every kind: the table's rows are the
    devices, its columns the layers with their terms, each cell the order and the
    replay's verdict; an order by batch row is named as such, without its rows."""
    from bitdrift.report.findings.orders import orders

    rows = [("conv2d", 28, "t", "sequential, bias last", "bit-identical without FMA"),
            ("conv2d", 28, "u", "4 interleaved lanes, bias last", "bit-identical with FMA"),
            ("dense_1", 321, "t", "sequential, bias last", "bit-identical with FMA"),
            ("dense_1", 321, "u", "other (height 14), bias last",
             "differs: 383 of 384 values bit-identical at best (with FMA)"),
            ("dense_2", 129, "t", "blocks of 16, bias first", "not replayed: float16"),
            ("dense_2", 129, "u", "by batch row: rows 0-5: sequential, bias last; rows 6-7: "
             "2 interleaved lanes, bias last", "bit-identical with FMA")]
    table = pd.DataFrame([{"model": "m", "layer": layer, "terms": terms, "device": device,
                           "order": order, "replay": replay}
                          for layer, terms, device, order, replay in rows])
    grid = orders(table)[-1]
    assert list(grid.columns) == ["device", "conv2d (28 terms)", "dense_1 (321 terms)",
                                  "dense_2 (129 terms)"]
    assert grid.set_index("device").to_dict("index") == {
        "t": {"conv2d (28 terms)": "sequential, bias last: same, no FMA",
              "dense_1 (321 terms)": "sequential, bias last: same, FMA",
              "dense_2 (129 terms)": "blocks of 16, bias first: not run (float16)"},
        "u": {"conv2d (28 terms)": "4 interleaved lanes, bias last: same, FMA",
              "dense_1 (321 terms)": "other (height 14), bias last: 383/384 values",
              "dense_2 (129 terms)": "varies by batch row: same, FMA"}}


def test_a_tie_at_the_fewest_agreeing_labels_is_named_as_a_tie():
    """Predicted labels against TensorFlow's: two devices tied at the fewest (358 of 359),
    one agreeing on all; and a table where every device agrees on all says so, with no
    "lowest" device picked from a tie of everyone."""
    from bitdrift.report.findings.classes import agreement

    table = pd.DataFrame({"model": ["m"] * 4, "device": ["tf", "a", "b", "c"],
                          "images": [None, 359, 359, 359],
                          "agreeing": [None, 358, 359, 358],
                          "share": ["reference", 358 / 359, 1.0, 358 / 359]})
    assert agreement(table) == [
        "m: of 3 checked devices, 1 predict TensorFlow's (float32) label on each of the 359 "
        "test images; the fewest agreeing labels are 358 of 359 (99.7%), by a and c (2 tied)."]
    everyone = table.assign(agreeing=[None, 359, 359, 359],
                            share=["reference", 1.0, 1.0, 1.0])
    assert agreement(everyone) == ["m: all 3 checked devices predict TensorFlow's (float32) "
                                   "label on each of the 359 test images."]


def test_the_dendrogram_caption_reads_the_axis_as_the_figure_draws_it(make_record, tmp_path,
                                                                     monkeypatch):
    """Two devices bit-identical, a third apart in its last mantissa bits: in the EQC
    figure the identical pair joins at the remaining precision float32 has in full (23
    bits), at the right edge of the dendrogram, and the ticks fall towards the left;
    the caption must say the same."""
    import numpy as np

    from bitdrift.analysis.eqc import eqc_tables
    from bitdrift.record.reader import open_records
    from bitdrift.report.figures import eqc as figures
    from bitdrift.report.findings.document import FIGURE_CAPTION

    near = np.array([1.0, 2.0, 3.0], np.float32)
    apart = near.copy()
    apart[2] = np.nextafter(np.nextafter(apart[2], np.float32(4)), np.float32(4))
    files = [make_record(device, {0: np.stack([values])})
             for device, values in (("d1", near), ("d2", near), ("d3", apart))]
    drawn = []
    monkeypatch.setattr(figures, "save_figure", lambda figure, out, **_: drawn.append(figure))
    records = open_records([str(path) for path in files])
    eqc = pd.DataFrame(eqc_tables(records)[0])
    figures.plot_eqc(eqc, records, tmp_path / "eqc.pdf")
    (axes,) = [ax for ax in drawn[0].axes if "remaining precision" in ax.get_xlabel()]
    ticks = {label.get_text(): position
             for position, label in zip(axes.get_xticks(), axes.get_xticklabels(), strict=True)}
    to_screen = axes.transData.transform
    screen = {bits: to_screen((position, 0))[0] for bits, position in ticks.items()}
    left, right = axes.get_window_extent().x0, axes.get_window_extent().x1
    assert abs(screen["23"] - right) < abs(screen["23"] - left)  # 23 bits: the right edge
    ordered = sorted(screen, key=screen.get)
    assert [int(bits) for bits in ordered] == sorted(int(bits) for bits in ordered)
    # the pair's link: the segment drawn at distance 0, i.e. at 23 bits
    joins = [line.get_xdata() for line in axes.lines] + [
        np.asarray(path.vertices)[:, 0] for collection in axes.collections
        for path in collection.get_paths()]
    assert any(np.isclose(min(x), 0) for x in joins if len(x))
    assert "bit-identical devices join at the format's full mantissa (23 bits in float32), " \
        "at its right edge" in FIGURE_CAPTION
    assert "the further left two groups join, the fewer bits they share" in FIGURE_CAPTION


def test_the_eqc_figure_follows_the_classes_inline_in_the_report(tmp_path):
    """The report's first screen shows the EQC figure after the classes: docutils renders
    an <img> whose data URI decodes to the PNG's own bytes, between the classes and the
    next section; findings.md links it relative to itself."""
    import base64
    import re

    from docutils.core import publish_parts
    from docutils.utils import Reporter

    png = tmp_path / "figures" / "eqc.png"
    png.parent.mkdir()
    # larger than docutils' 10,000 characters a line: the base64 is wrapped
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64)
    sections = findings(_tables(tmp_path, failed=False), {"a": FINGERPRINT})
    html = publish_parts(restructured_text(sections, png), writer="html",
                         settings_overrides={"halt_level": Reporter.WARNING_LEVEL})["body"]
    (data,) = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert base64.b64decode("".join(data.split())) == png.read_bytes()
    assert html.index("Equivalence classes") < html.index("<img") < html.index(
        "Devices computing below")
    text = markdown(sections, png, tmp_path / "findings.md")
    assert "![equivalence classes](figures/eqc.png)" in text
    assert text.index("## Equivalence classes") < text.index("![") < text.index(
        "## Devices computing")


def test_kernel_pairs_tied_with_the_third_commonest_are_all_named():
    """Kernel pairs at the first divergent layer counted 3, 2, 1 and 1 by hand: the two
    tied third are both named, not one picked by the sort."""
    from bitdrift.report.findings.divergence import divergence

    counts = {("k1", "k2"): 3, ("k1", "k3"): 2, ("k2", "k3"): 1, ("k3", "k4"): 1}
    rows = [(a, b) for (a, b), count in counts.items() for _ in range(count)]
    # each row a class pair of its own (a sample each): every one counts once
    table = pd.DataFrame([{"model": "m", "sample": sample, "class_a": 1, "class_b": 2,
                           "first_layer": "conv", "kernels_differ": "yes", "kernels_a": a,
                           "kernels_b": b} for sample, (a, b) in enumerate(rows)])
    lines = divergence(table, pd.DataFrame())
    assert lines[1] == ("m: kernels at the first divergent layer, most often: `k1 vs k2` (3); "
                        "`k1 vs k3` (2); `k2 vs k3` (1); `k3 vs k4` (1).")


def test_an_explanation_says_when_it_is_weak_confounded_or_not_unique():
    """An explain row by hand: weak, its kernel attribute splitting the devices as two
    others do, two alternative sets; the sentences say each, in words (what splits the
    devices alike in a sentence of its own: a long list would make a long line)."""
    from bitdrift.report.findings.classes import explanations

    table = pd.DataFrame([{"model": "m", "sample": 0, "layer": "output", "attributes":
                           "threads;kernel.dense_1", "determined": True, "search": "exact",
                           "weak": True, "confounded": "kernel.dense_1=kernel.dense_2+order.d",
                           "alternatives": "threads;kernel.conv2d|backend;threads"}])
    assert explanations(table) == [
        "m, samples #0: the classes are determined by `threads`, `kernel.dense_1` (exact "
        "search; weak: a value of one of them only one device holds; 2 other sets do as "
        "well: explain.csv).",
        "m: `kernel.dense_1` splits the devices as `kernel.dense_2` and `order.d` do."]


def test_an_attribute_split_alike_by_dozens_of_long_names_stays_one_short_line():
    """Nine long per-layer kernels (fewer than the grouping's ten) split the devices as the
    explaining one: the line names those that fit in 300 characters, in order, and counts
    the rest."""
    from bitdrift.report.findings.classes import explanations

    others = [f"kernel./block/attention/Layer_{index}_output_0" for index in range(9)]
    table = pd.DataFrame([{"model": "m", "sample": 0, "layer": "output",
                           "attributes": "graph_optimization_level", "determined": True,
                           "search": "exact", "weak": False,
                           "confounded": "graph_optimization_level=" + "+".join(others),
                           "alternatives": ""}])
    line = explanations(table)[1]
    assert len(line) <= 300, line
    named = [other for other in others if f"`{other}`" in line]
    assert named == others[:len(named)] and 0 < len(named) < len(others)
    assert line.endswith(f"and {len(others) - len(named)} more (explain.csv) do.")


def test_an_order_that_varies_by_position_reads_as_words():
    """A layer whose pixels sum in two trees (a hand-built map: even columns one tree, odd
    columns the other, one pixel unknown): the sentence counts the trees, names the grid
    and the places searched, gives each tree's pixels as counted from the map, and leaves
    no table label."""
    import numpy as np

    from bitdrift.analysis.accumulation.names import order_name
    from bitdrift.analysis.accumulation.trees import from_flat
    from bitdrift.report.findings.orders import order_phrase

    # 4 products and the bias (term 4), as to_flat keeps them
    sequential = from_flat([[0, 1], [5, 2], [6, 3], [7, 4]], 5)
    pairwise = from_flat([[0, 1], [2, 3], [5, 6], [7, 4]], 5)
    maps = [["0101", "0101", "01.1"]]
    places = {"grid": [3, 4], "searched": [[0, 1, 1], [0, 1, 2]], "maps": maps}
    label = order_name([sequential, pairwise], places, bias=True)
    phrase = order_phrase(label)
    cells = np.array([list(line) for line in maps[0]])
    counts = {symbol: int((cells == symbol).sum()) for symbol in "01."}
    assert "varies by position" not in phrase and "height" not in phrase
    assert phrase.startswith("in an order that varies with the output position (2 trees")
    assert "searched at (1,1), (1,2) of the 3x4 grid" in phrase
    assert f"sequentially, in index order, the bias added last, over {counts['0']} pixels" \
        in phrase
    assert f"over {counts['1']} pixels" in phrase and "pairwise" in phrase
    assert f"the order is unknown at {counts['.']} pixels" in phrase


# -- a run at the size of issue 52: 100 samples, 30 devices, 50 Conv2D/Dense layers, 200+
# explaining attributes, tables in the columns the real ones have
# (a ResNet-50 run's results/tables: eqc.csv, explain.csv, accumulation_orders.csv, ...)
BIG_SAMPLES = list(range(100))
BIG_DEVICES = [f"{backend}_{variant}" for backend in ("tf", "torch", "ort")
               for variant in ("1thread", "2threads", "sse41", "avx", "no_onednn",
                               "batch8", "1thread_float16", "1thread_bfloat16",
                               "2threads_float64", "fast_math")]
BIG_LAYERS = [f"conv{stage}_block{block}_{index}_conv" for stage in (2, 3, 4, 5)
              for block in range(1, 7) for index in (1, 2, 3)][:49] + ["predictions"]
LONGEST = 300  # characters a line of findings.md may hold, whatever the run's size (issue 64)


def _big_eqc(counts: dict) -> pd.DataFrame:
    """eqc.csv's rows: on each sample the devices in ``counts[sample]`` classes."""
    return pd.DataFrame([{"model": "resnet50", "sample": sample, "device": device,
                          "eqc": index % counts[sample] + 1, "deterministic": True,
                          "distinct_outputs": 1, "majority_count": 10,
                          "effective_precision": "declared"}
                         for sample in BIG_SAMPLES
                         for index, device in enumerate(BIG_DEVICES)])


def _left_out(line: str) -> int:
    import re

    (more,) = re.findall(r"… and (\d+) more", line)
    return int(more)


def test_classes_on_100_samples_are_counted_not_listed():
    """The same number of classes on every sample is said once, with the number of
    samples; counts that vary: the range, the commonest with its number of samples, the
    rarer ones' samples (a few, and how many more); no line grows with the samples."""
    from bitdrift.report.findings.classes import classes
    from bitdrift.report.findings.text import SHOWN

    precisions = dict.fromkeys(BIG_DEVICES, "float32")
    eqc = _big_eqc(dict.fromkeys(BIG_SAMPLES, 3))
    samples = len(set(eqc["sample"]))
    line = classes(eqc, precisions)[0]
    assert line == (f"resnet50, float32: 3 classes among {len(BIG_DEVICES)} float32 devices "
                    "on each "
                    f"of the {samples} test samples (final output; each sample's classes, "
                    "device by device, in results/tables/eqc.csv).")
    # 2 classes on 12 samples, 4 on 3 (#5, #50, #95), 3 on the others
    counts = dict.fromkeys(BIG_SAMPLES, 3) | dict.fromkeys(range(20, 32), 2) | \
        dict.fromkeys((5, 50, 95), 4)
    eqc = _big_eqc(counts)
    lines = classes(eqc, precisions)
    # the truth from the rows: the set of classes each sample's devices fall in
    found = {sample: len(set(part["eqc"])) for sample, part in eqc.groupby("sample")}
    by_count = {n: sorted(s for s, c in found.items() if c == n) for n in set(found.values())}
    common = max(by_count, key=lambda n: len(by_count[n]))
    line = lines[0]
    assert len(line) < LONGEST
    assert line.startswith(f"resnet50, float32: {min(found.values())} to "
                           f"{max(found.values())} classes among {len(BIG_DEVICES)} float32 "
                           "devices "
                           f"over the {len(found)} test samples (final output): {common} on "
                           f"{len(by_count[common])} of them, ")
    two = by_count[2]
    assert f"2 on {len(two)} (" + ", ".join(f"#{s}" for s in two[:SHOWN]) + \
        f" … and {len(two) - SHOWN} more)" in line
    assert f"4 on 3 ({', '.join(f'#{s}' for s in by_count[4])})" in line
    assert line.endswith("; each sample's classes, device by device, in "
                         "results/tables/eqc.csv.")
    # three devices always together: named, with every other device
    together = _big_eqc(dict.fromkeys(BIG_SAMPLES, len(BIG_DEVICES)))
    together.loc[together["device"].isin(BIG_DEVICES[1:3]), "eqc"] = 1
    text = markdown([("classes", classes(together, precisions))])
    assert all(device in text for device in BIG_DEVICES)
    assert max(map(len, text.splitlines())) <= LONGEST


def test_an_explanation_on_100_samples_groups_its_attributes_by_prefix():
    """An explain row per sample, the chosen attribute splitting the devices as 2 settings,
    4 versions, 150 layers' kernels and 50 layers' orders do: the samples counted, the
    attributes counted per prefix with a few examples, the numbers left out exact."""
    import re

    from bitdrift.report.findings.classes import explanations

    kernels = [f"kernel.{layer}" for layer in BIG_LAYERS * 3][:150]
    kernels = [f"{name}_{index}" for index, name in enumerate(kernels)]
    orders = [f"order.{layer}" for layer in BIG_LAYERS]
    versions = [f"versions.{module}" for module in ("keras", "onnxruntime", "tensorflow",
                                                    "tensorflow_onednn")]
    others = ["graph_optimization_level", "threads", *versions, *kernels, *orders]
    table = pd.DataFrame([{
        "model": "resnet50", "sample": sample, "layer": "output", "n_eqc": 2,
        "n_devices": len(BIG_DEVICES), "attributes": "backend", "determined": True,
        "search": "exact", "unexplained_devices": "", "alternatives": "",
        "confounded": "backend=" + "+".join(others), "weak": True,
        "nondeterministic_devices": ""} for sample in BIG_SAMPLES])
    (line, confounded) = explanations(table)
    assert len(line) <= LONGEST and len(confounded) <= LONGEST, (len(line), len(confounded))
    samples = table["sample"].nunique()
    assert line.startswith(f"resnet50, {samples} samples (#0, #1, #2, #3, #4 … and "
                           f"{samples - 5} more): the classes are determined by `backend`")
    per_prefix = {prefix: sum(name.startswith(prefix + ".") for name in others)
                  for prefix in ("kernel", "order", "versions")}
    # what splits the devices as `backend` does: a sentence of its own, a group of one
    # prefix counted with one example
    assert confounded.startswith("resnet50: `backend` splits the devices as ")
    assert f"`kernel.*` at {per_prefix['kernel']} layers (`{kernels[0]}` … and " \
        f"{per_prefix['kernel'] - 1} more)" in confounded
    assert f"`order.*` at {per_prefix['order']} layers (`{orders[0]}`" in confounded
    assert f"{per_prefix['versions']} `versions.*` attributes (`{versions[0]}` … and " \
        f"{per_prefix['versions'] - 1} more)" in confounded
    assert "`graph_optimization_level`, `threads`, " in confounded
    # every "N more" is what its list left out
    left_out = re.findall(r"\(((?:`[^`]+`, )*`[^`]+`) … and (\d+) more\)", confounded)
    assert len(left_out) == 3
    for shown, more in left_out:
        prefix = shown.split("`")[1].split(".")[0]
        assert shown.count("`") // 2 + int(more) == per_prefix[prefix]


def test_many_sets_of_attributes_keep_those_of_the_most_samples():
    """12 explanations of 1 to 12 samples each: the 5 explaining the most samples are
    said, the other 7 counted with their samples."""
    from bitdrift.report.findings.classes import explanations
    from bitdrift.report.findings.text import SHOWN

    sizes = list(range(1, 13))
    rows, sample = [], 0
    for index, size in enumerate(sizes):
        for _ in range(size):
            rows.append({"model": "m", "sample": sample, "layer": "output",
                         "attributes": f"kernel.layer_{index}", "determined": True,
                         "search": "exact"})
            sample += 1
    lines = explanations(pd.DataFrame(rows))
    kept = sorted(sizes, reverse=True)[:SHOWN]
    assert [int(line.split("`kernel.layer_")[1].split("`")[0]) + 1 for line in lines[:-1]] \
        == sorted(kept)
    assert lines[-1] == (f"… and {len(sizes) - SHOWN} more sets of attributes, on "
                         f"{sum(sizes) - sum(kept)} (model, sample) pairs; every sample's in "
                         "results/tables/explain.csv.")


def _big_orders():
    """accumulation_orders.csv's rows, 30 devices x 50 layers, by hand: family a (10
    devices) sums sequentially at every layer, its third device's replay differing at
    layer 7; family b sums in blocks of 128 at even layers and in an order of a height of
    its own at each odd one; each device of family c in an order of its own at every layer,
    but the last c device, whose record maps the last layer alone. Conv2D layers were
    searched and replayed at 64 of their positions. The sentences that differ in more than
    the layer: 1 (a, 49 layers) + 1 (a at layer 7) + 1 (b, 25 even layers) + 25 (b, each
    odd layer) + 9 x 50 + 1 (c)."""
    family = {"a": BIG_DEVICES[:10], "b": BIG_DEVICES[10:20], "c": BIG_DEVICES[20:]}
    rows = []
    for number, layer in enumerate(BIG_LAYERS):
        conv = layer != "predictions"
        pixels = 12544 >> (2 * (number % 3))
        searched = f" (order searched at 64 of {pixels} positions)" if conv else ""
        replayed = (f"; replayed at 64 of {pixels} positions of 1 of 3 samples "
                    "(analysis.replay_positions, analysis.replay_samples)") if conv else ""
        for name, devices in family.items():
            for index, device in enumerate(devices):
                if device == BIG_DEVICES[-1] and conv:
                    continue
                order = ("sequential, bias last" if name == "a" else
                         "blocks of 128, bias last" if name == "b" and number % 2 == 0 else
                         f"other (height {100 + number}), bias last" if name == "b" else
                         f"other (height {1000 + 100 * index + number}), bias last")
                replay = "differs: 3 of 10 values bit-identical at best (with FMA)" \
                    if (name, index, number) == ("a", 2, 7) else "bit-identical with FMA"
                rows.append({"model": "resnet50", "device": device, "backend": name,
                             "layer": layer, "terms": 65 + 64 * number,
                             "order": order + searched, "replay": replay + replayed})
    odd = len(BIG_LAYERS) // 2
    return pd.DataFrame(rows), 1 + 1 + 1 + odd + (len(family["c"]) - 1) * len(BIG_LAYERS) + 1


def _devices_said(sentence: str) -> list[str]:
    """The devices a sentence of orders names, in it as _names writes them."""
    import re

    said = re.search(r"\): (?:the order of )?(.*?) (?:sums?|was not revealed) ", sentence)[1]
    return re.split(r", | and ", said)


def test_the_orders_of_50_layers_and_30_devices_are_a_row_per_device():
    """Over ORDER_COLUMNS layers the table has a row per device: its layers, its commonest
    orders with their layers counted, how many replayed layers the replay reproduces (the
    truth counted from the rows) and the layers it does not; every line short."""
    from bitdrift.report.findings.document import markdown
    from bitdrift.report.findings.orders import orders

    table, _ = _big_orders()
    lines = orders(table)
    replayed = table[~table["replay"].str.startswith("not replayed")]
    same = replayed["replay"].str.startswith("bit-identical").sum()
    assert f"gives the record's bits for {same} of the {len(replayed)} (device, layer) " \
        "pairs" in lines[0]
    summary = lines[-1].set_index("device")
    assert list(summary.index) == list(dict.fromkeys(table["device"]))
    for device, rows in table.groupby("device"):
        reproduced = rows["replay"].str.startswith("bit-identical")
        assert summary.loc[device, "layers"] == len(rows)
        assert summary.loc[device, "replay gives the record's bits"] == \
            f"{reproduced.sum()} of {len(rows)}"
        assert summary.loc[device, "not reproduced at"] == ", ".join(rows.loc[~reproduced,
                                                                          "layer"])
    # family a sums sequentially at every layer; b in blocks of 128 at its 25 even layers
    assert summary.loc[BIG_DEVICES[0], "orders (layers)"] == \
        f"sequential, bias last ({len(BIG_LAYERS)})"
    assert summary.loc[BIG_DEVICES[10], "orders (layers)"].startswith(
        f"blocks of 128, bias last ({(len(BIG_LAYERS) + 1) // 2}); ")
    assert max(map(len, markdown([("orders", lines)]).splitlines())) <= LONGEST


def test_long_lists_elsewhere_are_cut_and_counted():
    """First divergences at 40 layers, 20 kernel pairs tied at the third, a device below its
    format at 54 layers: each list shows a few and counts the rest exactly."""
    import re
    from collections import Counter

    from bitdrift.report.findings.classes import reduced_precision
    from bitdrift.report.findings.divergence import divergence
    from bitdrift.report.findings.text import SHOWN

    layers = [f"conv{index}" for index in range(40)]
    rows = [{"model": "m", "sample": sample, "class_a": 1, "class_b": 2,
             "first_layer": layers[sample % 40], "kernels_differ": "yes",
             "kernels_a": f"k{sample % 20}", "kernels_b": "ref"} for sample in range(100)]
    lines = divergence(pd.DataFrame(rows), pd.DataFrame())
    at = Counter(row["first_layer"] for row in rows)
    top = at.most_common()
    rest = top[SHOWN:]
    assert lines[0] == ("m: of 100 (class pair, sample) first divergences, "
                        + ", ".join(f"{count} at `{layer}`" for layer, count in top[:SHOWN])
                        + f", … and {sum(n for _, n in rest)} at {len(rest)} more layers "
                        "(results/tables/divergence.csv).")
    pairs = Counter(f"k{sample % 20} vs ref" for sample in range(100))
    assert len(set(pairs.values())) == 1  # all tied: 5 shown, 15 counted
    assert lines[1].endswith(f"… and {len(pairs) - SHOWN} more pairs at "
                             f"{next(iter(pairs.values()))} each.")
    effective = pd.DataFrame([{"model": "m", "device": "ov", "precision": "float32",
                               "layer": f"conv{index}", "reduced": True, "format": "bfloat16",
                               "effective_bits": 7.5} for index in range(54)])
    (line,) = reduced_precision(effective)
    # as many layers named as fit in a short line, the rest counted
    named, more = re.search(r"in 54 of 54 checked layers \((.*) … and (\d+) more\)\.",
                            line).groups()
    assert named.split(", ") == [f"conv{index}" for index in range(54 - int(more))]
    assert len(line) <= LONGEST
    # names of an ONNX model's length: fewer of them
    long = effective.assign(layer=[f"__block__attention__query__MatMul_output_{index}"
                                   for index in range(54)])
    (line,) = reduced_precision(long)
    named, more = re.search(r"checked layers \((.*) … and (\d+) more\)\.", line).groups()
    assert len(named.split(", ")) + int(more) == 54 and len(line) <= LONGEST


def test_the_findings_of_a_big_run_stay_short_and_valid(tmp_path):
    """Every table at the size of issue 52 through findings(): no line of the Markdown
    over LONGEST characters (issue 64), every device named, a '*' only inside a literal,
    and the report's text valid reStructuredText (docutils at warning level)."""
    import re

    from docutils.core import publish_parts
    from docutils.utils import Reporter

    orders_table, _ = _big_orders()
    eqc = _big_eqc({sample: 2 + sample % 3 for sample in BIG_SAMPLES})
    layers = pd.DataFrame([{"model": "resnet50", "sample": 0, "layer": "conv1_conv",
                            "device": device, "precision": "float32"}
                           for device in BIG_DEVICES])
    kernels = "+".join(f"kernel.{layer}" for layer in BIG_LAYERS * 4)
    explain = pd.DataFrame([{"model": "resnet50", "sample": sample, "layer": "output",
                             "attributes": "backend;threads", "determined": True,
                             "search": "exact", "weak": False,
                             "confounded": f"backend={kernels}"} for sample in BIG_SAMPLES])
    paths = {}
    for name, table in (("eqc", eqc), ("eqc_layers", layers), ("explain", explain),
                        ("accumulation_orders", orders_table)):
        paths[name] = tmp_path / f"{name}.csv"
        table.to_csv(paths[name], index=False)
    sections = findings(paths, {BIG_DEVICES[0]: FINGERPRINT})
    text = markdown(sections)
    assert max(map(len, text.splitlines())) <= LONGEST
    assert all(re.search(rf"\b{device}\b", text) for device in BIG_DEVICES)
    assert "*" not in re.sub(r"`[^`]*`", "", text.split("\n", 1)[1])
    publish_parts(restructured_text(sections), writer="html",
                  settings_overrides={"halt_level": Reporter.WARNING_LEVEL})


def test_the_eqc_figure_title_counts_classes_when_samples_are_many():
    """A few samples: each one's class count, as the grid's columns; many (ResNet-50's 100):
    the range and the commonest count with its number of samples, counted here from the
    series itself; never a count per sample past TITLE_COUNTS."""
    from bitdrift.report.figures.eqc import TITLE_COUNTS, _class_counts_title

    few = pd.Series([3, 2, 2])
    assert _class_counts_title(few) == "3/2/2 classes"
    same = pd.Series([2] * 60)
    assert _class_counts_title(same) == "2 classes on each of 60 samples"
    varied = pd.Series([1] * 7 + [4] * 30 + [2] * 23)
    title = _class_counts_title(varied)
    commonest = varied.value_counts().idxmax()
    assert title == (f"{varied.min()}–{varied.max()} classes per sample ({commonest} on "
                     f"{(varied == commonest).sum()} of {len(varied)})")
    assert title.count("/") == 0 and len(varied) > TITLE_COUNTS


def _study_summaries(tmp_path) -> dict:
    """A probe study's and a batching study's summaries, as their commands write them."""
    probes = pd.DataFrame([{"measure": "held-out devices", "classes": 7},
                           {"measure": "best probe", "classes": 5},
                           {"measure": "best natural sample", "classes": 2}])
    batching = pd.DataFrame([
        {"device": "tf", "settings_differing": 2, "settings": 5, "origin_layers": "dense",
         "first_divergent_token": 3},
        {"device": "ort", "settings_differing": 0, "settings": 5, "origin_layers": None,
         "first_divergent_token": None}])
    files = {"probe_summary": tmp_path / "probe_summary.csv",
             "batching_summary": tmp_path / "batching_summary.csv"}
    probes.to_csv(files["probe_summary"], index=False)
    batching.to_csv(files["batching_summary"], index=False)
    return files


def test_each_study_writes_its_own_section_after_the_cores(tmp_path):
    from bitdrift.studies import findings_sections

    tables = {**_tables(tmp_path), **_study_summaries(tmp_path)}
    sections = findings(tables, {"a": FINGERPRINT}, findings_sections())
    assert [title for title, _ in sections][-3:] == ["Devices that failed", "Forensic probes",
                                                    "Batch invariance"]
    assert dict(sections)["Forensic probes"] == [
        "Forensic probes on 7 held-out devices: the best probe splits them into 5 classes, "
        "the best natural test sample into 2."]
    intro, devices, decoding = dict(sections)["Batch invariance"]
    assert intro == "Batching: per device, the batch settings that change the studied outputs:"
    assert devices.to_dict("records") == [
        {"device": "tf", "batch settings that change the studied outputs": "2 of 5",
         "differences start at": "dense"},
        {"device": "ort", "batch settings that change the studied outputs": "0 of 5",
         "differences start at": ""}]
    assert decoding == "Batching: greedy decoding diverged on 1 device(s)."
    # the core alone writes no study's section, and a study that has not run has none
    assert "Forensic probes" not in dict(findings(tables, {"a": FINGERPRINT}))
    assert "Forensic probes" not in dict(findings(_tables(tmp_path), {"a": FINGERPRINT},
                                                  findings_sections()))


def test_the_findings_command_writes_the_studies_sections(tmp_path):
    """`bitdrift findings` gets the studies' sections from the command line, which
    registers the studies (the core's command knows none)."""
    from bitdrift.cli import main

    _tables(tmp_path)
    _study_summaries(tmp_path)
    out = tmp_path / "findings.md"
    assert main(["findings", str(tmp_path / "none.h5"), "--tables", str(tmp_path),
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert text.index("## Devices that failed") < text.index("## Forensic probes") \
        < text.index("## Batch invariance")


# -- the answer first (issue 64) ------------------------------------------------------------
def _nudged(values, index: int, ulps: int):
    """``values`` with element ``index`` moved by ``ulps`` units in the last place."""
    import numpy as np

    bits = values.copy().view(np.uint32 if values.dtype == np.float32 else np.uint16)
    bits[index] += ulps
    return bits.view(values.dtype)


def _answer_run(make_record, tmp_path):
    """Four float32 devices and two float16 ones over two samples, by hand: a and b
    identical, c 40 ulps apart at one element of sample 0, d 3 ulps apart on sample 1;
    e and f float16, f's largest logit on sample 1 set to 0 (its label changes). The
    tables written as the run writes them, from the same outputs (numpy); returns
    (table paths, records, {device: {sample: output}})."""
    import numpy as np

    rng = np.random.default_rng(0)
    base = {sample: rng.random(5).astype(np.float32) + 0.5 for sample in (0, 1)}
    outputs = {"a": base, "b": base,
               "c": {0: _nudged(base[0], 2, 40), 1: base[1]},
               "d": {0: base[0], 1: _nudged(base[1], 4, 3)},
               "e": {sample: values.astype(np.float16) for sample, values in base.items()}}
    changed = base[1].astype(np.float16)
    changed[np.argmax(changed)] = 0
    outputs["f"] = {0: outputs["e"][0], 1: changed}
    precision = {device: "float16" if device in "ef" else "float32" for device in outputs}
    records = [make_record(device, {sample: np.stack([values, values])
                                    for sample, values in found.items()},
                           model="m", precision=precision[device])
               for device, found in outputs.items()]
    rows = []
    for sample in (0, 1):  # a class per distinct byte string, numbered by first appearance
        seen: dict[bytes, int] = {}
        for device, found in outputs.items():
            key = found[sample].tobytes() + precision[device].encode()
            rows.append({"model": "m", "sample": sample, "device": device,
                         "eqc": seen.setdefault(key, len(seen) + 1), "deterministic": True})
    settings = {"a": (1, "tf"), "b": (1, "tf"), "c": (2, "tf"), "d": (1, "tf"),
                "e": (1, "torch"), "f": (2, "torch")}
    tables = {
        "eqc": pd.DataFrame(rows),
        "eqc_layers": pd.DataFrame([{"model": "m", "sample": 0, "layer": "dense",
                                     "device": device, "precision": kind}
                                    for device, kind in precision.items()]),
        # another model's attribute is empty here (the table holds every model's)
        "device_classes": pd.DataFrame([{"model": "m", "device": device, "device_class": 1,
                                         "threads": threads, "backend": backend,
                                         "inductor_options": None}
                                        for device, (threads, backend) in settings.items()]),
        "explain": pd.DataFrame([{"model": "m", "sample": sample, "layer": "output",
                                  "attributes": "threads;backend", "determined": True,
                                  "search": "exact"} for sample in (0, 1)]),
        # c computes below its declared format
        "effective_precision": pd.DataFrame([{"model": "m", "device": device,
                                              "precision": "float32", "layer": "dense",
                                              "reduced": device == "c", "format": "float32",
                                              "effective_bits": 10.0 if device == "c" else 23}
                                             for device in "abcd"]),
        # an ONNX model's argmax check: no TensorFlow reference, nothing checked
        "argmax_agreement": pd.DataFrame([{"model": "m", "device": device, "images": None,
                                           "agreeing": None, "share": None}
                                          for device in outputs])}
    paths = {}
    for name, table in tables.items():
        paths[name] = tmp_path / f"{name}.csv"
        table.to_csv(paths[name], index=False)
    return paths, records, outputs, tables


def test_the_answer_opens_the_findings_with_what_numpy_counts(make_record, tmp_path):
    """Per model, first: the classes of the main precision and of every precision, the
    fewest mantissa bits two devices share and which two, the samples whose predicted
    label changes between devices and which device leaves the common label, and the
    setting that splits the most pairs of devices in different classes; each number
    recounted here with numpy from the outputs and tables built by hand."""
    import itertools
    import re

    import numpy as np
    from docutils.core import publish_parts
    from docutils.utils import Reporter

    from bitdrift.report.findings.answer import HEADING, final_outputs

    paths, records, outputs, tables = _answer_run(make_record, tmp_path)
    sections = findings(paths, {}, outputs=final_outputs(records))
    assert sections[0][0] == HEADING
    classes, bits, other_precisions, labels, setting = sections[0][1]
    eqc = tables["eqc"]
    float32 = eqc[eqc["device"].isin(list("abcd"))]
    per_sample = float32.groupby("sample")["eqc"].nunique()
    every = eqc.groupby("sample")["eqc"].nunique()
    # as built: float32 the same count on both samples, every precision one more on #1
    assert per_sample.nunique() == 1 and list(every) == [every[0], every[0] + 1]
    assert classes == (f"m: {per_sample.iloc[0]} classes on each of the 2 samples among its "
                       "4 float32 devices (bit-identical final outputs form a class); "
                       f"counting every precision (float32, float16), {every[0]} to "
                       f"{every[1]} classes per sample ({every[0]} on 1 of the 2 samples) "
                       "among all 6 devices.")

    def dropped(x, y) -> int:  # the highest differing bit, by Python's integers
        view = np.uint32 if x.dtype == np.float32 else np.uint16
        return max(int(v).bit_length() for v in (x.view(view) ^ y.view(view)))

    worst = {pair: max(dropped(outputs[pair[0]][s], outputs[pair[1]][s]) for s in (0, 1))
             for pair in itertools.combinations("abcd", 2)}
    fewest = 23 - max(worst.values())
    found = re.match(r"m: the most bits lost: (\w) and (\w) share (\d+) of float32's 23 "
                     r"mantissa bits on sample #(\d)", bits)
    assert int(found[3]) == fewest and worst[(found[1], found[2])] == max(worst.values())
    assert dropped(outputs[found[1]][int(found[4])], outputs[found[2]][int(found[4])]) \
        == max(worst.values())
    tied = sum(bits == max(worst.values()) for bits in worst.values())
    # c against a, b and d (which equal a on sample 0)
    assert tied == 3 and f"(one of {tied} pairs as far apart)" in bits
    # c, which computes below its format, is of the farthest pair: the others' said too
    assert "c" in found.group(1, 2)
    rest = {pair: bits for pair, bits in worst.items() if "c" not in pair}
    other = re.search(r"; without c, which computes below the declared format, (\w) and (\w) "
                      r"share (\d+) on sample #\d\.$", bits)
    assert int(other[3]) == 23 - max(rest.values())
    assert rest[other.group(1, 2)] == max(rest.values())
    half = max(0, 10 - max(dropped(outputs["e"][s], outputs["f"][s]) for s in (0, 1)))
    assert other_precisions == ("m: the fewest bits shared within each other precision: "
                                f"float16 {half} of 10.")
    argmax = {device: {s: int(np.argmax(found[s].astype(np.float64))) for s in (0, 1)}
              for device, found in outputs.items()}
    moved = [s for s in (0, 1) if len({argmax[d][s] for d in outputs}) > 1]
    assert moved == [1]
    assert labels == ("m: the predicted label (argmax of the final output) differs between "
                      "devices on 1 of the 2 recorded samples (#1); off the most devices' "
                      "label: f (1).")
    # the pairs of devices in different classes each setting splits, by numpy
    signature = eqc.pivot_table(index="device", columns="sample", values="eqc").loc[
        list(outputs)].to_numpy()
    apart = np.triu((signature[:, None, :] != signature[None, :, :]).any(axis=2), 1)
    split = {}
    for name in ("threads", "backend"):
        values = tables["device_classes"].set_index("device").loc[list(outputs), name]
        values = values.astype(str).to_numpy()
        split[name] = int((apart & (values[:, None] != values[None, :])).sum())
    best = max(split, key=split.get)
    assert setting == (f"m: the setting that tells the most classes apart: `{best}`, which "
                       f"splits {split[best]} of the {int(apart.sum())} pairs of devices in "
                       "different classes; `threads` and `backend` together determine every "
                       "class (explain.csv).")
    # an ONNX model's labels: compared between its devices, not "not checked"
    assert dict(sections)["Predicted labels"] == [labels]
    text = markdown(sections)
    assert text.index("## In short") < text.index("## Machine")
    assert max(map(len, text.splitlines())) <= LONGEST
    html = publish_parts(restructured_text(sections), writer="html",
                         settings_overrides={"halt_level": Reporter.WARNING_LEVEL})["body"]
    assert html.index("In short") < html.index("Machine")


def test_identical_devices_lose_no_bits_and_keep_their_labels(make_record, tmp_path):
    """Two devices with the same bits: no bit lost, no label changed, one class, nothing
    to explain; an output of one value per sample names no label."""
    import numpy as np

    from bitdrift.report.findings.answer import answer, final_outputs

    same = {0: np.array([[0.25, 0.5]], np.float32)}
    records = [make_record(device, same, model="m") for device in ("a", "b")]
    eqc = pd.DataFrame([{"model": "m", "sample": 0, "device": device, "eqc": 1}
                        for device in ("a", "b")])
    lines = answer(eqc, {"a": "float32", "b": "float32"}, pd.DataFrame(), pd.DataFrame(),
                   final_outputs(records))
    assert len(lines) == 4
    assert lines[1:] == [
        "m: the most bits lost: none; every float32 device gives the same bits on every "
        "sample.",
        "m: the predicted label (argmax of the final output) is the same on all 2 devices "
        "on each of the 1 recorded samples.",
        "m: one class: no setting to explain."]
    scalar = [make_record(device, {0: np.array([[0.5]], np.float32)}, model="r")
              for device in ("a", "b")]
    (_, _, labels, _) = answer(eqc.assign(model="r"), {}, pd.DataFrame(), pd.DataFrame(),
                               final_outputs(scalar))
    assert labels == ("r: predicted labels not compared: the final output's last axis holds "
                      "one value (no argmax).")


def test_a_table_in_a_section_renders_as_markdown_and_as_rest():
    """A section's DataFrame: a Markdown pipe table and a reST list-table whose cells read
    as the DataFrame's, markup characters and list-like starts included; a named index
    comes first."""
    import html
    import re

    from docutils.core import publish_parts
    from docutils.utils import Reporter

    frame = pd.DataFrame({"device": ["tf_1", "ort|2", "x"],
                          "conv_1": ["- sequential *a*", "1. `b`", None]}).set_index("device")
    sections = [("Orders", ["before", frame, "after"])]
    text = markdown(sections)
    assert "- before\n\n| device | conv_1 |\n|---|---|\n| tf_1 | - sequential *a* |\n" \
        "| ort\\|2 | 1. `b` |\n| x |  |\n\n- after" in text
    body = publish_parts(restructured_text(sections), writer="html",
                         settings_overrides={"halt_level": Reporter.WARNING_LEVEL})["body"]
    cells = [html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()
             for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", body, re.S)]
    assert cells == ["device", "conv_1", "tf_1", "- sequential *a*", "ort|2", "1. `b`",
                     "x", ""]


def test_a_sample_no_set_explains_leaves_the_setting_line_whole():
    """explain.csv's row of a sample no set of settings explains has no attributes (empty in
    the CSV, NaN when read): the line still names the setting that splits the most pairs
    (one pair here, by hand). A .tflite run's findings failed on it ('float' object has
    no attribute 'split')."""
    import io

    from bitdrift.report.findings.answer import _setting_line

    rows = pd.DataFrame([{"model": "m", "sample": sample, "device": device, "eqc": eqc}
                         for sample in (0, 1) for device, eqc in (("a", 1), ("b", 2))])
    settings = pd.DataFrame({"model": ["m", "m"], "device": ["a", "b"],
                             "device_class": [1, 2], "threads": [1, 2]})
    explain = pd.read_csv(io.StringIO("model,sample,layer,attributes,determined\n"
                                      "m,0,output,threads,True\n"
                                      "m,1,output,,False\n"))
    assert explain["attributes"].isna().sum() == 1
    line = _setting_line("m", rows, explain, settings)
    assert line == ("m: the setting that tells the most classes apart: `threads`, which "
                    "splits 1 of the 1 pairs of devices in different classes.")
