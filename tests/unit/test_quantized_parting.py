"""Where a quantized model's devices part (bitdrift.analysis.quantized_parting), on
hand-built ONNX graphs whose integers are known: a dynamically quantized matmul
(DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul -> Add) recorded on ONNX Runtime,
whose u8 x s8 pairs overflow int16, so that this CPU's int32 accumulators are the exact
replay with VNNI or AMX and the saturated one without (derived from the CPU's flags, never
assumed); the other path's device written by hand from numpy's replay; a QLinearMatMul
whose two devices round ties two ways; a float op that parts first. The record keeps the
integers with their own dtype, scale and zero point, and recording every layer leaves the
final output's bits as a plain ONNX Runtime session gives them."""

import json

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import TensorProto, helper, numpy_helper

from bitdrift.analysis import integer
from bitdrift.analysis.eqc import precision_rows
from bitdrift.analysis.quantized_parting import (
    compare_pair,
    parting_table,
    write_parting_table,
)
from bitdrift.config import validate_config
from bitdrift.record.reader import Record
from bitdrift.record.writer import write_record
from bitdrift.report.findings import findings
from bitdrift.report.findings.quantized_parting import HEADING, quantized_parting
from bitdrift.run.devices import cpu_info
from bitdrift.run.inference import infer

# the instruction sets that multiply u8 by s8 into int32 exactly (as test_quantized_cpus)
EXACT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
SAMPLES = [0, 1, 2]
# weights (K=4, N=3): column 0 puts 127 on a neighbouring pair, so two codes of 255 make
# 2 x 255 x 127 = 64770 > 32767 (vpmaddubsw saturates); column 2 stays small
WEIGHTS = np.array([[127, 3, 1], [127, -5, 2], [-90, 7, -1], [-128, 0, 1]], np.int8)
WEIGHT_SCALE = np.float32(0.02)
BIAS = np.array([0.5, -0.25, 0.125], np.float32)


def host_path() -> str:
    flags = cpu_info().get("flags", [])
    return integer.EXACT if any(flag in flags for flag in EXACT_FLAGS) else integer.SATURATED


