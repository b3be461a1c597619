"""The core figures read at a glance (issue 64): long layer names numbered with a key,
samples that coincide named together, legends beside the panels, kernels spelled out once
per set of layers alike, the settings group apart from the classes, and a figure with
nothing to show saying so in its title. Each on hand-built tables whose answer is written
out here."""

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg

from bitdrift.report.figures.divergence import plot_divergence
from bitdrift.report.figures.eqc import plot_eqc_table
from bitdrift.report.figures.kernels import kernel_key, plot_kernels
from bitdrift.report.figures.layer_marks import LAYER_LABEL_WIDTH, layer_labels
from bitdrift.report.figures.remaining_precision import plot_remaining_precision
from bitdrift.report.figures.samples import identical_samples, samples_label

NO_KINDS = pd.DataFrame(columns=["model", "layer", "layer_class"])


# -- layer names --------------------------------------------------------------------------
def test_short_layer_names_stay_as_they_are_with_no_key():
    names = ["conv2d", "activation", "dense_1", "output"]
    assert layer_labels(names) == (names, [])


def test_long_onnx_names_lose_what_they_share_and_are_numbered():
    """ONNX node outputs as a record stores them ('/' as '__'): the start '__block__' and
    the end '_output_0' that every long name carries are dropped, '__' shown as '/', every
    label numbered; the short names keep theirs."""
    names = ["__block__attention__q__MatMul_output_0", "__block__gelu__Erf_output_0",
             "__block__Add_1_output_0", "logits"]
    labels, key = layer_labels(names)
    assert labels == ["1 attention/q/MatMul", "2 gelu/Erf", "3 Add_1", "4 logits"]
    assert "'__block__'" in key[0] and "'_output_0'" in key[0]
    assert key[1:] == []  # no label was cut: each is the name less what all share


def test_a_name_still_too_long_is_cut_and_spelled_out_in_the_key():
    """Two long torch module paths share 'encoder.layers.'; what is left of one still
    runs past the width, so its label keeps the end after '…' and the key gives it whole,
    under its number."""
    long = "encoder.layers.self_attention_block_with_rotary.out_projection"
    names = ["encoder.layers.norm_before_attention", long, "head"]
    labels, key = layer_labels(names)
    assert all(len(label) <= LAYER_LABEL_WIDTH for label in labels)
    # 'norm_before_attention' is 21 characters, one more than the 20 a label keeps
    # beside "1 ": cut inside its one part
    assert labels[0] == "1 …rm_before_attention"
    assert labels[1] == "2 …tary.out_projection"
    assert labels[2] == "3 head"
    assert key[1:] == ["1 encoder.layers.norm_before_attention", f"2 {long}"]
    assert "'encoder.layers.'" in key[0]
    assert len(set(labels)) == len(labels)


# -- samples that coincide ----------------------------------------------------------------
def test_identical_samples_are_grouped_by_equal_values_at_every_position():
    part = pd.DataFrame({"sample": [0, 0, 1, 1, 6, 6], "position": [0, 1] * 3,
                         "value": [0.5, 1.0, 0.5, 1.0, 0.5, 0.75],
                         "other": [np.nan, 2, np.nan, 2, np.nan, 2]})
    assert identical_samples(part, ["value", "other"]) == [[0, 1], [6]]
    assert samples_label([0, 1], 3) == "samples #0, #1 (identical)"
    assert samples_label([0, 1, 6], 3) == "all 3 samples (identical)"
    assert samples_label([6], 3) == "sample #6"


def _apart(shares: dict, precision="float32", model="m", n_pairs=3):
    """pairs_apart's rows: shares[sample] = [(layer, at the layer, so far), ...]."""
    return pd.DataFrame([
        {"model": model, "sample": sample, "precision": precision, "layer": layer,
         "position": position, "share_apart": at, "share_apart_so_far": so_far,
         "n_pairs": n_pairs, "cross_format_pairs": 0, "left_out_devices": ""}
        for sample, rows in shares.items()
        for position, (layer, at, so_far) in enumerate(rows)])


def _figure_title(figure) -> str:
    """The figure's title: the legend's over the panels, else the suptitle."""
    titles = [legend.get_title().get_text() for legend in figure.legends]
    return " ".join([*titles, figure._suptitle.get_text() if figure._suptitle else ""])


def test_three_identical_samples_are_one_line_that_says_so(tmp_path):
    rows = [("conv", 0.0, 0.0), ("dense", 2 / 3, 2 / 3), ("output", 1 / 3, 2 / 3)]
    figure = plot_divergence(_apart({0: rows, 1: rows, 6: rows}), NO_KINDS,
                             tmp_path / "divergence.pdf")
    ax = figure.axes[0]
    drawn = [line for line in ax.get_lines() if len(line.get_xdata()) == 3]
    assert len(drawn) == 2  # one group: its line (at the layer) and its band (so far)
    assert "all 3 samples (identical)" in ax.get_title(loc="left")
    assert (tmp_path / "divergence.png").is_file()


