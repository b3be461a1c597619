"""The integer arithmetic of a quantized layer (bitdrift.analysis.integer) against values
known exactly: worked out by hand in the comments, or computed here by plain Python
integer loops and exact fractions, never by the module under test."""

import math
from fractions import Fraction

import numpy as np
import pytest

from bitdrift.analysis import integer
from bitdrift.analysis.integer import (
    EXACT,
    FIXED_POINT,
    FIXED_POINT_SINGLE,
    HALF_AWAY_FROM_ZERO,
    HALF_TO_EVEN,
    ROUNDING,
    SATURATED,
    SATURATION,
    SCALE,
    UNEXPLAINED,
    QuantizedLinear,
)


# -- the truth, by loops ---------------------------------------------------------------------
def loop_accumulate(a, b, za=0, zb=0, saturated=False):
    """Each output as a Python int: the exact sum of (a - za)(b - zb), or the AVX2 path's:
    the raw codes' products added two by two, each pair clipped to int16, then the zero
    points' terms taken off."""
    rows, depth, cols = len(a), len(b), len(b[0])
    out = [[0] * cols for _ in range(rows)]
    for i in range(rows):
        for j in range(cols):
            if not saturated:
                out[i][j] = sum((int(a[i][k]) - za) * (int(b[k][j]) - zb)
                                for k in range(depth))
                continue
            raw = 0
            for k in range(0, depth, 2):
                pair = int(a[i][k]) * int(b[k][j])
                if k + 1 < depth:
                    pair += int(a[i][k + 1]) * int(b[k + 1][j])
                raw += max(-32768, min(32767, pair))
            column = sum(int(b[k][j]) for k in range(depth))
            row = sum(int(a[i][k]) for k in range(depth))
            out[i][j] = raw - za * column - zb * row + depth * za * zb
    return np.array(out, dtype=np.int64)


def exact_round(value: Fraction, mode: str) -> int:
    if mode == HALF_TO_EVEN:
        return round(value)  # Fraction rounds ties to even
    sign = -1 if value < 0 else 1
    return sign * math.floor(abs(value) + Fraction(1, 2))


def loop_requantize(acc, multiplier: Fraction, zero_point, low, high, mode):
    return np.array([[max(low, min(high, exact_round(Fraction(int(v)) * multiplier, mode)
                                   + zero_point)) for v in row] for row in acc])


# -- accumulation ------------------------------------------------------------------------------
def test_a_saturating_layer_u8_255_times_s8_127():
    # four terms 255 x 127 = 32385: exact 4 x 32385 = 129540; the AVX2 path adds them in
    # two pairs of 64770, each clipped to 32767: 65534. With -128: pairs of -65280 clip to
    # -32768: -65536 against 4 x -32640 = -130560.
    a = np.full((1, 4), 255, np.uint8)
    b = np.array([[127, -128]] * 4, np.int8)
    assert integer.accumulate(a, b).tolist() == [[129540, -130560]]
    assert integer.accumulate(a, b, saturated=True).tolist() == [[65534, -65536]]
    assert integer.saturating_pairs(a, b) == 4
    # with the activations' zero point 128: exact 2 x 127 x 127 = 32258; the AVX2 path
    # clips the raw pair 64770 to 32767, then takes off 128 x (127 + 127) = 32512: 255
    a2 = np.full((1, 2), 255, np.uint8)
    b2 = np.full((2, 1), 127, np.int8)
    assert integer.accumulate(a2, b2, 128).tolist() == [[32258]]
    assert integer.accumulate(a2, b2, 128, saturated=True).tolist() == [[255]]


def test_a_non_saturating_layer_is_the_same_on_both_paths():
    # 1 x 5 + 2 x -6 + 3 x 7 + 4 x -8 = 5 - 12 + 21 - 32 = -18
    a = np.array([[1, 2, 3, 4]], np.uint8)
    b = np.array([[5], [-6], [7], [-8]], np.int8)
    assert integer.accumulate(a, b).tolist() == [[-18]]
    assert integer.accumulate(a, b, saturated=True).tolist() == [[-18]]
    assert integer.saturating_pairs(a, b) == 0
    # codes up to 128 times |weights| up to 127: a pair is at most 32512, never clipped
    rng = np.random.default_rng(1)
    a = rng.integers(0, 129, (5, 7)).astype(np.uint8)
    b = rng.integers(-127, 128, (7, 3)).astype(np.int8)
    truth = loop_accumulate(a, b, 3, 0)
    assert np.array_equal(integer.accumulate(a, b, 3), truth)
    assert np.array_equal(integer.accumulate(a, b, 3, saturated=True), truth)