def dynamic_model(path):
    """x (batch, 4) float -> DynamicQuantizeLinear -> MatMulInteger(int8 weights) -> Cast
    -> Mul(x scale x weight scale) -> Add(bias) -> y, as quantize_dynamic writes it."""
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["scale"]),
        helper.make_node("Mul", ["accf", "scale"], ["product"]),
        helper.make_node("Add", ["product", "b"], ["y"])]
    graph = helper.make_graph(
        nodes, "dynamic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        [numpy_helper.from_array(WEIGHTS, "w"),
         numpy_helper.from_array(np.array(0, np.int8), "wz"),
         numpy_helper.from_array(WEIGHT_SCALE, "ws"), numpy_helper.from_array(BIAS, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def dynamic_inputs(path):
    # each row's largest value quantizes to 255 twice in the first pair (zero point 0 for
    # the non-negative rows), so the pairs against column 0 overflow int16
    inputs = np.array([[4.0, 4.0, 1.0, 0.5], [3.0, 3.0, 0.0, 2.0], [2.0, 2.0, -1.0, 0.25]],
                      np.float32)
    np.save(path, inputs)
    return inputs


def record_on_ort(folder, name, level, **settings):
    model, inputs = folder / "dynamic.onnx", folder / "inputs.npy"
    device = validate_config({"models": {"q": {"file": str(model), "inputs": str(inputs)}},
                              "devices": {name: {"accelerator": "cpu",
                                                 "backend": "onnxruntime", "threads": 1,
                                                 "batch_size": 1,
                                                 "graph_optimization_level": level,
                                                 **settings}},
                              "samples": SAMPLES})["devices"][name]
    out = folder / f"{name}.h5"
    with open(folder / f"{name}.log", "w") as log:
        infer(model_name="q", device_name=name, device=device, model_path=model,
              dataset_path=inputs, samples=SAMPLES, out=out, layers=True, kernels=False,
              log=log)
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quantized_parting")
    dynamic_model(folder / "dynamic.onnx")
    inputs = dynamic_inputs(folder / "inputs.npy")
    return folder, inputs, {level: record_on_ort(folder, f"ort_{level}", level)
                            for level in ("disable_all", "all")}


def dynamic_quantize(row):
    """ONNX's DynamicQuantizeLinear in numpy: (codes, scale, zero point)."""
    low, high = min(0.0, float(row.min())), max(0.0, float(row.max()))
    scale = np.float32((high - low) / 255)
    zero_point = np.uint8(np.clip(np.rint(-low / scale), 0, 255))
    return integer.quantize(row, scale, zero_point, np.uint8), scale, zero_point


def replayed(row, path):
    codes, _, zero_point = dynamic_quantize(row)
    layer = integer.QuantizedLinear(weights=WEIGHTS, input_scale=1.0,
                                    input_zero_point=int(zero_point), weight_scale=1.0)
    return integer.layer_outputs(layer, codes[None], path == integer.SATURATED)[0]


def test_the_integer_layers_are_recorded_as_integers_with_scale_and_zero_point(recorded):
    folder, inputs, records = recorded
    with Record(records["disable_all"]) as record:
        classes = {info.name: info.class_name for info in record.layers(0)}
        assert classes["xq"] == "DynamicQuantizeLinear"
        assert classes["acc"] == "MatMulInteger"
        for sample in SAMPLES:
            codes, scale, zero_point = dynamic_quantize(inputs[sample])
            found = record.tensor(sample, "xq").values[0]
            assert found.dtype == np.uint8 and np.array_equal(found, codes)
            params = record.quantization(sample, "xq")
            assert params["scale_layer"] == "xs" and params["zero_point_layer"] == "xz"
            assert np.isclose(float(params["scale"].reshape(-1)[0]), scale, rtol=1e-6)
            assert int(params["zero_point"].reshape(-1)[0]) == zero_point
            accumulators = record.tensor(sample, "acc").values[0]
            assert accumulators.dtype == np.int32
            assert record.quantization(sample, "acc")["weight_zero_point"].tolist() == [0]
            # this CPU's path, from its flags: the exact replay or the saturated one
            assert np.array_equal(accumulators, replayed(inputs[sample], host_path()))
            assert not np.array_equal(replayed(inputs[sample], integer.EXACT),
                                      replayed(inputs[sample], integer.SATURATED))


def test_ort_s_x64quantprecision_entry_sums_exactly_on_a_cpu_without_vnni(recorded):
    """ONNX Runtime's int8 option session.x64quantprecision (a device's session_config) on
    an emulated Haswell (AVX2, no VNNI), the graph fused (MatMulIntegerToFloat): without it
    the u8 x s8 pairs saturate in int16; with it the outputs are those of the exact int32
    sums (numpy: the exact replay's accumulators x the scales + the bias, in float32), bit
    for bit. (Unfused, at disable_all, the entry changes nothing: MatMulInteger saturates.)"""
    folder, inputs, _ = recorded
    found = {}
    for name, entries in (("haswell", {}), ("haswell_precise",
                                            {"session.x64quantprecision": "1"})):
        path = record_on_ort(folder, name, "all", emulate="Haswell-v4",
                             **({"session_config": entries} if entries else {}))
        with Record(path) as record:
            found[name] = [record.tensor(sample, "output").values[0] for sample in SAMPLES]

    def expected(sample, path):
        _, scale, _ = dynamic_quantize(inputs[sample])
        return replayed(inputs[sample], path).astype(np.float32) * (scale * WEIGHT_SCALE) \
            + BIAS

    for sample in SAMPLES:
        assert np.array_equal(found["haswell"][sample], expected(sample, integer.SATURATED))
        assert np.array_equal(found["haswell_precise"][sample],
                              expected(sample, integer.EXACT))
        assert not np.array_equal(expected(sample, integer.EXACT),
                                  expected(sample, integer.SATURATED))


def test_recording_every_layer_leaves_the_final_output_as_a_plain_run_gives_it(recorded):
    import onnxruntime as ort

    folder, inputs, records = recorded
    for level, path in records.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, {"all": "ORT_ENABLE_ALL",
                                         "disable_all": "ORT_DISABLE_ALL"}[level])
        session = ort.InferenceSession(str(folder / "dynamic.onnx"), options,
                                       providers=["CPUExecutionProvider"])
        with Record(path) as record:
            for sample in SAMPLES:
                plain = session.run(None, {"x": inputs[sample:sample + 1]})[0][0]
                output = record.instrumented_output(sample).values[0]
                assert output.view(np.uint32).tolist() == plain.view(np.uint32).tolist()


def test_remaining_precision_says_why_an_integer_layer_has_none(recorded):
    folder, _, records = recorded
    copy = rewrite(records["disable_all"], folder / "copy.h5", "copy",
                   lambda sample, values: None)
    opened = [Record(records["disable_all"]), Record(copy)]
    try:
        rows = {row["layer"]: row for row in precision_rows(opened) if row["sample"] == 0}
    finally:
        for record in opened:
            record.close()
    assert "uint8 integers" in rows["xq"]["not_analysed"]
    assert "int32 integers" in rows["acc"]["not_analysed"]
    assert np.isnan(rows["acc"]["remaining_precision"]) and rows["acc"]["n_eqc"] == 1
    assert rows["y"]["not_analysed"] is None  # the float output is measured as before


def rewrite(source, out, device, change):
    """A copy of the record at ``source`` as device ``device``: every layer and the final
    output as recorded, then ``change(sample, {name: values})`` edits them."""
    with Record(source) as record:
        attrs = {key: record.attr(key) for key in
                 ("model", "backend", "precision", "model_sha256", "input_sha256")}
        attrs["fingerprint"] = json.loads(record.attr("fingerprint"))
        samples = {}
        for sample in SAMPLES:
            infos = [info for info in record.layers(sample) if not info.final]
            values = {info.name: record.tensor(sample, info).values[0] for info in infos}
            values["output"] = record.instrumented_output(sample).values[0]
            change(sample, values)
            samples[sample] = {"output": values.pop("output")[None],
                               "layers": [(name, value[None])
                                          for name, value in values.items()],
                               "layer_classes": [info.class_name for info in infos]}
    write_record(out, {**attrs, "device": device}, samples)
    return out


def dequantized(accumulators, sample_scale):
    """The graph's float32 Cast -> Mul -> Add of int32 accumulators."""
    scale = np.float32(np.float32(sample_scale) * WEIGHT_SCALE)
    product = accumulators.astype(np.float32) * scale
    return product, product + BIAS


def test_a_pair_parting_by_saturation_is_named_and_each_device_replayed(recorded):
    folder, inputs, records = recorded
    other = integer.SATURATED if host_path() == integer.EXACT else integer.EXACT

    def other_path(sample, values):
        accumulators = replayed(inputs[sample], other)
        values["acc"] = accumulators
        values["accf"] = accumulators.astype(np.float32)
        values["product"], values["output"] = dequantized(accumulators, values["xs"])

    other_record = rewrite(records["disable_all"], folder / "other.h5", "other_cpu",
                           other_path)
    with Record(records["disable_all"]) as host, Record(other_record) as second:
        row = compare_pair("q", host, second, *graph(folder / "dynamic.onnx"))
    assert row["layer"] == "acc" and row["op"] == "MatMulInteger" and row["integer_layer"]
    assert row["cause"] == integer.SATURATION
    pairs = sum(integer.saturating_pairs(dynamic_quantize(inputs[sample])[0][None], WEIGHTS)
                for sample in SAMPLES)
    assert row["overflowing_pairs"] == pairs > 0
    saturated = f"saturated-16-bit replay bit for bit, {pairs} pairs overflow"
    exact = "exact int32 replay bit for bit"
    expected = (exact, saturated) if host_path() == integer.EXACT else (saturated, exact)
    assert row["first_replay"] == f"its integers = {expected[0]}"
    assert row["second_replay"] == f"its integers = {expected[1]}"
    # against the device whose graph fused the matmul with its dequantization, the first
    # layer both hold is the float product: the accumulators are recovered from it
    with Record(records["all"]) as fused, Record(other_record) as second:
        row = compare_pair("q", fused, second, *graph(folder / "dynamic.onnx"))
    assert row["cause"] == integer.SATURATION
    assert row["first_replay"].startswith("its accumulators (recovered from its float")
    assert row["first_replay"].endswith(expected[0])
    assert row["second_replay"] == f"its integers = {expected[1]}"
    # the table, and the findings' section of it
    write_parting_table([("q", folder / "dynamic.onnx",
                          [records["disable_all"], records["all"], other_record])],
                        folder / "quantized_parting.csv")
    table = pd.read_csv(folder / "quantized_parting.csv")
    assert set(zip(table["first_device"], table["second_device"], strict=True)) == {
        ("ort_disable_all", "other_cpu"), ("ort_all", "other_cpu")}
    items = quantized_parting(table)
    assert "2 pair(s)" in items[0] and "in 2 pair(s) each device's" in items[0]
    # the fused graph's first layer in common with the other is its final output; each
    # group names its pair and what the replay found of each device's integers
    assert list(items[1]["first parting layer"]) == ["acc", "output"]
    assert list(items[1]["pairs"]) == ["1: ort_disable_all / other_cpu",
                                       "1: ort_all / other_cpu"]
    paths = {integer.EXACT: "exact int32", integer.SATURATED: "saturated 16-bit"}
    for cell, host in zip(items[1]["integers, by the numpy replay"], ("ort_disable_all",
                                                                       "ort_all"),
                          strict=True):
        assert f"{paths[host_path()]}" in cell.split(f": {host}")[0].rsplit("; ", 1)[-1]
    sections = dict(findings({"quantized_parting": folder / "quantized_parting.csv"}, {}))
    assert HEADING in sections


def test_a_float_op_parting_first_is_named_and_nothing_replayed(recorded):
    folder, _, records = recorded

    def later(sample, values):  # one ulp in the float product, the integers alike
        values["product"] = np.nextafter(values["product"], np.inf, dtype=np.float32)
        values["output"] = values["product"] + BIAS

    moved = rewrite(records["disable_all"], folder / "moved.h5", "moved", later)
    with Record(records["disable_all"]) as host, Record(moved) as second:
        row = compare_pair("q", host, second, *graph(folder / "dynamic.onnx"))
        assert row["layer"] == "product" and not row["integer_layer"]
        assert row["cause"] == "the first parting layer is not an integer layer (float op Mul)"
        assert row["first_replay"] == row["second_replay"] == ""
        # a device against itself does not part: no row
        assert compare_pair("q", host, host, *graph(folder / "dynamic.onnx")) is None


def graph(path):
    from bitdrift.analysis.quantized_parting import _graph

    return _graph(path)


# -- a QLinearMatMul whose devices round ties two ways -------------------------------------
def qlinear_model(path):
    """x float -> QuantizeLinear(scale 1, zero point 0) -> QLinearMatMul (input scale 1,
    weight scale 1, output scale 2: every odd accumulator a tie) -> DequantizeLinear."""
    weights = np.array([[1, 2], [3, -1], [2, 5]], np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "one", "zero_u8"], ["xq"]),
             helper.make_node("QLinearMatMul", ["xq", "one", "zero_u8", "w", "one",
                                                "zero_s8", "two", "zero_u8"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "two", "zero_u8"], ["y"])]
    graph_proto = helper.make_graph(
        nodes, "qlinear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])],
        [numpy_helper.from_array(weights, "w"),
         numpy_helper.from_array(np.array(1, np.float32), "one"),
         numpy_helper.from_array(np.array(2, np.float32), "two"),
         numpy_helper.from_array(np.array(0, np.uint8), "zero_u8"),
         numpy_helper.from_array(np.array(0, np.int8), "zero_s8")])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return weights