def test_samples_that_differ_get_a_legend_beside_the_panel(tmp_path):
    rows = [("conv", 0.0, 0.0), ("output", 1 / 3, 1 / 3)]
    other = [("conv", 0.0, 0.0), ("output", 2 / 3, 2 / 3)]
    figure = plot_divergence(_apart({0: rows, 1: rows, 6: other}), NO_KINDS,
                             tmp_path / "divergence.pdf")
    ax = figure.axes[0]
    names = [text.get_text() for text in ax.get_legend().get_texts()]
    assert names == ["samples #0, #1 (identical)", "sample #6"]
    renderer = FigureCanvasAgg(figure).get_renderer()  # the saved figure's is closed
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def test_a_divergence_figure_where_every_pair_agrees_says_there_is_nothing_to_show(tmp_path):
    rows = [("conv", 0.0, 0.0), ("output", 0.0, 0.0)]
    figure = plot_divergence(_apart({0: rows}), NO_KINDS, tmp_path / "divergence.pdf")
    assert "nothing to show" in _figure_title(figure)
    assert "all 3 pairs identical at every layer" in figure.axes[0].get_title(loc="left")
    empty = plot_divergence(_apart({0: rows}, n_pairs=0), NO_KINDS, tmp_path / "none.pdf")
    assert "nothing to show" in _figure_title(empty)


def test_long_layer_names_are_numbered_on_the_divergence_axis(tmp_path):
    layers = [f"__block__attention__head_{k}__MatMul_output_0" for k in range(3)]
    rows = [(layer, 0.0, 0.0) for layer in layers] + [("output", 1 / 3, 1 / 3)]
    figure = plot_divergence(_apart({0: rows}), NO_KINDS, tmp_path / "divergence.pdf")
    ticks = [tick.get_text() for tick in figure.axes[0].get_xticklabels()]
    assert ticks == layer_labels([*layers, "output"])[0]
    # all three share '__block__attention__' and '__MatMul_output_0': what tells them
    # apart is left
    assert ticks[:3] == ["1 head_0", "2 head_1", "3 head_2"]


# -- remaining precision ------------------------------------------------------------------
PRECISION_COLUMNS = ["model", "sample", "layer", "position", "n_eqc", "remaining_precision",
                     "precision", "n_devices", "layer_class"]


def _precision(model, samples, layers, bits, classes):
    return pd.DataFrame(columns=PRECISION_COLUMNS, data=[
        {"model": model, "sample": sample, "layer": layer, "position": position,
         "n_eqc": classes[k][position], "remaining_precision": bits[k][position],
         "precision": "float32", "n_devices": 4, "layer_class": ""}
        for k, sample in enumerate(samples) for position, layer in enumerate(layers)])


def test_remaining_precision_names_identical_samples_and_keeps_its_legend_aside(tmp_path):
    table = _precision("m", [0, 1, 6], ["conv", "dense", "output"],
                       bits=[[23, 10, 4], [23, 10, 4], [23, 12, 5]],
                       classes=[[1, 2, 3]] * 3)
    figure = plot_remaining_precision(table, tmp_path / "rp.pdf")
    top, bottom = figure.axes[0], figure.axes[1]
    legend = [text.get_text() for text in top.get_legend().get_texts()]
    assert "solid lines identical: samples #0, #1" in legend
    assert bottom.get_title(loc="left") == "lines identical: all 3 samples"
    renderer = FigureCanvasAgg(figure).get_renderer()  # the saved figure's is closed
    assert top.get_legend().get_window_extent(renderer).x0 >= \
        top.get_window_extent(renderer).x1


def test_a_model_with_the_output_alone_is_drawn_per_sample_and_says_so(tmp_path):
    """Every device records the output alone (a compiled model): one layer, so the samples
    are the x-axis instead of four points on one spot."""
    table = _precision("compiled", [0, 1, 2, 3], ["output"], bits=[[3], [0], [2], [0]],
                       classes=[[11]] * 4)
    figure = plot_remaining_precision(table, tmp_path / "rp.pdf")
    top, bottom = figure.axes[0], figure.axes[1]
    assert [tick.get_text() for tick in bottom.get_xticklabels()] == ["#0", "#1", "#2", "#3"]
    points = [line for line in top.get_lines() if len(line.get_xdata())]
    assert sorted(float(line.get_xdata()[0]) for line in points
                  if line.get_label().startswith("sample")) == [0, 1, 2, 3]
    assert "no recorded layer but the output" in top.get_title(loc="left").replace("\n", " ")


def test_remaining_precision_with_no_rows_says_there_is_nothing_to_show(tmp_path):
    figure = plot_remaining_precision(_precision("m", [], ["output"], [], []),
                                      tmp_path / "rp.pdf")
    assert "nothing to show" in figure._suptitle.get_text()


