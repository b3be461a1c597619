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

Reduced precision is a finding, recorded and flagged, never a refusal: OpenVINO computes
in bfloat16 by default on any CPU with native bf16, a GPU in TF32. The check names the
format: the narrowest standard format (float32, TF32, float16, bfloat16) such that
rounding the layer's operands to it and summing in float32 explains every sampled element
(``format``, e.g. ``bfloat16``; the table says ``bfloat16-like, 7.9 bits``).

Only NumPy: at inference, the worker that ran the model hands over the weights and layer
settings, and the parent process (no framework loaded) does the arithmetic. In the
analysis, :func:`recheck` recomputes from the record's activations and the `.keras` file's
weights (read without Keras): a record from another machine is tested, not trusted.
"""

from __future__ import annotations

import math

import numpy as np

# Significand bits (mantissa + the implicit bit) of each declared format.
SIGNIFICAND_BITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53, "tf32": 11}
# Output elements checked per layer and sample: enough to see a systematic loss of
# precision, cheap on ResNet-50's convolutions.
ELEMENTS_PER_LAYER = 512
# MatMul: a product of two activations (an ONNX MatMul node's, attention's Q @ K^T), its
# second operand read from the record as a Dense layer's kernel is from the model
CHECKED_CLASSES = ("Dense", "Conv2D", "MatMul")
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
    return spec_from_config(layer.__class__.__name__, layer.get_config(), inbound)


def spec_from_config(kind: str, config: dict, inbound: str | None,
                     operand: str | None = None) -> dict | None:
    """layer_spec from a layer's class name and saved config (a `.keras` file's); a
    MatMul's ``operand``: the recorded layer that is its second operand (None: it has
    none recorded, and is not checked)."""
    if kind not in CHECKED_CLASSES or (kind == "MatMul" and operand is None):
        return None
    spec = {"class_name": kind, "inbound": inbound,
            "activation": str(config.get("activation", "linear")),
            "use_bias": bool(config.get("use_bias", True))}
    if kind == "MatMul":
        spec.update(operand=operand, use_bias=False)
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


def _matmul_terms(x: np.ndarray, operand: np.ndarray, out_shape, flat: np.ndarray):
    """(products, output column) of the sampled elements of a MatMul of two activations:
    x (1, ..., M, K) @ operand (1, ..., K, N), their leading axes broadcast as ONNX's
    MatMul broadcasts them."""
    *lead, rows, columns = out_shape
    x = np.broadcast_to(x, (*lead, rows, x.shape[-1]))
    operand = np.broadcast_to(operand, (*lead, operand.shape[-2], columns))
    index = np.unravel_index(flat, out_shape)
    left = x[(*index[:-2], index[-2])]  # (k, K)
    right = np.moveaxis(operand, -1, -2)[(*index[:-2], index[-1])]  # (k, K)
    return left * right, index[-1]


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


def round_significand(values: np.ndarray, bits: int, mode: str = "nearest",
                      min_exponent: int | None = None) -> np.ndarray:
    """``values`` (float64 or longdouble) rounded to ``bits`` significand bits, in the same
    dtype: ``nearest`` (ties to even, as AMX/AVX512_BF16 and XNNPACK convert) or ``zero``
    (dropping the low bits, as some TF32 kernels do). ``min_exponent``: the format's least
    normal exponent (float16's -14): below it the quantum stays fixed (subnormals)."""
    _, exponent = np.frexp(values)  # values = m * 2**exponent, |m| in [0.5, 1)
    if min_exponent is not None:
        exponent = np.maximum(exponent, min_exponent + 1)
    scaled = np.ldexp(values, bits - exponent)
    rounded = np.rint(scaled) if mode == "nearest" else np.trunc(scaled)
    return np.ldexp(rounded, exponent - bits).astype(values.dtype)


# The standard formats a device may compute in, narrowest last, with how their operands are
# rounded: (significand bits, least normal exponent or None for float32's range, modes).
# TF32 and float16 keep the same 11 bits; float16's narrow range tells them apart where
# values are small.
STANDARD_FORMATS = {"float64": (53, None, ("nearest",)),
                    "float32": (24, None, ("nearest",)),
                    "tf32": (11, None, ("nearest", "zero")),
                    "float16": (11, -14, ("nearest",)),
                    "bfloat16": (8, None, ("nearest", "zero"))}
# What reduced-precision hardware accumulates in (AMX, AVX512_BF16, tensor cores, XNNPACK's
# fp16 paths to a float32 sum): the operands are rounded, the sum is float32.
ACCUMULATOR = "float32"


def narrower_formats(precision: str) -> list[str]:
    """The standard formats narrower than ``precision``, widest first."""
    bits = SIGNIFICAND_BITS[precision]
    return [name for name, (significand, _, _) in STANDARD_FORMATS.items() if significand < bits]


def _terms(spec: dict, x: np.ndarray, kernel: np.ndarray, out_shape, flat: np.ndarray):
    if spec["class_name"] == "Dense":
        return _dense_terms(x, kernel, flat)
    if spec["class_name"] == "MatMul":
        return _matmul_terms(x, kernel, out_shape, flat)
    return _conv_terms(x, kernel, spec, out_shape, flat)


def _consistent_with(spec, pairs, kernels, bias, fmt: str) -> bool:
    """Whether every sampled element is what a device gives that rounds each operand (the
    layer's input and weights) to ``fmt`` and sums the exact products in float32: within
    gamma(n + 2) of float32 of the rounded operands' exact sum, plus one rounding of the
    result (and of the bias) to ``fmt``."""
    bits, min_exponent, modes = STANDARD_FORMATS[fmt]
    unit = 2.0 ** -bits
    for mode in modes:
        # each pair's kernel (a MatMul's second operand differs by repeat) rounded once
        rounded = {}
        ok = True
        for (x, y, flat), kernel in zip(pairs, kernels, strict=True):
            if id(kernel) not in rounded:
                rounded[id(kernel)] = round_significand(kernel, bits, mode, min_exponent)
            x_f = round_significand(x, bits, mode, min_exponent)
            terms, unit_index = _terms(spec, x_f, rounded[id(kernel)], y.shape, flat)
            exact = terms.sum(axis=1)
            scale = np.abs(terms).sum(axis=1)
            slack = 0.0
            if bias is not None:
                exact, scale = exact + bias[unit_index], scale + np.abs(bias[unit_index])
                slack = unit * np.abs(bias[unit_index])
            if spec["activation"] == "relu":
                exact = np.maximum(exact, 0)
            bound = error_bound(terms.shape[1], ACCUMULATOR) * scale + unit * np.abs(exact) \
                + slack
            if np.any(np.abs(y.reshape(-1)[flat] - exact) > bound):
                ok = False
                break
        if ok:
            return True
    return False


def format_label(result: dict) -> str:
    """``bfloat16-like, 7.9 bits`` for a reduced layer; the declared format otherwise."""
    if not result.get("reduced"):
        return result.get("format", "")
    return f"{result['format']}-like, {result['effective_bits']:.1f} bits"


def check_layer(spec: dict, inputs: np.ndarray, outputs: np.ndarray, kernel: np.ndarray,
                bias: np.ndarray | None, precision: str, seed: int = 0) -> dict:
    """The normalised error of ``outputs`` (one sample's repeats, as recorded) against the
    layer recomputed from ``inputs`` (the same repeats of its input), sampled elements.
    ``kernel`` and ``bias`` are the weights in the declared format; a MatMul's ``kernel``
    is its second operand, recorded with the same repeats (one per repeat).

    A layer above its declared format's bound is named by the narrowest standard format
    its outputs are consistent with (``format``): first exactly, by recomputing it with the
    operands rounded to each narrower format (float32, TF32, float16, bfloat16) and a
    float32 sum (``format_test`` ``operands``); else by the loosest reading, the widest
    format whose own bound the error is within (``bound``); ``below bfloat16`` if none."""
    if spec["activation"] not in EXACT_ACTIVATIONS:
        return {"unchecked": f"activation {spec['activation']} folded into the layer"}
    wide = reference_dtype(precision)
    bias = None if bias is None else bias.astype(wide)
    if spec["class_name"] == "MatMul":  # one operand per repeat, as recorded
        kernels = [value[None].astype(wide) for value in kernel]
    else:
        kernels = [kernel.astype(wide)] * len(inputs)
    channels_first = spec.get("data_format") == "channels_first"
    worst, fan_in, elements, pairs = 0.0, 0, 0, []
    rng = np.random.default_rng(seed)
    for x, y, kernel in zip(inputs, outputs, kernels, strict=True):
        x, y = x[None].astype(wide), y[None].astype(wide)
        if channels_first:
            x, y = np.moveaxis(x, 1, -1), np.moveaxis(y, 1, -1)
        flat = _sampled(y.size, rng)
        pairs.append((x, y, flat))
        terms, unit = _terms(spec, x, kernel, y.shape, flat)
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
    reduced = bool(worst > bound)
    found, test = precision, "declared"
    if reduced:
        found, test = "below bfloat16", "none"
        candidates = narrower_formats(precision)
        consistent = [fmt for fmt in candidates
                      if _consistent_with(spec, pairs, kernels, bias, fmt)]
        if consistent:
            # formats of the same width that both explain it are named together
            bits = STANDARD_FORMATS[consistent[0]][0]
            found = "/".join(fmt for fmt in consistent if STANDARD_FORMATS[fmt][0] == bits)
            test = "operands"
        else:
            loose = [fmt for fmt in candidates if worst <= error_bound(fan_in, fmt)]
            if loose:
                found, test = loose[0], "bound"
    return {"class_name": spec["class_name"], "fan_in": int(fan_in), "elements": elements,
            "relative_error": worst, "effective_bits": bits_of(worst, precision),
            "bound_bits": bits_of(bound, precision),
            "declared_bits": SIGNIFICAND_BITS[precision], "reduced": reduced,
            "format": found, "format_test": test}


def merge(per_sample: list[dict]) -> dict:
    """One layer's result over several samples: the worst error, and the narrowest format
    any sample needed."""
    checked = [result for result in per_sample if "unchecked" not in result]
    if not checked:
        return per_sample[0]
    worst = max(checked, key=lambda result: result["relative_error"])
    narrowest = max(checked, key=lambda result: _narrowness(result.get("format")))
    return {**worst, "elements": sum(result["elements"] for result in checked),
            "reduced": any(result["reduced"] for result in checked),
            **{key: narrowest[key] for key in ("format", "format_test") if key in narrowest}}


def _narrowness(fmt: str | None) -> int:
    """Order of the formats from wide to narrow (a record from before the format naming,
    without one, counts as its declared format)."""
    order = [*STANDARD_FORMATS, "below bfloat16"]
    first = (fmt or "").split("/")[0]
    return order.index(first) if first in order else -1


def reduced_layers(effective: dict) -> list[str]:
    """Layers flagged as computed below the declared format, in record order."""
    return [name for name, result in effective.items() if result.get("reduced")]


def reached(effective: dict) -> dict | None:
    """The record's finding when any layer is reduced: the narrowest format its layers
    reached, the fewest effective bits among the reduced layers, and those layers."""
    reduced = [effective[name] for name in reduced_layers(effective)]
    if not reduced:
        return None
    narrowest = max(reduced, key=lambda result: _narrowness(result.get("format")))
    return {"format": narrowest.get("format", "unnamed"),
            "effective_bits": min(result["effective_bits"] for result in reduced),
            "layers": reduced_layers(effective), "checked": len(
                [result for result in effective.values() if "unchecked" not in result])}


# A record whose layers keep digests only (analysis.full_samples: 0) has no values to check
NO_FULL_SAMPLES = ("no sample keeps its layers' values (analysis.full_samples: 0); the check "
                   "needs full tensors")


def unchecked_reason(record) -> str | None:
    """Why a record that recorded its layers has no effective-precision check: every
    sample's layers hold digests only (NO_FULL_SAMPLES); None otherwise."""
    if record.value_samples or not any(
            not info.final for info in record.layers(record.samples[0])):
        return None
    return NO_FULL_SAMPLES


def summary(effective: dict | None, reason: str | None = None) -> str:
    """One cell for the tables: ``declared`` (every checked layer within its format),
    ``reduced: bfloat16-like, 7.9 bits (5 of 5 layers)``, or ``unchecked`` (a record
    without the check; ``unchecked: REASON`` where ``reason``, unchecked_reason, says why)."""
    if reason is not None:
        return f"unchecked: {reason}"
    if effective is None:
        return "unchecked"
    found = reached(effective)
    if found is None:
        return "declared"
    return (f"reduced: {found['format']}-like, {found['effective_bits']:.1f} bits "
            f"({len(found['layers'])} of {found['checked']} layers)")


TABLE_COLUMNS = ["model", "device", "precision", "layer", "class_name", "fan_in", "elements",
                 "relative_error", "effective_bits", "bound_bits", "declared_bits", "reduced",
                 "format", "format_test", "unchecked"]


def effective_precision_table(records) -> list[dict]:
    """``effective_precision.csv``: one row per (record, checked layer); a record written
    without the check has one row, ``unchecked``, so it is never counted as passing."""
    rows = []
    for record in records:
        base = {"model": record.model, "device": record.device,
                "precision": record.precision}
        effective = record.effective_precision
        reason = unchecked_reason(record)
        if effective is None or reason is not None:
            rows.append({**base, "unchecked": reason or "record written without the check"})
            continue
        for layer, result in effective.items():
            rows.append({**base, "layer": layer, **{key: result.get(key) for key in
                                                    TABLE_COLUMNS[4:]}})
    # every column in every row (an unchecked record's row has no layer)
    return [{column: row.get(column) for column in TABLE_COLUMNS} for row in rows]


def describe_reduced(effective: dict, device: dict, device_name: str, model_name: str) -> str:
    """The log line of a device that computed below its declared format: a finding, recorded
    and flagged (OpenVINO's bfloat16 default on a CPU with native bf16, TF32 on a GPU)."""
    found = reached(effective)
    if found is None:
        return ""
    why = " (the device allows it: allow_reduced_precision)" \
        if device.get("allow_reduced_precision") else ""
    return (f"bitdrift: finding: device {device_name!r}, model {model_name!r} computes below "
            f"its declared {device['precision']}: {found['format']}-like, "
            f"{found['effective_bits']:.1f} effective bits in {', '.join(found['layers'])}"
            f"{why}; recorded and flagged")


def recheck(record, model_path, dataset_path) -> dict:
    """The check recomputed from the record's own activations and the model file's weights
    (read without Keras), never from the attribute the inference wrote: a record from
    another machine is tested, not trusted. The layers, their inputs and the test images
    (for a layer fed by the model input) are the record's; the weights are cast to the
    record's declared format, as its device had them."""
    from bitdrift.formats import file_layers
    from bitdrift.inputs.datasets import read_test_images
    from bitdrift.inputs.models import numpy_dtype

    precision = record.precision
    dtype = numpy_dtype(precision)
    # a Keras model's layers, or an ONNX model's MatMul, Gemm and Conv nodes as Dense and
    # Conv2D layers (bitdrift.formats); a format with no such reading has none to check
    layers = file_layers(model_path) or []
    inputs = {layer["name"] for layer in layers if layer["class_name"] == "InputLayer"}
    recorded = {info.name for info in record.layers(record.samples[0]) if not info.final}
    checked = {}
    for layer in layers:
        matmul = layer["class_name"] == "MatMul" and len(layer["inbound"]) == 2
        if (len(layer["inbound"]) != 1 and not matmul) or layer["name"] not in recorded:
            continue
        source = layer["inbound"][0]
        inbound = None if source in inputs else source
        if inbound is not None and inbound not in recorded:
            continue
        operand = layer["inbound"][1] if matmul else None
        if matmul and operand not in recorded:
            continue  # its second operand not recorded (or the model input): not checked
        spec = spec_from_config(layer["class_name"], layer["config"], inbound, operand)
        if spec is not None and (layer["weights"] or matmul):
            checked[layer["name"]] = (spec, [np.asarray(value).astype(dtype).astype(np.float64)
                                             for value in layer["weights"]])
    # the samples whose layers hold values (a record written with analysis.full_samples
    # holds the others' digests only)
    samples = record.value_samples
    if not samples:  # nothing to check (unchecked_reason says why)
        return {}
    images = read_test_images(dataset_path, samples).astype(dtype) \
        if any(spec["inbound"] is None for spec, _ in checked.values()) else None
    results: dict[str, list[dict]] = {}
    for row, sample in enumerate(samples):
        for name, (spec, weights) in checked.items():
            outputs = _as_float(record.tensor(sample, name))
            if spec["inbound"] is None:
                inputs_ = np.repeat(images[row][None], len(outputs), axis=0)
            else:
                inputs_ = _as_float(record.tensor(sample, spec["inbound"]))
            bias = weights[1] if spec["use_bias"] and len(weights) > 1 else None
            try:
                kernel = _as_float(record.tensor(sample, spec["operand"])) \
                    if spec["class_name"] == "MatMul" else weights[0]
                result = check_layer(spec, inputs_, outputs, kernel, bias, precision)
            except Exception as error:  # noqa: BLE001 - as the inference's check records it
                result = {"unchecked": unchecked_layer(error)}
            results.setdefault(name, []).append(result)
    return {name: merge(parts) for name, parts in results.items()}


def unchecked_layer(error: BaseException) -> str:
    """A layer's ``unchecked`` where its check failed: ``not checked: <the error>``, one
    line (the record, the table and the job's log say it; the device's record stands)."""
    said = (str(error).strip().splitlines() or [""])[0][:300]
    return f"not checked: {type(error).__name__}: {said}"


def recheck_record(record, model_path, dataset_path) -> str | None:
    """Replace the effective precision the inference wrote in ``record`` (as read) by its
    recomputation from the record's activations and the model file (recheck): the tables
    then report what the record shows, not what it claims. Returns a warning line when the
    two disagree on which layers are reduced."""
    claimed = record.effective_precision
    found = recheck(record, model_path, dataset_path)
    if not found and claimed is None:
        return None  # nothing recorded to check (a record without layers)
    record._effective = found
    if claimed is not None and reduced_layers(claimed) == reduced_layers(found):
        return None
    said = "no check" if claimed is None else \
        f"reduced {', '.join(reduced_layers(claimed)) or 'none'}"
    return (f"{record.path}: effective precision recomputed from {model_path}: reduced "
            f"{', '.join(reduced_layers(found)) or 'none'} (the record says "
            f"{said}); the tables use the recomputation")


def _as_float(tensor) -> np.ndarray:
    """A recorded tensor's values as floats (bfloat16 is stored as its raw bits)."""
    if tensor.bfloat16:
        import ml_dtypes

        return tensor.values.view(ml_dtypes.bfloat16)
    return tensor.values