@pytest.mark.parametrize("depth", [6, 7])  # odd K: the last pair is one product
def test_accumulation_matches_integer_loops_on_full_range_codes(depth):
    rng = np.random.default_rng(depth)
    a = rng.integers(0, 256, (6, depth)).astype(np.uint8)
    a[0] = 255
    b = rng.integers(-128, 128, (depth, 4)).astype(np.int8)
    b[:, 0] = 127
    zb = np.array([0, 2, -3, 1])
    for saturated in (False, True):
        truth = loop_accumulate(a, b, 131, 0, saturated)
        assert np.array_equal(integer.accumulate(a, b, 131, 0, saturated), truth)
    # per-channel weight zero points (exact path)
    truth = np.array([[sum((int(a[i, k]) - 131) * (int(b[k, j]) - zb[j]) for k in range(depth))
                       for j in range(4)] for i in range(6)])
    assert np.array_equal(integer.accumulate(a, b, 131, zb), truth)
    assert not np.array_equal(loop_accumulate(a, b, 131, 0, True),
                              loop_accumulate(a, b, 131, 0, False))  # row 0 saturates


def test_a_1x1_convolution_is_a_matmul_over_pixels():
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (2, 3, 2, 4)).astype(np.uint8)  # N, C, H, W
    w = rng.integers(-128, 128, (5, 3, 1, 1)).astype(np.int8)  # O, C, 1, 1
    truth = np.array([[[[sum((int(x[n, c, h, v]) - 7) * int(w[o, c, 0, 0]) for c in range(3))
                         for v in range(4)] for h in range(2)] for o in range(5)]
                      for n in range(2)])
    rows, matrix = integer.conv1x1_operands(x, w)
    acc = integer.accumulate(rows, matrix, 7)
    assert np.array_equal(integer.conv1x1_output(acc, x.shape), truth)


# -- requantisation ----------------------------------------------------------------------------
def test_quantized_multipliers_by_hand():
    # M = q x 2^(shift - 31): 0.5 = 2^30 x 2^-31; 0.25 = 2^30 x 2^-32; 0.75 x 2^31
    assert integer.quantize_multiplier(0.5) == (1 << 30, 0)
    assert integer.quantize_multiplier(0.25) == (1 << 30, -1)
    assert integer.quantize_multiplier(0.75) == (1610612736, 0)
    assert integer.quantize_multiplier(3.0) == (3 << 29, 2)


# x times 0.5 and 0.25 on exact .5 ties, each mode worked out by hand:
# 0.5: 5 -> 2.5, -5 -> -2.5, 3 -> 1.5, -3 -> -1.5. gemmlowp's doubling high multiply
# rounds round(x x 2^30 / 2^31) with its nudge: positive ties up, negative ties toward
# zero (-5 x 2^30 + 1 - 2^30 = -6 x 2^30 + 1, truncated / 2^31: -2). TFLite's single
# rounding: (x x 2^30 + 2^30) >> 31 = floor((x + 1) / 2), ties up.
# 0.25: 10 -> 2.5, -10 -> -2.5, 6 -> 1.5, -6 -> -1.5, -2 -> -0.5, 5 -> 1.25. gemmlowp:
# round(x / 2) as above, then a shift by one rounding ties away from zero; 5 -> 3 -> 2
# (double rounding: 1.25 becomes 2). Single: floor((x + 2) / 4).
TIES = {
    0.5: ([5, -5, 3, -3], {HALF_TO_EVEN: [2, -2, 2, -2], HALF_AWAY_FROM_ZERO: [3, -3, 2, -2],
                           FIXED_POINT: [3, -2, 2, -1], FIXED_POINT_SINGLE: [3, -2, 2, -1]}),
    0.25: ([10, -10, 6, -6, -2, 5], {HALF_TO_EVEN: [2, -2, 2, -2, 0, 1],
                                     HALF_AWAY_FROM_ZERO: [3, -3, 2, -2, -1, 1],
                                     FIXED_POINT: [3, -3, 2, -2, -1, 2],
                                     FIXED_POINT_SINGLE: [3, -2, 2, -1, 0, 1]}),
}


@pytest.mark.parametrize("rounding", integer.ROUNDINGS)
@pytest.mark.parametrize("multiplier", sorted(TIES))
def test_each_rounding_mode_on_exact_ties(multiplier, rounding):
    values, expected = TIES[multiplier]
    acc = np.array([values], np.int32)
    assert integer.requantize(acc, multiplier, 0, np.int8, rounding).tolist() == \
        [expected[rounding]]
    # the zero point is added after rounding, then the codes clip to the type
    assert integer.requantize(acc, multiplier, 100, np.uint8, rounding).tolist() == \
        [[v + 100 for v in expected[rounding]]]
    assert integer.requantize(np.array([[1000, -1000]], np.int32), multiplier, 0,
                              np.int8, rounding).tolist() == [[127, -128]]


