"""Effective precision: does a device compute in the float format it declares?

A record says a device computed in float64; a framework may still have promoted a matmul
to float32 on the way (Keras 3 on torch did, for every Dense layer). The check recomputes
each Dense and Conv layer from the record's own input activation and the model's weights
(cast to the declared format, as the device had them) in a wider format (float64 for
16/32-bit devices, longdouble for float64 devices) and compares.

The error of an output element is normalised by the absolute sum it is built from,
``sum |x_i w_i| + |b|``: then any honest evaluation in the declared format, in any
summation order, with or without FMA, stays within ``gamma(n + 2) = (n + 2) u / (1 - (n + 2) u)``
(n products, the bias and the final rounding; ``u = 2**-p`` with ``p`` the format's
significand bits; Higham, Accuracy and Stability of Numerical Algorithms, eq. 3.5). An
error above that bound cannot come from the declared format: the layer is flagged as
computed in reduced precision. ``effective_bits = -log2(error)`` is the precision the
device showed. Layers with an activation other than linear or ReLU folded in, and layer
kinds the check does not model, are listed as unchecked, never guessed.

Only NumPy: the worker that ran the model hands over the weights and layer settings, and
the parent process (no framework loaded) does the arithmetic.
"""

from __future__ import annotations

import math

import numpy as np

# Significand bits (mantissa + the implicit bit) of each declared format.
SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
# Output elements checked per layer and sample: enough to see a systematic loss of
# precision, cheap on ResNet-50's convolutions.
ELEMENTS_PER_LAYER = 512
CHECKED_CLASSES = ("Dense", "Conv2D")
EXACT_ACTIVATIONS = ("linear", "relu")


def reference_dtype(precision: str):
    """The wider format the layer is recomputed in."""
    return np.longdouble if precision == "float64" else np.float64


def reference_bits(precision: str) -> int:
    return int(np.finfo(reference_dtype(precision)).nmant) + 1


def error_bound(fan_in: int, precision: str) -> float:
    """gamma(n + 2) for the declared format: the largest normalised error of an honest
    evaluation (n products, the bias, the rounding of the result)."""
    unit = 2.0 ** -SIGNIFICAND_BITS[precision]
    terms = (fan_in + 2) * unit
    return terms / (1 - terms) if terms < 1 else math.inf


def bits_of(error: float, precision: str) -> float:
    """-log2(error), at most the reference's own precision (an error of 0 shows nothing
    beyond it)."""
    cap = float(reference_bits(precision))
    if error <= 2.0 ** -cap:
        return cap
    return max(min(-math.log2(error), cap), 0.0)  # an error of 1 or more: no bit left


def layer_spec(layer, inbound: str | None) -> dict | None:
    """What the check needs of a Keras layer (called in the worker): its class, settings
    and the name of the layer feeding it (None: the model input). None for a layer the
    check does not model."""
    kind = layer.__class__.__name__
    if kind not in CHECKED_CLASSES:
        return None
    config = layer.get_config()
    spec = {"class_name": kind, "inbound": inbound,
            "activation": str(config.get("activation", "linear")),
            "use_bias": bool(config.get("use_bias", True))}
    if kind == "Conv2D":
        spec.update({key: config[key] for key in ("strides", "padding", "dilation_rate",
                                                  "data_format", "groups")})
        spec["strides"], spec["dilation_rate"] = list(spec["strides"]), \
            list(spec["dilation_rate"])
    return spec


def _sampled(count: int, rng: np.random.Generator) -> np.ndarray:
    if count <= ELEMENTS_PER_LAYER:
        return np.arange(count)
    return np.sort(rng.choice(count, ELEMENTS_PER_LAYER, replace=False))


def _dense_terms(x: np.ndarray, kernel: np.ndarray, flat: np.ndarray):
    """(products, output index) of the sampled elements of a Dense layer: x (N, ..., n)."""
    units = kernel.shape[-1]
    rows = x.reshape(-1, x.shape[-1])
    row, unit = np.divmod(flat, units)
    return rows[row] * kernel.T[unit], unit


