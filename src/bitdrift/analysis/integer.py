"""A quantized layer's integer arithmetic replayed in numpy: a linear layer (a MatMul, a
MatMulInteger, a 1x1 convolution taken as one) from its uint8/int8 inputs, int8 weights,
scales and zero points, as the CPU kernels compute it, and how two devices' integer
results part.

The accumulation is int32, exact, on a CPU with VNNI (``vpdpbusd`` adds four u8 x s8
products into an int32) or AMX. On an AVX2 CPU without VNNI, MLAS and oneDNN multiply u8
activations by s8 weights with ``vpmaddubsw``, which adds each two neighbouring products
along K into an int16 and SATURATES it (255 x 127 + 255 x 127 = 64770 becomes 32767),
then ``vpmaddwd`` widens those into int32 exactly: the saturated path. The kernels feed it
the raw codes and subtract the zero points' terms after (the row and column sums), so the
saturation acts on the raw u8 x s8 products.

Requantisation (an int32 accumulator to an int8/uint8 output) rounds one of four ways:
round half to even (a float32 product rounded by the current mode: ``nearbyintf``, SSE's
``cvtps2dq``; MLAS, ONNX's reference), half away from zero (``std::round``), gemmlowp's
and TFLite's fixed-point multiplier and shift (``MultiplyByQuantizedMultiplier``: a
rounding doubling high multiply, then a rounding right shift) and TFLite's single-rounding
variant of it (``TFLITE_SINGLE_ROUNDING``: one rounding, half up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT16_MIN, INT16_MAX = -(1 << 15), (1 << 15) - 1
HALF_TO_EVEN = "half_to_even"
HALF_AWAY_FROM_ZERO = "half_away_from_zero"
FIXED_POINT = "fixed_point"  # gemmlowp / TFLite MultiplyByQuantizedMultiplier
FIXED_POINT_SINGLE = "fixed_point_single_rounding"  # TFLite built with TFLITE_SINGLE_ROUNDING
ROUNDINGS = (HALF_TO_EVEN, HALF_AWAY_FROM_ZERO, FIXED_POINT, FIXED_POINT_SINGLE)
EXACT = "int32"  # VNNI, AMX, or any exact int32 accumulation
SATURATED = "int16 pairs saturated"  # AVX2 vpmaddubsw without VNNI
ACCUMULATIONS = (EXACT, SATURATED)
# How two devices' integer outputs of one layer part (how_they_part)
IDENTICAL = "identical"
ROUNDING = "off by one in the last integer step (rounding)"
SATURATION = "saturated 16-bit intermediate"
SCALE = "another requantisation scale"
UNEXPLAINED = "unexplained"
PARTINGS = (IDENTICAL, ROUNDING, SATURATION, SCALE, UNEXPLAINED)


@dataclass(frozen=True)
class QuantizedLinear:
    """A quantized linear layer: y = x @ W (+ bias), x and W as integer codes.
    ``weights``: (K, N) int8 or uint8 codes; ``weight_scale`` and ``weight_zero_point``:
    a scalar, or one per output column (per channel). ``bias``: int32 (N,), in units of
    input_scale x weight_scale (as QLinearConv and TFLite hold it), or None.
    ``output_scale`` None: the layer's integer result is its int32 accumulator (a
    MatMulInteger, dynamic quantization dequantizes it); else it is requantised to
    ``output_dtype`` codes with that scale and ``output_zero_point``."""

    weights: np.ndarray
    input_scale: float
    input_zero_point: int
    weight_scale: float | np.ndarray
    weight_zero_point: int | np.ndarray = 0
    bias: np.ndarray | None = None
    output_scale: float | None = None
    output_zero_point: int = 0
    output_dtype: type = np.int8

    def multiplier(self) -> np.ndarray:
        """The requantisation multiplier input_scale x weight_scale / output_scale, per
        output column (float64: the runtimes derive theirs from it)."""
        if self.output_scale is None:
            raise ValueError("the layer has no output scale: its result is the accumulator")
        return (np.float64(self.input_scale) * np.asarray(self.weight_scale, np.float64)
                / np.float64(self.output_scale))


# -- accumulation ------------------------------------------------------------------------------
def accumulate(inputs: np.ndarray, weights: np.ndarray, input_zero_point=0,
               weight_zero_point=0, saturated: bool = False) -> np.ndarray:
    """The int32 accumulators (M, N) of (inputs - input_zero_point) @ (weights -
    weight_zero_point), ``inputs`` (M, K) and ``weights`` (K, N) integer codes. Exact, or
    ``saturated``: the AVX2 path, the raw codes' products added in neighbouring pairs along
    K (K padded with a zero) into saturated int16, those summed in int32, then the zero
    points' terms (exact) taken off; it multiplies u8 activations by s8 weights only."""
    a = np.asarray(inputs)
    b = np.asarray(weights)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"inputs {a.shape} and weights {b.shape} are no (M, K) @ (K, N)")
    za = np.int64(input_zero_point)
    zb = np.asarray(weight_zero_point, np.int64)
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    if not saturated:
        total = (a64 - za) @ (b64 - zb)
    else:
        if a.dtype != np.uint8 or b.dtype != np.int8:
            raise ValueError(f"the saturating vpmaddubsw path multiplies uint8 by int8, not "
                             f"{a.dtype} by {b.dtype}")
        if a.shape[1] % 2:
            a64 = np.pad(a64, ((0, 0), (0, 1)))
            b64 = np.pad(b64, ((0, 1), (0, 0)))
        pairs = (a64[:, 0::2, None] * b64[None, 0::2, :]
                 + a64[:, 1::2, None] * b64[None, 1::2, :])
        raw = np.clip(pairs, INT16_MIN, INT16_MAX).sum(axis=1)
        depth = a.shape[1]
        total = (raw - za * b64.sum(axis=0)[None, :] - zb * a64.sum(axis=1)[:, None]
                 + depth * za * zb)
    if total.size and (total.min() < INT32_MIN or total.max() > INT32_MAX):
        raise ValueError("the accumulators overflow int32")
    return total.astype(np.int32)


