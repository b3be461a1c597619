"""The effective-precision check against layers computed by hand in known formats."""

import numpy as np
import pytest
import torch

from bitdrift.analysis.effective_precision import (
    check_layer,
    describe_reduced,
    effective_precision_table,
    error_bound,
    round_significand,
    summary,
)
from bitdrift.progress import PREFIX
from bitdrift.record.reader import Record
from bitdrift.record.writer import write_record
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
    assert result["format"] == "tf32" and result["format_test"] == "operands"


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


def test_a_reduced_device_is_a_finding_named_by_its_format():
    effective = {"conv": {"reduced": False, "effective_bits": 23.0, "bound_bits": 19.0,
                          "format": "float32"},
                 "dense": {"reduced": True, "effective_bits": 7.9, "bound_bits": 17.0,
                           "format": "bfloat16"}}
    line = describe_reduced(effective, {"precision": "float32"}, "ov", "net")
    assert "'ov'" in line and "bfloat16-like, 7.9 effective bits in dense" in line
    assert summary(effective) == "reduced: bfloat16-like, 7.9 bits (1 of 2 layers)"
    assert summary(None) == "unchecked"
    assert describe_reduced({"conv": effective["conv"]}, {"precision": "float32"}, "a",
                            "b") == ""


def test_rounding_to_a_significand_matches_the_formats_own_casts():
    """round_significand against ml_dtypes' bfloat16, numpy's float16 (subnormals
    included) and TF32 as a bit mask (truncation) on random float32 values."""
    import ml_dtypes

    rng = np.random.default_rng(5)
    values = (rng.standard_normal(20_000) * np.exp2(rng.integers(-20, 12, 20_000))).astype(
        np.float32)
    wide = values.astype(np.float64)
    assert np.array_equal(round_significand(wide, 8), values.astype(ml_dtypes.bfloat16)
                          .astype(np.float64))
    assert np.array_equal(round_significand(wide, 11, min_exponent=-14),
                          values.astype(np.float16).astype(np.float64))
    truncated = (values.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    assert np.array_equal(round_significand(wide, 11, "zero"), truncated.astype(np.float64))


def _rounded(values, fmt):
    import ml_dtypes

    dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16,
             "float32": np.float32}[fmt]
    return values.astype(dtype).astype(np.float64)


@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_a_float32_layer_with_narrow_operands_is_named_by_that_format(fmt):
    """Operands rounded to bfloat16 / float16 by the formats' own casts, products summed
    in float32 (as AMX, AVX512_BF16 and XNNPACK's fp16 paths do): flagged, and named."""
    rng = np.random.default_rng(7)
    x, kernel, bias = (a.astype(np.float32) for a in _dense_case(rng, n=120, units=16))
    narrow = (_rounded(x, fmt) @ _rounded(kernel, fmt)).astype(np.float32) + bias
    result = check_layer(DENSE, x, narrow, kernel, bias, "float32")
    assert result["reduced"] and result["format_test"] == "operands"
    # float16 and TF32 share 11 bits: both explain a float16 layer of normal values
    assert result["format"] == ("bfloat16" if fmt == "bfloat16" else "tf32/float16")
    honest = (x.astype(np.float64) @ kernel.astype(np.float64) + bias).astype(np.float32)
    assert check_layer(DENSE, x, honest, kernel, bias, "float32")["format"] == "float32"


def test_a_float64_layer_in_float32_is_named_float32_and_noise_only_by_its_bound():
    rng = np.random.default_rng(8)
    x, kernel, bias = _dense_case(rng, n=80, units=12)
    in_float32 = (x.astype(np.float32) @ kernel.astype(np.float32)
                  + bias.astype(np.float32)).astype(np.float64)
    result = check_layer(DENSE, x, in_float32, kernel, bias, "float64")
    assert result["reduced"] and result["format"] == "float32"
    # relative noise of 2**-9 that no operand rounding explains: only the loose reading,
    # the widest format whose worst-case bound gamma(n + 2) covers the error
    exact = x @ kernel + bias
    noisy = exact * (1 + 2.0**-9 * rng.choice([-1, 1], exact.shape))
    loose = check_layer(DENSE, x, noisy, kernel, bias, "float64")
    worst = np.max(np.abs(noisy - exact) / (np.abs(x) @ np.abs(kernel) + np.abs(bias)))
    assert loose["relative_error"] == pytest.approx(worst, rel=1e-6)
    gamma = {bits: 82 * 2.0**-bits / (1 - 82 * 2.0**-bits) for bits in (24, 11, 8)}
    assert gamma[24] < worst <= gamma[11]
    assert loose["reduced"] and loose["format_test"] == "bound" and loose["format"] == "tf32"


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


