"""Remaining precision: how many mantissa bits agree across a set of outputs.

With m mantissa bits and integer views of the floats, i* is the smallest i such that all
outputs agree once the i lowest bits of every element are dropped. RP = m - i*. It is
computed in O(devices x elements): XOR every output against one reference, OR-reduce over
devices, and take the highest set bit of the result per element.

i* > m means sign or exponent bits differ; the capped RP is then 0 and the uncapped value
is negative (down to m - total_bits, a sign difference).
"""

from __future__ import annotations

import warnings

import numpy as np

MANTISSA_BITS = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}
INTEGER_VIEW = {
    "float16": np.uint16,
    "bfloat16": np.uint16,
    "float32": np.uint32,
    "float64": np.uint64,
}


def integer_view(values: np.ndarray, float_format: str) -> np.ndarray:
    """Raw bits of ``values`` as unsigned integers (bfloat16 arrives as uint16 already)."""
    if float_format not in INTEGER_VIEW:
        raise ValueError(f"unsupported float format {float_format!r}")
    view_type = INTEGER_VIEW[float_format]
    values = np.ascontiguousarray(values)
    if values.dtype == view_type:
        return values
    if values.dtype.itemsize != np.dtype(view_type).itemsize:
        raise ValueError(f"{values.dtype} values cannot be viewed as {float_format}")
    return values.view(view_type)


def bit_length(values: np.ndarray) -> np.ndarray:
    """Per-element number of significant bits of unsigned integers (0 for 0), exact to 64 bits."""
    values = values.astype(np.uint64, copy=False)
    high = (values >> np.uint64(32)).astype(np.float64)
    low = (values & np.uint64(0xFFFFFFFF)).astype(np.float64)
    # frexp is exact below 2**53, so split the word in halves of 32 bits.
    _, high_exponent = np.frexp(high)
    _, low_exponent = np.frexp(low)
    return np.where(high > 0, high_exponent + 32, low_exponent).astype(np.int64)


class RemainingPrecisionAccumulator:
    """Streams outputs one at a time; memory is two arrays of one output's size."""

    def __init__(self, float_format: str):
        self.float_format = float_format
        self.mantissa_bits = MANTISSA_BITS[float_format]
        self.reference: np.ndarray | None = None
        self.differing_bits: np.ndarray | None = None
        self._scratch: np.ndarray | None = None  # reused: no allocation per output
        self.count = 0

    def add(self, values: np.ndarray) -> None:
        bits = integer_view(values, self.float_format).ravel()
        if self.reference is None:
            self.reference = bits.copy()
            self.differing_bits = np.zeros_like(bits)
            self._scratch = np.empty_like(bits)
        elif bits.shape != self.reference.shape:
            raise ValueError(f"shape mismatch: {bits.size} elements vs {self.reference.size}")
        else:
            np.bitwise_xor(bits, self.reference, out=self._scratch)
            np.bitwise_or(self.differing_bits, self._scratch, out=self.differing_bits)
        self.count += 1

    def result(self) -> dict:
        if self.reference is None:
            raise ValueError("no outputs were added")
        dropped_bits = bit_length(self.differing_bits)  # i* per element
        m = self.mantissa_bits
        i_star = int(dropped_bits.max()) if dropped_bits.size else 0
        per_element = np.clip(m - dropped_bits, 0, m)
        return {
            "remaining_precision": int(min(max(m - i_star, 0), m)),
            "remaining_precision_uncapped": int(m - i_star),
            "median_remaining_precision": float(np.median(per_element)) if per_element.size
            else float(m),
            "deviating_fraction": float(np.count_nonzero(self.differing_bits))
            / max(self.differing_bits.size, 1),
        }


def remaining_precision(outputs: list[np.ndarray], float_format: str | None = None) -> dict:
    """Remaining precision of a set of equally shaped outputs (see module docstring)."""
    if not outputs:
        raise ValueError("remaining precision needs at least one output")
    float_format = float_format or np.asarray(outputs[0]).dtype.name
    accumulator = RemainingPrecisionAccumulator(float_format)
    for output in outputs:
        accumulator.add(np.asarray(output))
    return accumulator.result()


def pairwise_dropped_bits(outputs: list[np.ndarray], float_format: str) -> np.ndarray:
    """Matrix of i* for every pair of outputs (used for the dendrogram only).

    The i* of a set equals the largest pairwise i* in it, so complete linkage on this
    matrix merges devices exactly at the remaining precision of the merged set.
    """
    n = len(outputs)
    matrix = np.zeros((n, n), dtype=np.int64)
    for a in range(n):
        for b in range(a + 1, n):
            matrix[a, b] = matrix[b, a] = dropped_bits(outputs[a], outputs[b], float_format)
    return matrix


def dropped_bits(a: np.ndarray, b: np.ndarray, float_format: str) -> int:
    """i* of two outputs of one format and shape: the low bits to drop until they agree."""
    difference = (integer_view(np.asarray(a), float_format).ravel()
                  ^ integer_view(np.asarray(b), float_format).ravel())
    return int(bit_length(difference).max()) if difference.size else 0


def as_float64(values: np.ndarray, float_format: str) -> np.ndarray:
    """Values of any recorded format as float64 (bfloat16 arrives as its raw uint16 bits)."""
    values = np.asarray(values)
    if float_format == "bfloat16" and values.dtype == np.uint16:
        return (values.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
    return values.astype(np.float64)


def significant_bits(outputs: np.ndarray, float_format: str,
                     reference: np.ndarray | None = None) -> dict:
    """Statistical significant bits the devices' outputs share, per element, with
    Verificarlo's `significantdigits` (CNH method, relative error, base 2).

    ``outputs`` is (devices, elements) in float64; ``reference`` (elements,) is the
    reference each output is compared with (a float64 device), or None for the mean over
    the devices. CNH estimates from the spread of the relative errors; where every device
    gives the same bits there is no spread, and the element keeps the format's full
    mantissa (as remaining precision does); the estimate is capped to [0, mantissa bits].
    Elements whose relative error is undefined (a zero reference with differing devices)
    are left out of the mean and minimum. Mean and minimum are NaN for one device.
    """
    import significantdigits

    mantissa = MANTISSA_BITS[float_format]
    outputs = np.asarray(outputs, dtype=np.float64)
    devices = outputs.shape[0]
    if devices < 2:
        return {"significant_bits_mean": float("nan"), "significant_bits_min": float("nan")}
    agree = np.all(outputs.view(np.uint64) == outputs[:1].view(np.uint64), axis=0)
    bits = np.full(outputs.shape[1:], float(mantissa))
    if not agree.all():
        chosen = outputs[:, ~agree]
        base = chosen.mean(axis=0) if reference is None else \
            np.asarray(reference, dtype=np.float64)[~agree]
        with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            estimate = np.asarray(significantdigits.significant_digits(
                chosen, reference=base, axis=0, basis=2, error="relative", method="CNH"),
                dtype=np.float64)
        bits[~agree] = np.where(np.isfinite(estimate), np.clip(estimate, 0, mantissa), np.nan)
    finite = bits[np.isfinite(bits)]
    return {"significant_bits_mean": float(finite.mean()) if finite.size else float("nan"),
            "significant_bits_min": float(finite.min()) if finite.size else float("nan")}
