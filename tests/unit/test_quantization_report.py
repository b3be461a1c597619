"""The quantized models' figure and findings (issue 65) on a hand-built
quantization_error.csv whose answer is known by construction: the float outputs are ones,
each quantized layer adds an error of ±e, so its SQNR is -20 log10(e) dB (worked here in
numpy, not by the code under test); one device (an emulated CPU) takes a larger error from
its third layer on, and changes one label of four."""

import math

import numpy as np
import pandas as pd
import pytest

from bitdrift.analysis.quantization_error import graph_order, summarize
from bitdrift.report.figures.quantization import plot_quantization_error
from bitdrift.report.findings import findings
from bitdrift.report.findings.document import markdown, restructured_text
from bitdrift.report.findings.quantization import HEADING, quantization, quantization_answer

LAYERS = ["conv", "relu", "matmul", "add", "logits"]
PARTING_LAYER = "matmul"  # where "emulated" takes its larger error
SAMPLES = 4
ELEMENTS = 64


def _sqnr(reference, quantized) -> float:
    """numpy's own: the signal's power over the error's, in dB."""
    return float(10 * np.log10(np.sum(reference ** 2) / np.sum((reference - quantized) ** 2)))


def _error_of(device: str, layer: str, plain: float = 1.0) -> float:
    """The error each quantized layer adds (±e): "emulated" ten times more from
    PARTING_LAYER on; "native" 1e-2, "plain" ``plain`` times that from relu on."""
    after = LAYERS.index(layer) >= LAYERS.index(PARTING_LAYER)
    if device == "emulated":
        return 1e-1 if after else 1.05e-2
    return 1e-2 * plain if device == "plain" and layer != "conv" else 1e-2


def _rows(model="q_dynamic", float_model="f", devices=("native", "plain", "emulated"),
          layers=LAYERS, scale=None, plain=1.0):
    """quantization_error.csv's rows, each worked out in numpy from its tensors; the
    final output (`output`: the last layer's tensor) carries the labels, argmax over the
    last axis of (samples, 16) rows, "emulated" moving one of them."""
    rows = []
    signs = np.where(np.arange(ELEMENTS) % 2, 1.0, -1.0)
    for device in devices:
        for layer in [*layers, "output"]:
            named = layers[-1] if layer == "output" else layer
            reference = np.ones(ELEMENTS)
            quantized = reference + _error_of(device, named, plain) * signs
            row = {"model": model, "float_model": float_model, "device": device,
                   "layer": layer, "quantized_layer": layer, "samples": SAMPLES,
                   "sqnr_db": _sqnr(reference, quantized),
                   "largest_error": float(np.max(np.abs(reference - quantized))),
                   "scale": scale,
                   "largest_error_in_scales": (float(np.max(np.abs(reference - quantized)))
                                               / scale if scale else None),
                   "labels": None, "changed_labels": None}
            if layer == "output":
                before = np.tile(np.eye(16)[3], (SAMPLES, 1))
                after = before.copy()
                if device == "emulated":
                    after[2] = np.eye(16)[5]
                row["labels"] = before.shape[0]
                row["changed_labels"] = int(np.count_nonzero(
                    np.argmax(before, -1) != np.argmax(after, -1)))
            rows.append(row)
    return rows


def _table(*parts) -> pd.DataFrame:
    return pd.DataFrame([row for part in parts for row in part])


def _known():
    """What the hand-built table says, from numpy: each device's output SQNR, the
    emulated device's shortfall below the best other device per layer."""
    signs = np.where(np.arange(ELEMENTS) % 2, 1.0, -1.0)

    def sqnr(device, layer):
        return _sqnr(np.ones(ELEMENTS), np.ones(ELEMENTS) + _error_of(device, layer) * signs)

    output = {device: sqnr(device, "logits") for device in ("native", "plain", "emulated")}
    shortfall = [max(sqnr("native", layer), sqnr("plain", layer)) - sqnr("emulated", layer)
                 for layer in LAYERS]
    return output, shortfall


