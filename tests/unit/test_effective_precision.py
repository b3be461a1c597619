"""The effective-precision check against layers computed by hand in known formats."""

import numpy as np
import pytest
import torch

from bitdrift.effective_precision import (
    check_layer,
    effective_precision_table,
    error_bound,
    refuse_reduced,
    summary,
)
from bitdrift.errors import InferenceError
from bitdrift.record import Record, write_record
from tests.utils import BASE_ATTRS

DENSE = {"class_name": "Dense", "inbound": "flatten", "activation": "linear", "use_bias": True}


def _dense_case(rng, n=300, units=20, repeats=2):
    x = rng.standard_normal((repeats, n))
    kernel = rng.standard_normal((n, units))
    bias = rng.standard_normal(units)
    return x, kernel, bias


def test_float64_layer_computed_in_float32_is_flagged():
    x, kernel, bias = _dense_case(np.random.default_rng(0))
    honest = x @ kernel + bias  # float64 BLAS: a real float64 evaluation
    in_float32 = (x.astype(np.float32) @ kernel.astype(np.float32)
                  + bias.astype(np.float32)).astype(np.float64)
    good = check_layer(DENSE, x, honest, kernel, bias, "float64")
    bad = check_layer(DENSE, x, in_float32, kernel, bias, "float64")
    assert not good["reduced"] and good["effective_bits"] > 45
    assert bad["reduced"] and 18 < bad["effective_bits"] < 30
    # the bound is gamma(n + 2) of float64
    assert bad["bound_bits"] == pytest.approx(-np.log2(302 * 2.0**-53 / (1 - 302 * 2.0**-53)))


def test_float32_layer_with_tf32_inputs_is_flagged():
    """TF32 keeps 10 mantissa bits of each input: a float32 device doing so is reduced."""
    rng = np.random.default_rng(1)
    x, kernel, bias = (a.astype(np.float32) for a in _dense_case(rng, n=64))

    def tf32(values):
        bits = values.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        return bits.view(np.float32)

    honest = (x.astype(np.float64) @ kernel.astype(np.float64) + bias).astype(np.float32)
    reduced = (tf32(x).astype(np.float64) @ tf32(kernel).astype(np.float64)
               + bias).astype(np.float32)
    assert not check_layer(DENSE, x, honest, kernel, bias, "float32")["reduced"]
    result = check_layer(DENSE, x, reduced, kernel, bias, "float32")
    assert result["reduced"] and result["effective_bits"] < 14


@pytest.mark.parametrize(("padding", "strides", "dilation", "groups"),
                         [("same", 1, 1, 1), ("same", 2, 1, 1), ("valid", 1, 2, 1),
                          ("same", 1, 1, 2)])
def test_conv2d_recomputation_matches_an_independent_convolution(padding, strides, dilation,
                                                                  groups):
    """torch's float64 convolution (another implementation) is within float32's bound of
    the check's recomputation; the same output rounded to bfloat16 is not. A wrong window,
    padding or channel grouping would put every element far off."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 11, 9, 4))
    kernel = rng.standard_normal((3, 3, 4 // groups, 6))
    bias = rng.standard_normal(6)
    kh = (3 - 1) * dilation + 1
    if padding == "same":
        out_h, out_w = -(-11 // strides), -(-9 // strides)
        pad_h = max((out_h - 1) * strides + kh - 11, 0)
        pad_w = max((out_w - 1) * strides + kh - 9, 0)
    else:
        pad_h = pad_w = 0
    padded = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2),
                        (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    out = torch.nn.functional.conv2d(
        torch.from_numpy(padded).permute(0, 3, 1, 2),
        torch.from_numpy(kernel).permute(3, 2, 0, 1), torch.from_numpy(bias),
        stride=strides, dilation=dilation, groups=groups).permute(0, 2, 3, 1).numpy()
    spec = {"class_name": "Conv2D", "inbound": None, "activation": "linear",
            "use_bias": True, "strides": [strides] * 2, "padding": padding,
            "dilation_rate": [dilation] * 2, "data_format": "channels_last", "groups": groups}
    honest = out.astype(np.float32)
    result = check_layer(spec, x.astype(np.float32), honest, kernel.astype(np.float32),
                         bias.astype(np.float32), "float32")
    assert not result["reduced"] and result["effective_bits"] > 20
    assert result["fan_in"] == 9 * 4 // groups
    import ml_dtypes

    rounded = honest.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert check_layer(spec, x.astype(np.float32), rounded, kernel.astype(np.float32),
                       bias.astype(np.float32), "float32")["reduced"]


def test_relu_folded_in_and_other_activations_unchecked():
    x, kernel, bias = _dense_case(np.random.default_rng(3), n=50)
    relu = np.maximum(x @ kernel + bias, 0)
    assert not check_layer({**DENSE, "activation": "relu"}, x, relu, kernel, bias,
                           "float64")["reduced"]
    assert "unchecked" in check_layer({**DENSE, "activation": "sigmoid"}, x, relu, kernel,
                                      bias, "float64")


def test_bound_grows_with_fan_in():
    assert error_bound(10, "float32") < error_bound(1000, "float32") < 1
    assert error_bound(10_000, "bfloat16") == np.inf  # 8 bits: no bound left to test


def test_refusal_names_the_layer_unless_allowed():
    effective = {"conv": {"reduced": False, "effective_bits": 23.0, "bound_bits": 19.0},
                 "dense": {"reduced": True, "effective_bits": 11.2, "bound_bits": 17.0}}
    device = {"precision": "float32"}
    with pytest.raises(InferenceError, match="layer 'dense' computed below its declared"):
        refuse_reduced(effective, device, "gpu_tf32", "net")
    refuse_reduced(effective, {**device, "allow_reduced_precision": True}, "gpu_tf32", "net")
    assert summary(effective) == "reduced:dense" and summary(None) == "unchecked"


def test_table_lists_unchecked_records(tmp_path):
    import json

    old = tmp_path / "old.h5"
    new = tmp_path / "new.h5"
    output = {"output": np.zeros((1, 3), np.float32)}
    write_record(old, {**BASE_ATTRS, "model": "m", "device": "old"}, {0: output})
    write_record(new, {**BASE_ATTRS, "model": "m", "device": "new", "effective_precision":
                       json.dumps({"d": {"reduced": True, "effective_bits": 9.0}})},
                 {0: output})
    with Record(old) as a, Record(new) as b:
        rows = effective_precision_table([a, b])
    assert rows[0]["device"] == "old" and "without the check" in rows[0]["unchecked"]
    assert rows[1]["layer"] == "d" and rows[1]["reduced"] is True
