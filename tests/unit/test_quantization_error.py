"""A quantized model's distance to its float model (bitdrift.analysis.quantization_error)
on hand-built cases: the SQNR and the largest error worked by hand, the labels that
change, and the scales a hand-built QDQ graph fixes."""

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bitdrift.analysis.quantization_error import (
    changed_labels,
    largest_error,
    sqnr_db,
    tensor_scales,
)


def test_the_sqnr_and_the_largest_error_are_the_hand_worked_ones():
    # signal 3^2 + 4^2 = 25, noise 0^2 + 1^2 = 1: 10 log10(25) dB; the largest error 1
    assert sqnr_db([3.0, 4.0], [3.0, 3.0]) == pytest.approx(13.979400086720377, abs=1e-12)
    assert largest_error([3.0, 4.0], [3.0, 3.0]) == 1.0
    # float32 inputs are compared in float64: 1 + 2^-23 against 1 is one ulp off
    one, next_up = np.float32(1), np.nextafter(np.float32(1), np.float32(2))
    assert sqnr_db([one], [next_up]) == pytest.approx(20 * 23 * math.log10(2), abs=1e-9)
    assert sqnr_db([1.0, 2.0], [1.0, 2.0]) == math.inf
    assert sqnr_db([0.0], [1.0]) == -math.inf


def test_the_labels_that_change_are_counted_over_the_last_axis():
    reference = np.array([[[0.1, 0.9], [0.8, 0.2]], [[0.6, 0.4], [0.3, 0.7]]])
    quantized = np.array([[[0.1, 0.9], [0.4, 0.6]], [[0.6, 0.4], [0.3, 0.7]]])
    assert changed_labels(reference, quantized) == (4, 1)


def test_the_scales_are_those_the_qdq_graph_fixes(tmp_path):
    """x -> QuantizeLinear(0.25) -> DequantizeLinear -> Relu -> y_QuantizeLinear_Input ->
    QuantizeLinear(0.5) -> DequantizeLinear -> y, as ONNX Runtime's QDQ format names
    them; a per-channel scale is no single scale."""
    constants = [numpy_helper.from_array(np.array(value, np.float32), name)
                 for name, value in (("x_scale", 0.25), ("y_scale", 0.5),
                                     ("w_scale", [0.1, 0.2]))]
    constants += [numpy_helper.from_array(np.array(0, np.uint8), "zero"),
                  numpy_helper.from_array(np.zeros(2, np.uint8), "zeros")]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "zero"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "x_scale", "zero"], ["xd"]),
        helper.make_node("QuantizeLinear", ["xd", "w_scale", "zeros"], ["wq"], axis=1),
        helper.make_node("DequantizeLinear", ["wq", "w_scale", "zeros"], ["wd"], axis=1),
        helper.make_node("Relu", ["wd"], ["y_QuantizeLinear_Input"]),
        helper.make_node("QuantizeLinear", ["y_QuantizeLinear_Input", "y_scale", "zero"],
                         ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "y_scale", "zero"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, tmp_path / "qdq.onnx")
    assert tensor_scales(tmp_path / "qdq.onnx") == {"x": 0.25, "y": 0.5, "output": 0.5}