# -- kernels ------------------------------------------------------------------------------
def test_the_kernel_key_spells_out_layers_that_name_their_kernels_alike_once():
    letters = {"conv2d": {"brg_conv": "A", "xla conv": "B"}, "activation": {},
               "conv2d_1": {"brg_conv": "A", "xla conv": "B"},
               "dense": {"gemm": "A"}}
    assert kernel_key(letters) == [(["conv2d", "conv2d_1"], [("A", "brg_conv"),
                                                             ("B", "xla conv")]),
                                   (["dense"], [("A", "gemm")])]


def _kernels(rows):
    columns = ["model", "device", "backend", "layer", "layer_class", "signature"]
    return pd.DataFrame([("m", device, backend, layer, "Dense", signature)
                         for device, backend, layer, signature in rows], columns=columns)


def _coverage(first, untraced):
    return pd.DataFrame([{"model": "m", "first_divergences": first, "kernels_differ": 0,
                          "same_kernels_other_settings": 0, "unexplained": 0,
                          "untraced": untraced, "deployed_only": 0,
                          "share_kernels_differ": np.nan,
                          "share_same_kernels_other_settings": np.nan,
                          "share_unexplained": np.nan, "adjusted_rand_index_mean": 1.0,
                          "adjusted_rand_index_min": 1.0, "adjusted_rand_index_max": 1.0,
                          "traced_devices": 1}])


def test_a_kernel_figure_without_a_traced_divergence_says_there_is_nothing_to_compare(
        tmp_path):
    signatures = _kernels([("ort", "onnxruntime", "fc", "ort Gemm"),
                           ("eager", "torch_export", "fc", "untraced")])
    eqc = pd.DataFrame({"model": ["m", "m"], "sample": [0, 0], "device": ["ort", "eager"],
                        "eqc": [1, 2]})
    divergence = pd.DataFrame({"model": ["m"], "class_a": [1], "class_b": [2],
                               "first_layer": ["fc"]})
    figure = plot_kernels(signatures, eqc, divergence, _coverage(1, 1),
                          tmp_path / "kernels.pdf")
    said = " ".join(text.get_text() for text in figure.texts).replace("\n", " ")
    assert "Nothing to compare: no first divergence lies between two runtimes" in said
    assert "ort Gemm" in said  # the key spells the letter out
    nothing = plot_kernels(_kernels([]), eqc, divergence, _coverage(1, 1),
                           tmp_path / "none.pdf")
    assert "nothing to show" in nothing.axes[0].get_title()


# -- the table of classes -----------------------------------------------------------------
def _class_table(classes):
    devices = list(classes)
    return pd.DataFrame({"device": devices, "backend": ["tensorflow"] * len(devices),
                         "threads": [str(k + 1) for k in range(len(devices))],
                         "settings_group": [str(k + 1) for k in range(len(devices))],
                         "m#0": [classes[d] for d in devices],
                         "m#3": [classes[d] for d in devices]})


def _cell_texts(figure):
    table = figure.axes[0].tables[0]
    cells = table.get_celld()
    rows = 1 + max(row for row, _ in cells)
    columns = 1 + max(column for _, column in cells)
    return [[cells[row, column].get_text().get_text() for column in range(columns)]
            for row in range(rows)]


def test_the_settings_group_stands_beside_the_device_as_a_label(tmp_path):
    figure = plot_eqc_table(_class_table({"a": "1", "b": "2", "c": "1"}),
                            tmp_path / "eqc_table.pdf")
    texts = _cell_texts(figure)
    assert texts[0][:2] == ["device", "settings\ngroup"]
    assert [row[1] for row in texts[1:]] == ["G1", "G2", "G3"]
    assert texts[0][-2:] == ["class on\n#0", "class on\n#3"]
    assert [row[-1] for row in texts[1:]] == ["1", "2", "1"]  # classes as they are
    said = " ".join(text.get_text() for text in figure.texts)
    assert "classes on the samples shown (m: 2/2)" in said


def test_a_class_table_where_nothing_parts_says_so_in_its_title(tmp_path):
    figure = plot_eqc_table(_class_table({"a": "1", "b": "1"}), tmp_path / "eqc_table.pdf")
    title = figure.texts[0].get_text()
    assert "nothing parts them" in title
    empty = plot_eqc_table(_class_table({}), tmp_path / "empty.pdf")
    assert "nothing to show" in empty.texts[0].get_text()


def test_a_panel_note_goes_where_no_line_runs():
    """Lines along 0 and 1 across the panel: the corners at top and bottom hold points,
    the middle of the left side none."""
    from bitdrift.report.figures.divergence import NOTE_PLACES, _free_corner

    part = _apart({0: [(f"l{k}", 0.0, 0.0) for k in range(4)],
                   1: [(f"l{k}", 1.0, 1.0) for k in range(4)]})
    assert _free_corner(part) == NOTE_PLACES[3][0] == (0.02, 0.5, "left", "center")
    rising = _apart({0: [("a", 0.0, 0.0), ("b", 0.0, 0.0), ("c", 0.9, 0.9), ("d", 0.9, 0.9)]})
    assert _free_corner(rising) == NOTE_PLACES[0][0]  # top left, above the low start