def _conv_terms(x: np.ndarray, kernel: np.ndarray, spec: dict, out_shape, flat: np.ndarray):
    """(products, output channel) of the sampled elements of a Conv2D layer, NHWC."""
    kh, kw, per_group, filters = kernel.shape
    sh, sw = spec["strides"]
    dh, dw = spec["dilation_rate"]
    _, out_h, out_w, _ = out_shape
    _, in_h, in_w, _ = x.shape
    if spec["padding"] == "same":
        pad_h = max((out_h - 1) * sh + (kh - 1) * dh + 1 - in_h, 0)
        pad_w = max((out_w - 1) * sw + (kw - 1) * dw + 1 - in_w, 0)
    else:
        pad_h = pad_w = 0
    padded = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2),
                        (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    batch, i, j, channel = np.unravel_index(flat, out_shape)
    rows = i[:, None, None] * sh + np.arange(kh)[None, :, None] * dh
    cols = j[:, None, None] * sw + np.arange(kw)[None, None, :] * dw
    group = channel // (filters // spec.get("groups", 1))
    channels = group[:, None] * per_group + np.arange(per_group)[None, :]
    patches = padded[batch[:, None, None, None], rows[..., None], cols[..., None],
                     channels[:, None, None, :]]  # (k, kh, kw, per_group)
    weights = np.moveaxis(kernel[..., channel], -1, 0)  # (k, kh, kw, per_group)
    return (patches * weights).reshape(len(flat), -1), channel


def check_layer(spec: dict, inputs: np.ndarray, outputs: np.ndarray, kernel: np.ndarray,
                bias: np.ndarray | None, precision: str, seed: int = 0) -> dict:
    """The normalised error of ``outputs`` (one sample's repeats, as recorded) against the
    layer recomputed from ``inputs`` (the same repeats of its input), sampled elements.
    ``kernel`` and ``bias`` are the weights in the declared format."""
    if spec["activation"] not in EXACT_ACTIVATIONS:
        return {"unchecked": f"activation {spec['activation']} folded into the layer"}
    wide = reference_dtype(precision)
    kernel, bias = kernel.astype(wide), None if bias is None else bias.astype(wide)
    channels_first = spec.get("data_format") == "channels_first"
    worst, fan_in, elements = 0.0, 0, 0
    rng = np.random.default_rng(seed)
    for x, y in zip(inputs, outputs, strict=True):
        x, y = x[None].astype(wide), y[None].astype(wide)
        if channels_first:
            x, y = np.moveaxis(x, 1, -1), np.moveaxis(y, 1, -1)
        flat = _sampled(y.size, rng)
        if spec["class_name"] == "Dense":
            terms, unit = _dense_terms(x, kernel, flat)
        else:
            terms, unit = _conv_terms(x, kernel, spec, y.shape, flat)
        exact = terms.sum(axis=1)
        scale = np.abs(terms).sum(axis=1)
        if bias is not None:
            exact, scale = exact + bias[unit], scale + np.abs(bias[unit])
        if spec["activation"] == "relu":
            exact = np.maximum(exact, 0)
        error = np.abs(y.reshape(-1)[flat] - exact)
        normalised = np.divide(error, scale, out=np.where(error > 0, np.inf, 0.0).astype(wide),
                               where=scale > 0)
        worst = max(worst, float(normalised.max()))
        fan_in, elements = terms.shape[1], elements + len(flat)
    bound = error_bound(fan_in, precision)
    return {"class_name": spec["class_name"], "fan_in": int(fan_in), "elements": elements,
            "relative_error": worst, "effective_bits": bits_of(worst, precision),
            "bound_bits": bits_of(bound, precision),
            "declared_bits": SIGNIFICAND_BITS[precision], "reduced": bool(worst > bound)}


def merge(per_sample: list[dict]) -> dict:
    """One layer's result over several samples: the worst."""
    checked = [result for result in per_sample if "unchecked" not in result]
    if not checked:
        return per_sample[0]
    worst = max(checked, key=lambda result: result["relative_error"])
    return {**worst, "elements": sum(result["elements"] for result in checked)}


def reduced_layers(effective: dict) -> list[str]:
    """Layers flagged as computed below the declared format, in record order."""
    return [name for name, result in effective.items() if result.get("reduced")]


def summary(effective: dict | None) -> str:
    """One word for the tables: ``declared`` (every checked layer within its format),
    ``reduced:<layers>``, or ``unchecked`` (a record without the check)."""
    if effective is None:
        return "unchecked"
    reduced = reduced_layers(effective)
    return f"reduced:{'+'.join(reduced)}" if reduced else "declared"


TABLE_COLUMNS = ["model", "device", "precision", "layer", "class_name", "fan_in", "elements",
                 "relative_error", "effective_bits", "bound_bits", "declared_bits", "reduced",
                 "unchecked"]


def effective_precision_table(records) -> list[dict]:
    """``effective_precision.csv``: one row per (record, checked layer); a record written
    without the check has one row, ``unchecked``, so it is never counted as passing."""
    rows = []
    for record in records:
        base = {"model": record.model, "device": record.device,
                "precision": record.precision}
        effective = record.effective_precision
        if effective is None:
            rows.append({**base, "unchecked": "record written without the check"})
            continue
        for layer, result in effective.items():
            rows.append({**base, "layer": layer, **{key: result.get(key) for key in
                                                    TABLE_COLUMNS[4:]}})
    return rows


def refuse_reduced(effective: dict, device: dict, device_name: str, model_name: str) -> None:
    """The one-line error of a device that computed below its declared format, unless it
    says it may (``allow_reduced_precision``: TF32 on a GPU)."""
    from bitdrift.errors import InferenceError

    reduced = reduced_layers(effective)
    if not reduced or device.get("allow_reduced_precision", False):
        return
    worst = effective[reduced[0]]
    also = f"; also {', '.join(reduced[1:])}" if len(reduced) > 1 else ""
    raise InferenceError(
        f"device {device_name!r}, model {model_name!r}: layer {reduced[0]!r} computed below "
        f"its declared {device['precision']} (effective {worst['effective_bits']:.1f} "
        f"significand bits; an honest {device['precision']} evaluation keeps at least "
        f"{worst['bound_bits']:.1f}){also}; set allow_reduced_precision: true for a device "
        "that does so on purpose (TF32 on a GPU)")