# -- the table read back -----------------------------------------------------------------
def test_the_devices_layers_merge_into_one_graph_order():
    """An optimized graph records the fused Add alone; the unoptimized one the MatMul and
    the Add; a third device a layer before all the others."""
    assert graph_order([["q/Add", "k/Add", "logits"],
                        ["q/MatMul", "q/Add", "k/MatMul", "k/Add", "logits"],
                        ["input_q", "q/Add"]]) == [
        "input_q", "q/MatMul", "q/Add", "k/MatMul", "k/Add", "logits"]


def test_the_summary_names_the_device_that_parts_and_the_layer_numpy_finds():
    output, shortfall = _known()
    # the layer where the shortfall grows most, worked from numpy's SQNRs
    growth = np.diff([0.0, *shortfall])
    assert LAYERS[int(np.argmax(growth))] == PARTING_LAYER  # the table is as built
    summary, = summarize(_table(_rows()))
    assert summary.furthest == min(output, key=output.get) == "emulated"
    assert summary.parts_at == PARTING_LAYER
    assert summary.parts_by == pytest.approx(float(np.max(growth)), abs=1e-9)
    # -20 log10(0.1) = 20 dB against -20 log10(0.01) = 40 dB
    assert summary.sqnr_range == pytest.approx((20.0, 40.0), abs=1e-9)
    assert summary.labels == {"native": (4, 0), "plain": (4, 0), "emulated": (4, 1)}
    assert summary.layers == [*LAYERS, "output"]


def test_devices_a_hair_apart_do_not_part():
    """Without the emulated device: "plain" with an error 2 % larger from relu on lies
    20 log10(1.02) = 0.17 dB below "native" there, more than PARTS_DB: it parts at relu;
    0.4 % larger (0.035 dB, round-off's size) it does not."""
    summary, = summarize(_table(_rows(devices=("native", "plain"), plain=1.02)))
    assert (summary.furthest, summary.parts_at) == ("plain", "relu")
    assert summary.parts_by == pytest.approx(20 * math.log10(1.02), abs=1e-9)
    summary, = summarize(_table(_rows(devices=("native", "plain"), plain=1.004)))
    assert summary.furthest == "plain" and summary.parts_at is None


# -- the findings --------------------------------------------------------------------------
def test_the_section_says_what_numpy_computes(tmp_path):
    output, shortfall = _known()
    table = _table(_rows(), _rows(model="q_static", scale=0.004, devices=("native",
                                                                            "emulated")))
    items = quantization(table)
    frame = next(item for item in items if isinstance(item, pd.DataFrame))
    dynamic = frame.set_index("quantized model").loc["q_dynamic"]
    low, high = min(output.values()), max(output.values())
    assert dynamic["output SQNR (dB)"] == f"{low:.1f}-{high:.1f}" == "20.0-40.0"
    assert dynamic["furthest device"] == f"emulated ({output['emulated']:.1f} dB)"
    growth = max(np.diff([0.0, *shortfall]))
    assert dynamic["where it parts"] == (f"`{PARTING_LAYER}`, {growth:.1f} dB further "
                                         "below the best other device than at its layer "
                                         "before")
    assert dynamic["labels changed"] == "emulated 1 of 4"
    assert dynamic["largest error (scales)"] == "no fixed scale (computed per batch)"
    assert dynamic["samples"] == SAMPLES
    static = frame.set_index("quantized model").loc["q_static"]
    # the largest error 0.1 (emulated, from matmul on) over the scale 0.004: 25 scales
    assert static["largest error (scales)"] == f"{0.1 / 0.004:.2f} (emulated, `matmul`)"
    sentences = [item for item in items if isinstance(item, str)]
    assert all(len(sentence) <= 300 for sentence in sentences)
    assert any(sentence.startswith("q_dynamic: emulated parts from native and plain at "
                                   "`matmul`") for sentence in sentences)
    answer = quantization_answer(table)
    assert answer["q_dynamic"] == (
        "q_dynamic: output SQNR 20.0-40.0 dB against its float model f over 3 devices; "
        "furthest emulated (20.0 dB), parting at `matmul`; predicted labels changed: "
        "emulated 1 of 4 (quantization_error.csv).")