def test_half_away_from_zero_just_below_a_half():
    # std::round(0.49999997f) is 0; in float32, 0.49999997 + 0.5 rounds up to 1.0
    assert integer.requantize(np.array([[1, -1]], np.int32), np.float32(0.49999997), 0,
                              np.int8, HALF_AWAY_FROM_ZERO).tolist() == [[0, 0]]


def test_unknown_rounding_is_refused_by_name():
    with pytest.raises(ValueError, match="'truncate'"):
        integer.requantize(np.zeros((1, 1), np.int32), 0.5, 0, np.int8, "truncate")


def test_dequantization_by_hand():
    # (0 - 128) x 0.5 = -64, 0, (255 - 128) x 0.5 = 63.5
    assert integer.dequantize(np.array([0, 128, 255], np.uint8), 0.5, 128).tolist() == \
        [-64.0, 0.0, 63.5]
    # 100 x (0.25 x 0.5) = 12.5
    assert integer.dequantize_accumulators(np.array([100], np.int32), 0.25, 0.5).tolist() \
        == [12.5]
    # ONNX QuantizeLinear: 2.5 / 1 rounds to even 2, +10; 300 clips to 255
    assert integer.quantize(np.array([2.5, 3.5, 300.0]), 1.0, 10).tolist() == [12, 14, 255]


# -- how two devices part -----------------------------------------------------------------------
def saturating_case():
    """A layer whose first rows saturate on the AVX2 path, requantised by 2^-14 (exact in
    float32), with its inputs."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, (6, 8)).astype(np.uint8)
    a[:2] = 255
    b = rng.integers(-127, 128, (8, 4)).astype(np.int8)
    b[:, 1] = 127
    layer = QuantizedLinear(weights=b, input_scale=1 / 16, input_zero_point=0,
                            weight_scale=1 / 16, output_scale=64.0, output_dtype=np.int8)
    return layer, a


def test_saturation_is_named_on_accumulators_and_on_requantised_codes():
    layer, a = saturating_case()
    exact = loop_accumulate(a, layer.weights)
    clipped = loop_accumulate(a, layer.weights, saturated=True)
    assert not np.array_equal(exact, clipped)
    accumulators = QuantizedLinear(layer.weights, 1 / 16, 0, 1 / 16)  # a MatMulInteger
    parting = integer.how_they_part(exact, clipped, accumulators, a)
    assert parting.verdict == SATURATION and "second" in parting.detail
    assert parting.differing == int((exact != clipped).sum())
    multiplier = Fraction(1, 16384)
    first = loop_requantize(exact, multiplier, 0, -128, 127, HALF_TO_EVEN)
    second = loop_requantize(clipped, multiplier, 0, -128, 127, HALF_TO_EVEN)
    assert not np.array_equal(first, second)
    parting = integer.how_they_part(second, first, layer, a)
    assert parting.verdict == SATURATION and "first" in parting.detail
    assert (SATURATED, HALF_TO_EVEN) in parting.first and (EXACT, HALF_TO_EVEN) in \
        parting.second
    assert integer.how_they_part(first, first, layer, a).verdict == integer.IDENTICAL


def test_rounding_is_named_with_both_modes():
    # multiplier 0.5 (scales 0.5, 1, 1): every odd accumulator is a tie
    rng = np.random.default_rng(3)
    a = rng.integers(0, 20, (5, 6)).astype(np.uint8)
    b = rng.integers(-20, 20, (6, 3)).astype(np.int8)
    layer = QuantizedLinear(weights=b, input_scale=0.5, input_zero_point=0, weight_scale=1.0,
                            output_scale=1.0, output_dtype=np.int8)
    acc = loop_accumulate(a, b)
    first = loop_requantize(acc, Fraction(1, 2), 0, -128, 127, HALF_TO_EVEN)
    second = loop_requantize(acc, Fraction(1, 2), 0, -128, 127, HALF_AWAY_FROM_ZERO)
    assert not np.array_equal(first, second)
    parting = integer.how_they_part(first, second, layer, a)
    assert parting.verdict == ROUNDING
    assert (EXACT, HALF_TO_EVEN) in parting.first
    assert (EXACT, HALF_AWAY_FROM_ZERO) in parting.second


def test_another_scale_and_the_unexplained():
    layer, a = saturating_case()
    exact = loop_accumulate(a, layer.weights)
    first = loop_requantize(exact, Fraction(1, 16384), 0, -128, 127, HALF_TO_EVEN)
    rescaled = loop_requantize(exact, Fraction(5, 4 * 16384), 0, -128, 127, HALF_TO_EVEN)
    parting = integer.how_they_part(first, rescaled, layer, a)
    assert parting.verdict == SCALE, parting
    assert f"{1 / 16384:.6g}" in parting.detail
    noise = first.copy()
    noise[1, 2] += 5
    noise[3, 0] -= 4
    assert integer.how_they_part(first, noise, layer, a).verdict == UNEXPLAINED