def test_a_pair_parting_by_rounding_is_named_with_each_mode(tmp_path):
    weights = qlinear_model(tmp_path / "qlinear.onnx")
    codes = {0: np.array([[1, 0, 2]], np.uint8), 1: np.array([[1, 0, 0]], np.uint8)}
    layer = integer.QuantizedLinear(weights=weights, input_scale=1.0, input_zero_point=0,
                                    weight_scale=1.0, output_scale=2.0, output_zero_point=0,
                                    output_dtype=np.uint8)
    attrs = {"model": "q", "backend": "onnxruntime", "precision": "float32",
             "fingerprint": {}, "model_sha256": "m", "input_sha256": "i"}
    paths = []
    for device, rounding in (("even", integer.HALF_TO_EVEN),
                             ("away", integer.HALF_AWAY_FROM_ZERO)):
        samples = {}
        for sample, rows in codes.items():
            out = integer.layer_outputs(layer, rows, rounding=rounding)
            samples[sample] = {"output": integer.dequantize(out, 2.0, 0)[None],
                               "layers": [("xq", rows[None]), ("yq", out[None])],
                               "layer_classes": ["QuantizeLinear", "QLinearMatMul"]}
        paths.append(tmp_path / f"{device}.h5")
        write_record(paths[-1], {**attrs, "device": device}, samples)
    # accumulators 5 and 12 (sample 0), 1 and 2 (sample 1): 5/2 and 1/2 are ties, which
    # the two modes round apart (2 against 3, 0 against 1)
    assert integer.accumulate(codes[0], weights).tolist() == [[5, 12]]
    rows = parting_table([("q", tmp_path / "qlinear.onnx", paths)])
    assert len(rows) == 1
    row = rows[0]
    assert row["layer"] == "yq" and row["op"] == "QLinearMatMul" and row["integer_layer"]
    assert row["cause"] == integer.ROUNDING
    same = "bit for bit (the saturated 16-bit path gives the same: no pair overflows)"
    assert row["first_replay"] == f"its integers = exact int32 replay, rounded half_to_even {same}"
    # on positive ties the fixed-point modes round up as half away from zero does: the
    # verdict names every mode the integers are
    assert row["second_replay"] == ("its integers = exact int32 replay, rounded fixed_point "
                                    "or fixed_point_single_rounding or half_away_from_zero "
                                    f"{same}")
    assert row["overflowing_pairs"] == 0


def test_a_requantising_layers_verdicts_read_in_the_findings_with_their_rounding():
    """The analysis' verdict of a QLinearMatMul names its rounding ("exact int32 replay,
    rounded half_to_even bit for bit"); the findings' column keeps it as exact int32 (or
    saturated, with its overflow count), and a verdict of neither replay as such."""
    from bitdrift.report.findings.quantized_parting import _verdict

    assert _verdict("its integers = exact int32 replay, rounded half_to_even bit for bit") \
        == "exact int32"
    assert _verdict("its integers = saturated-16-bit replay, rounded half_away bit for "
                    "bit, 12 pairs overflow") == "saturated 16-bit (12 pairs overflow)"
    assert _verdict("its integers: replay matches neither (no replay gives them)") == \
        "neither replay"
    assert _verdict("") == ""