def test_recheck_catches_a_float64_record_rounded_to_float32(small_model_copy, tmp_path):
    """A real float64 record (torch, the model's weights cast up) and a copy whose every
    layer was rounded to float32 and stored back as float64, still claiming the check it
    passed at inference. `bitdrift effective-precision --expect` recomputes from the
    activations and the .keras file: the honest one passes, the copy is reduced,
    float32-like, and the command says the record claimed otherwise."""
    import json
    import subprocess
    import sys

    import pandas as pd

    from bitdrift.run.inference import infer

    dataset, model = small_model_copy(tmp_path)
    device = {"accelerator": "cpu", "threads": 1, "batch_size": 1, "precision": "float64",
              "env": {}, "repeats": 1, "external": False, "backend": "torch"}
    # --expect checks the workflow's layout: MODEL/DEVICE.h5
    honest = tmp_path / "honest" / "small" / "torch_f64.h5"
    with open(tmp_path / "log", "w") as log:
        infer(model_name="small", device_name="torch_f64", device=device, model_path=model,
              dataset_path=dataset, samples=[0, 3], out=honest, log=log, kernels=False)
    rounded = tmp_path / "rounded" / "small" / "torch_f64.h5"
    with Record(honest) as record:
        attrs = {key: record.attr(key) for key in record._attrs}
        attrs["fingerprint"] = json.loads(attrs["fingerprint"])
        claimed = json.loads(attrs["effective_precision"])
        samples = {}
        for sample in record.samples:
            layers = [(info.name, record.tensor(sample, info).values.astype(np.float32)
                       .astype(np.float64)) for info in record.layers(sample) if not info.final]
            samples[sample] = {"output": record.tensor(sample, "output").values,
                               "layers": layers}
    assert claimed and not any(result["reduced"] for result in claimed.values())
    attrs.pop("format_version")
    write_record(rounded, attrs, samples)

    def check(path, *expect):
        out = path.parent.parent / "effective.csv"
        done = subprocess.run([sys.executable, "-m", "bitdrift", "effective-precision",
                               str(path), "--out", str(out), *expect],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return pd.read_csv(out), done.stderr

    expect = ("--expect", "small", str(model), str(dataset))
    honest_rows, _ = check(honest, *expect)
    rounded_rows, said = check(rounded, *expect)
    assert set(honest_rows["layer"]) == set(rounded_rows["layer"]) == set(claimed)
    assert not honest_rows["reduced"].any()
    assert rounded_rows["reduced"].all() and set(rounded_rows["format"]) == {"float32"}
    assert f"{rounded}: effective precision recomputed" in said
    assert "the record says reduced none" in said
    # without the model the command can only read what the record says, and says so
    _, plain = check(rounded)
    assert "as the records say" in plain and "below the declared precision: none" in plain


def test_a_matmul_of_two_activations_is_checked_from_its_recorded_operand():
    """Attention's Q @ K^T (repeats, heads, tokens, n) @ (repeats, heads, n, tokens): the
    float32 product (torch's) is float32 within its fan-in n; the same product of the
    operands rounded to bfloat16 first (by torch's own cast) is flagged and named
    bfloat16."""
    rng = np.random.default_rng(11)
    queries = rng.standard_normal((2, 3, 4, 16)).astype(np.float32)
    keys = rng.standard_normal((2, 3, 16, 4)).astype(np.float32)
    spec = {"class_name": "MatMul", "inbound": "q", "operand": "k", "activation": "linear",
            "use_bias": False}
    honest = (torch.from_numpy(queries) @ torch.from_numpy(keys)).numpy()
    good = check_layer(spec, queries, honest, keys, None, "float32")
    assert good["fan_in"] == 16 and not good["reduced"] and good["format"] == "float32"
    assert good["effective_bits"] > 20
    narrow = (torch.from_numpy(queries).bfloat16().float()
              @ torch.from_numpy(keys).bfloat16().float()).numpy()
    bad = check_layer(spec, queries, narrow, keys, None, "float32")
    assert bad["reduced"] and bad["format"] == "bfloat16"


def test_a_layer_whose_check_fails_is_unchecked_with_its_reason_and_the_others_checked():
    """check_effective_precision (the inference's check): a Dense layer whose kernel does
    not fit its recorded input is "not checked: ..." (said once in the log); the next
    layer is checked; nothing is raised."""
    import io

    from bitdrift.run.record_attrs import check_effective_precision

    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 8)).astype(np.float32)
    kernel = rng.standard_normal((8, 3))
    values = {"input": x, "good": (x.astype(np.float64) @ kernel).astype(np.float32),
              "odd": (x.astype(np.float64) @ kernel).astype(np.float32)}
    spec = {"class_name": "Dense", "inbound": "input", "activation": "linear",
            "use_bias": False}
    weights = {"weights/good/0": kernel, "weights/odd/0": rng.standard_normal((5, 3))}
    log = io.StringIO()
    found = check_effective_precision({"odd": spec, "good": spec}, weights,
                                      lambda sample, name: values[name], [0, 1],
                                      np.zeros((2, 8)), "float32", log=log, what="m on d")
    assert found["odd"]["unchecked"].startswith("not checked: ValueError: "), found["odd"]
    assert found["good"]["format"] == "float32" and not found["good"]["reduced"]
    lines = [line for line in log.getvalue().splitlines() if not line.startswith(PREFIX)]
    assert len(lines) == 1 and lines[0].startswith("bitdrift: m on d: effective precision "
                                                   "of odd: not checked: ValueError")