def test_the_findings_hold_the_section_and_the_answer_line(tmp_path):
    path = tmp_path / "quantization_error.csv"
    _table(_rows()).to_csv(path, index=False)
    sections = dict(findings({"quantization_error": path}, {}))
    assert HEADING in sections
    assert any(line.startswith("q_dynamic: output SQNR 20.0-40.0 dB")
               for line in sections["In short"])
    text = markdown(list(sections.items()))
    assert "| q_dynamic | f | 3 | 4 | 20.0-40.0 |" in text
    assert all(len(line) <= 300 for line in text.splitlines())
    assert "Quantized models against their float model\n" in restructured_text(
        list(sections.items()))
    # no quantized model: no section
    assert HEADING not in dict(findings({}, {}))


# -- the figure ----------------------------------------------------------------------------
def _line(ax, device: str):
    return next(line for line in ax.get_lines() if line.get_label().startswith(device))


def test_the_figure_draws_each_device_per_layer_and_marks_where_one_parts(tmp_path):
    output, _ = _known()
    figure = plot_quantization_error(_table(_rows()), tmp_path / "q.pdf")
    assert (tmp_path / "q.pdf").stat().st_size > 0 and (tmp_path / "q.png").is_file()
    ax, = figure.axes
    # the final output is the last layer's tensor again: not drawn twice
    assert [label.get_text() for label in ax.get_xticklabels()] == LAYERS
    emulated = _line(ax, "emulated")
    assert list(emulated.get_xdata()) == list(range(len(LAYERS)))
    signs = np.where(np.arange(ELEMENTS) % 2, 1.0, -1.0)
    expected = [_sqnr(np.ones(ELEMENTS), np.ones(ELEMENTS) + _error_of("emulated", layer)
                      * signs) for layer in LAYERS]
    np.testing.assert_allclose(emulated.get_ydata(), expected, atol=1e-9)
    assert "labels changed 1 of 4" in emulated.get_label()
    assert "labels changed 0 of 4" in _line(ax, "native").get_label()
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [list(line.get_xdata()) for line in dashed] == [[LAYERS.index(PARTING_LAYER)] * 2]
    title = ax.get_title(loc="left")
    assert "emulated parts from the other devices" in title and "(matmul)" in title
    assert f"{output['emulated']:.1f} dB" in title


def test_a_model_compared_at_its_output_alone_is_bars_that_say_so(tmp_path):
    rows = [row for row in _rows(model="q_out") if row["layer"] == "output"]
    figure = plot_quantization_error(_table(rows), tmp_path / "q.pdf")
    ax, = figure.axes
    heights = [bar.get_height() for bar in ax.patches]
    np.testing.assert_allclose(heights, [row["sqnr_db"] for row in rows], atol=1e-9)
    assert "final output only" in ax.get_title(loc="left")
    assert "emulated falls furthest" in ax.get_title(loc="left")
    assert any("labels changed 1 of 4" in text.get_text() for text in ax.texts)


def test_a_figure_with_nothing_to_compare_says_so(tmp_path):
    figure = plot_quantization_error(pd.DataFrame(), tmp_path / "q.pdf")
    assert "nothing to compare" in figure.axes[0].texts[0].get_text()


def test_a_table_an_earlier_run_left_in_the_folder_is_not_quoted(tmp_path):
    """The workflow names the tables its run made (write_findings' inputs): a
    quantization_error.csv an earlier config left in results/tables is not read, while the
    same folder read whole (`bitdrift findings --tables`) quotes it."""
    from bitdrift.commands.tables import write_findings_of_run

    _table(_rows()).to_csv(tmp_path / "quantization_error.csv", index=False)
    given, whole = tmp_path / "given.md", tmp_path / "whole.md"
    write_findings_of_run([], {"eqc": tmp_path / "eqc.csv"}, given)
    write_findings_of_run([], tmp_path, whole)
    assert HEADING not in given.read_text()
    assert HEADING in whole.read_text()