def saturating_pairs(inputs: np.ndarray, weights: np.ndarray) -> int:
    """How many neighbouring u8 x s8 product pairs overflow int16 (the AVX2 path clips
    them), over every output of ``inputs`` (M, K) @ ``weights`` (K, N)."""
    a = np.asarray(inputs).astype(np.int64)
    b = np.asarray(weights).astype(np.int64)
    if a.shape[1] % 2:
        a, b = np.pad(a, ((0, 0), (0, 1))), np.pad(b, ((0, 1), (0, 0)))
    pairs = a[:, 0::2, None] * b[None, 0::2, :] + a[:, 1::2, None] * b[None, 1::2, :]
    return int(((pairs < INT16_MIN) | (pairs > INT16_MAX)).sum())


def conv1x1_operands(inputs: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A 1x1 convolution (stride 1, no padding, one group) as a matmul: ``inputs`` (N, C,
    H, W) to rows (N x H x W, C), ``weights`` (O, C, 1, 1) to (C, O). conv1x1_output puts
    the product back in (N, O, H, W)."""
    if inputs.ndim != 4 or weights.ndim != 4 or weights.shape[2:] != (1, 1) or \
            weights.shape[1] != inputs.shape[1]:
        raise ValueError(f"no 1x1 convolution of inputs {inputs.shape} by weights "
                         f"{weights.shape}")
    rows = inputs.transpose(0, 2, 3, 1).reshape(-1, inputs.shape[1])
    return rows, weights[:, :, 0, 0].T


def conv1x1_output(products: np.ndarray, input_shape: tuple) -> np.ndarray:
    """The (N x H x W, O) product of conv1x1_operands back as (N, O, H, W)."""
    batch, _, height, width = input_shape
    return products.reshape(batch, height, width, -1).transpose(0, 3, 1, 2)


# -- requantisation ----------------------------------------------------------------------------
def _round_half_away(value: float) -> int:
    return int(math.copysign(math.floor(abs(value) + 0.5), value))


def quantize_multiplier(multiplier: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier: (int32 q, shift) with multiplier = q x 2^(shift - 31),
    q in [2^30, 2^31) rounded half away from zero (TfLiteRound)."""
    if multiplier == 0:
        return 0, 0
    fraction, shift = math.frexp(float(multiplier))
    fixed = _round_half_away(fraction * (1 << 31))
    if fixed == 1 << 31:
        fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return fixed, shift


def _truncating_divide(values: np.ndarray, divisor: int) -> np.ndarray:
    """C's integer division: toward zero."""
    return np.sign(values) * (np.abs(values) // divisor)


def saturating_rounding_doubling_high_mul(a: np.ndarray, b) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul: round(a x b / 2^31) with its nudge
    (ties up for positive products, toward zero for negative), int32 a and b."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    product = a * b
    nudge = np.where(product >= 0, 1 << 30, 1 - (1 << 30))
    high = _truncating_divide(product + nudge, 1 << 31)
    return np.where((a == b) & (a == INT32_MIN), INT32_MAX, high)


def rounding_divide_by_pot(values: np.ndarray, exponent) -> np.ndarray:
    """gemmlowp's RoundingDivideByPOT: values / 2^exponent, ties away from zero."""
    values = np.asarray(values, np.int64)
    exponent = np.asarray(exponent, np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = values & mask
    threshold = (mask >> 1) + (values < 0)
    return (values >> exponent) + (remainder > threshold)


def multiply_by_quantized_multiplier(values: np.ndarray, multiplier, shift,
                                     single_rounding: bool = False) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier(x, q, shift) on int32 ``values`` (q and shift
    per output column or scalars): gemmlowp's two roundings, or ``single_rounding``'s one
    (round(x x q / 2^(31 - shift)), ties up)."""
    x = np.asarray(values, np.int64)
    q = np.asarray(multiplier, np.int64)
    shift = np.asarray(shift, np.int64)
    if single_rounding:
        total_shift = 31 - shift
        return (x * q + (np.int64(1) << (total_shift - 1))) >> total_shift
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    shifted = np.clip(x << left, INT32_MIN, INT32_MAX)
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(shifted, q), right)


def requantize(accumulators: np.ndarray, multiplier, zero_point: int, dtype=np.int8,
               rounding: str = HALF_TO_EVEN) -> np.ndarray:
    """int32 ``accumulators`` (.., N) to ``dtype`` codes: accumulator x ``multiplier``
    (scalar or per column) rounded by ``rounding`` (ROUNDINGS), plus ``zero_point``,
    clipped to the type. The float modes multiply in float32, as the kernels do."""
    acc = np.asarray(accumulators, np.int32)
    if rounding in (HALF_TO_EVEN, HALF_AWAY_FROM_ZERO):
        scaled = acc.astype(np.float32) * np.asarray(multiplier, np.float32)
        if rounding == HALF_TO_EVEN:
            rounded = np.rint(scaled)
        else:
            # in float64, where |x| + 0.5 is exact (in float32 0.49999997 + 0.5 rounds up
            # to 1, where std::round gives 0)
            wide = scaled.astype(np.float64)
            rounded = np.copysign(np.floor(np.abs(wide) + 0.5), wide)
        rounded = rounded.astype(np.int64)
    elif rounding in (FIXED_POINT, FIXED_POINT_SINGLE):
        pairs = [quantize_multiplier(m) for m in np.atleast_1d(np.asarray(multiplier,
                                                                          np.float64))]
        fixed = np.array([q for q, _ in pairs], np.int64)
        shifts = np.array([s for _, s in pairs], np.int64)
        if np.ndim(multiplier) == 0:
            fixed, shifts = fixed[0], shifts[0]
        rounded = multiply_by_quantized_multiplier(acc, fixed, shifts,
                                                   rounding == FIXED_POINT_SINGLE)
    else:
        raise ValueError(f"unknown rounding {rounding!r} (known: {', '.join(ROUNDINGS)})")
    info = np.iinfo(dtype)
    return np.clip(rounded + np.int64(zero_point), info.min, info.max).astype(dtype)


def layer_outputs(layer: QuantizedLinear, inputs: np.ndarray, saturated: bool = False,
                  rounding: str = HALF_TO_EVEN) -> np.ndarray:
    """The layer's integer result for ``inputs`` (M, K) codes: its int32 accumulators
    (plus the bias), requantised by ``rounding`` where the layer has an output scale."""
    acc = accumulate(inputs, layer.weights, layer.input_zero_point, layer.weight_zero_point,
                     saturated)
    if layer.bias is not None:
        acc = (acc.astype(np.int64) + np.asarray(layer.bias, np.int64)).astype(np.int32)
    if layer.output_scale is None:
        return acc
    return requantize(acc, layer.multiplier(), layer.output_zero_point, layer.output_dtype,
                      rounding)


# -- quantization and dequantization ------------------------------------------------------------
def quantize(values: np.ndarray, scale: float, zero_point: int, dtype=np.uint8) -> np.ndarray:
    """ONNX's QuantizeLinear: saturate(round_half_even(x / scale) + zero_point), float32."""
    info = np.iinfo(dtype)
    scaled = np.rint(np.asarray(values, np.float32) / np.float32(scale))
    return np.clip(scaled + zero_point, info.min, info.max).astype(dtype)


def dequantize(codes: np.ndarray, scale, zero_point) -> np.ndarray:
    """ONNX's DequantizeLinear: (codes - zero_point) x scale in float32."""
    shifted = np.asarray(codes, np.int32) - np.asarray(zero_point, np.int32)
    return shifted.astype(np.float32) * np.asarray(scale, np.float32)


def dequantize_accumulators(accumulators: np.ndarray, input_scale, weight_scale) -> np.ndarray:
    """A MatMulInteger's int32 result as quantize_dynamic's graph makes it float: Cast to
    float32, times (input_scale x weight_scale) taken in float32 first."""
    scale = np.float32(input_scale) * np.asarray(weight_scale, np.float32)
    return np.asarray(accumulators, np.int32).astype(np.float32) * scale


# -- how two devices part -----------------------------------------------------------------------
@dataclass(frozen=True)
class Parting:
    """How two devices' integer outputs of one layer differ: ``verdict`` one of PARTINGS,
    ``detail`` in words, ``differing`` the number of outputs that differ, ``first`` and
    ``second`` the replays each device's output equals (accumulation, rounding)."""

    verdict: str
    detail: str
    differing: int
    first: tuple = ()
    second: tuple = ()


def _replays(layer: QuantizedLinear, inputs: np.ndarray) -> dict[tuple, np.ndarray]:
    """{(accumulation, rounding or None): the layer's integer result so computed}."""
    a = np.asarray(inputs)
    paths = [EXACT] + ([SATURATED] if a.dtype == np.uint8 and
                       np.asarray(layer.weights).dtype == np.int8 else [])
    roundings = [None] if layer.output_scale is None else list(ROUNDINGS)
    return {(path, rounding): layer_outputs(layer, a, path == SATURATED,
                                            rounding or HALF_TO_EVEN)
            for path in paths for rounding in roundings}


def _fitted_multiplier(codes: np.ndarray, acc: np.ndarray, layer: QuantizedLinear):
    """(the requantisation multiplier that best maps ``acc`` to ``codes`` (least squares
    over the outputs inside the type's range), whether requantising with it gives every
    such output within one)."""
    info = np.iinfo(layer.output_dtype)
    centred = codes.astype(np.float64) - layer.output_zero_point
    inside = (codes > info.min) & (codes < info.max) & (acc != 0)
    x = acc.astype(np.float64)[inside]
    if not x.size:
        return None, False
    fitted = float((centred[inside] * x).sum() / (x * x).sum())
    again = np.rint(x * fitted)
    return fitted, bool(np.abs(again - centred[inside]).max() <= 1)


def how_they_part(first: np.ndarray, second: np.ndarray, layer: QuantizedLinear,
                  inputs: np.ndarray) -> Parting:
    """How two devices' integer outputs of ``layer`` for the same ``inputs`` (M, K) codes
    part: IDENTICAL; SATURATION where one equals the exact int32 replay and the other the
    saturated 16-bit one (same rounding); ROUNDING where both equal replays of one
    accumulation rounded two ways, or they differ by one only where the exact value lies
    on a tie; SCALE where each is its accumulators requantised (within one) by a
    multiplier of its own and the two differ; else UNEXPLAINED. The outputs are int32
    accumulators (the layer has no output scale) or requantised codes."""
    first, second = np.asarray(first), np.asarray(second)
    if first.shape != second.shape:
        raise ValueError(f"the outputs' shapes differ: {first.shape} and {second.shape}")
    differing = int((first != second).sum())
    if not differing:
        return Parting(IDENTICAL, "the same integers", 0)
    replays = _replays(layer, inputs)
    one = tuple(key for key, value in replays.items() if np.array_equal(value, first))
    two = tuple(key for key, value in replays.items() if np.array_equal(value, second))

    def rounded(key):
        return "" if key[1] is None else f", rounded {key[1]}"

    for a in one:
        for b in two:
            if a[1] == b[1] and a[0] != b[0]:
                which = "first" if a[0] == SATURATED else "second"
                pairs = saturating_pairs(inputs, layer.weights)
                return Parting(SATURATION, f"the {which} device's result is the AVX2 path's "
                               f"(u8 x s8 pairs summed into saturated int16, vpmaddubsw: "
                               f"{pairs} pair(s) overflow), the other's exact int32"
                               f"{rounded(a)}", differing, one, two)
    for a in one:
        for b in two:
            if a[0] == b[0] and a[1] != b[1]:
                return Parting(ROUNDING, f"both accumulate {a[0]}; the first rounds "
                               f"{a[1]}, the second {b[1]}", differing, one, two)
    if layer.output_scale is None:
        return Parting(UNEXPLAINED, "int32 accumulators that neither the exact nor the "
                       "saturated replay gives", differing, one, two)
    acc = accumulate(inputs, layer.weights, layer.input_zero_point, layer.weight_zero_point)
    if layer.bias is not None:
        acc = acc.astype(np.int64) + np.asarray(layer.bias, np.int64)
    exact = acc.astype(np.float64) * np.broadcast_to(layer.multiplier(), acc.shape)
    apart = first != second
    gap = np.abs(first.astype(np.int64) - second.astype(np.int64))
    fraction = np.abs(exact - np.floor(exact) - 0.5)
    if gap.max() == 1 and (fraction[apart] <= 1e-6 * np.maximum(1, np.abs(exact[apart]))).all():
        return Parting(ROUNDING, "off by one only where the exact value lies on a tie "
                       "(a rounding mode bitdrift does not replay)", differing, one, two)
    fit_one, within_one = _fitted_multiplier(first, acc, layer)
    fit_two, within_two = _fitted_multiplier(second, acc, layer)
    if within_one and within_two and fit_one is not None and fit_two is not None and \
            not math.isclose(fit_one, fit_two, rel_tol=1e-3):
        return Parting(SCALE, f"each is its accumulators requantised by a multiplier of its "
                       f"own: {fit_one:.6g} and {fit_two:.6g} (the layer's: "
                       f"{float(np.mean(layer.multiplier())):.6g})", differing, one, two)
    return Parting(UNEXPLAINED, "no replay (int32 or saturated int16 accumulation, each "
                   "rounding, a scale of its own) gives both", differing, one, two)
