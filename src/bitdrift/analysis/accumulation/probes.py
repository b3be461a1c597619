"""A summing layer as a probe: which layers are probed, the probe's values per format, and
the layer's spec (Dense, Conv2D) from which a runtime builds the layer alone.
"""

from __future__ import annotations

import numpy as np

# The probe's values (M, the unit) per input format, the sums being float32 or wider.
# 2**40: a float32 sum of up to 2**15 ones added to it stays exactly ±2**40 (its ulp is
# 2**17), and 2**40 - 2**40 is exactly 0; in float64, 2**72 (ulp 2**20). bfloat16 holds
# 2**40 and 1 exactly. float16 tops out at 65504: M = 2**15 and the unit its smallest
# subnormal, 2**-24, keep the ratio (a float32 sum of up to 2**15 units stays under half
# an ulp of 2**15, 2**-9); the output counts units.
PROBE_VALUES = {"float32": (2.0**40, 1.0), "float64": (2.0**72, 1.0),
                "bfloat16": (2.0**40, 1.0), "float16": (2.0**15, 2.0**-24)}


def input_dtype(precision: str):
    """The numpy type of a probe's weights in ``precision``."""
    if precision == "bfloat16":
        import ml_dtypes  # numpy has no bfloat16; JAX and TensorFlow install ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(precision).type


# -- the layers whose order is revealed, as one sum per output ----------------------------
# A Dense layer's output column is a dot product of its n inputs; a Conv2D's output channel
# at one pixel is one of kh * kw * cin products (the GEMM it runs): term t is kernel
# position (i, j) and input channel c with t = (i * kw + j) * cin + c, Keras' kernel order.
# A Dense layer over an N-D input (batch, ..., n) (a Linear or MatMul on a transformer's
# (batch, tokens, features), a batched matmul's (batch, heads, tokens, n)) runs one GEMM
# whose rows are all the leading positions: each position's sum is a place of its own
# (dense_grid), as a Conv2D's pixels are. A grouped (or depthwise) Conv2D sums the
# kh * kw * cin / groups products of its own group's channels per output channel.
PROBED_CLASSES = ("Dense", "Conv2D")
CONV_KEYS = ("filters", "kernel_size", "strides", "padding", "dilation_rate", "data_format",
             "groups")


def probe_spec(class_name: str, config: dict, input_shape, kernel_shape) -> dict | None:
    """What revealing a layer's order needs: its class, the settings that shape its sum
    (activation dropped: the sum comes before it), its input per sample (a Dense layer's
    (terms,), or (..., terms) where it runs over more axes than (batch, terms)), its
    kernel's shape (a grouped Conv2D's (kh, kw, cin / groups, filters)), and the sum's
    terms and width; None for a layer that is not one such sum."""
    use_bias = bool(config.get("use_bias", True))
    if class_name == "Dense":
        terms, units = (int(size) for size in kernel_shape)
        kept = {"units": units, "use_bias": use_bias}
    elif class_name == "Conv2D" and config.get("data_format", "channels_last") \
            == "channels_last" and _group_channels(config, input_shape, kernel_shape):
        height, width, channels, units = (int(size) for size in kernel_shape)
        terms = height * width * channels
        kept = {key: (list(value) if isinstance(value, tuple) else value)
                for key, value in config.items() if key in CONV_KEYS}
        kept.update(use_bias=use_bias, filters=units, kernel_size=[height, width])
    else:
        return None
    return {"class_name": class_name, "config": {**kept, "activation": "linear"},
            "input_shape": [int(size) for size in input_shape],
            "kernel_shape": [int(size) for size in kernel_shape], "terms": terms,
            "units": units, "use_bias": use_bias}


def _group_channels(config: dict, input_shape, kernel_shape) -> bool:
    """Whether a Conv2D's groups split its input channels (channels-last input_shape) and
    its filters evenly, the kernel holding one group's channels."""
    groups = int(config.get("groups", 1))
    channels, filters = int(input_shape[-1]), int(kernel_shape[-1])
    return groups >= 1 and channels == groups * int(kernel_shape[2]) and filters % groups == 0


def dense_grid(spec: dict) -> tuple[int, int]:
    """A Dense probe's places per sample as a grid (rows, columns): (1, 1) over (batch,
    terms); over (batch, ..., tokens, terms) the last leading axis its columns and the
    others' product its rows (a batched matmul's heads by tokens)."""
    leading = [int(size) for size in spec["input_shape"][:-1]]
    if not leading:
        return 1, 1
    return int(np.prod(leading[:-1], dtype=np.int64)), leading[-1]


def probe_output(spec: dict, output: np.ndarray) -> np.ndarray:
    """The sums of a probe's output: (batch, units) of a Dense layer over (batch, terms),
    (batch, places, units) of one over more axes (dense_grid, row-major); (batch, pixels,
    units) of a Conv2D, every output pixel (row-major), each a sum of its own whose window
    may reach into the padding (see conv_grid); a ``channels_first`` probe's (an ONNX Conv
    node's) output is read channels-last."""
    output = np.asarray(output)
    if spec.get("channels_first"):
        output = np.moveaxis(output, 1, -1)
    if spec["class_name"] == "Conv2D" or output.ndim > 2:
        return output.reshape(output.shape[0], -1, output.shape[-1])
    return output


def conv_grid(spec: dict) -> tuple[tuple[int, int], np.ndarray]:
    """A Conv2D probe's output grid (height, width) and which of its sum's terms each
    output pixel holds: (pixels, terms + 1) booleans, row-major, the last column the bias
    (always there); a term is missing where the kernel position falls on the zero padding
    of an input of ones, its product then exactly 0."""
    kh, kw, channels, _ = spec["kernel_shape"]
    in_h, in_w = spec["input_shape"][:2]
    (sh, sw), (dh, dw) = spec["config"].get("strides", [1, 1]), \
        spec["config"].get("dilation_rate", [1, 1])
    if spec["config"].get("padding") == "same":
        out_h, out_w = -(-in_h // sh), -(-in_w // sw)
    else:
        out_h, out_w = (in_h - dh * (kh - 1) - 1) // sh + 1, (in_w - dw * (kw - 1) - 1) // sw + 1
    ones = np.ones((1, in_h, in_w, channels))
    live = conv_patches(ones, spec["config"], spec["kernel_shape"], (1, out_h, out_w)) != 0
    return (out_h, out_w), np.hstack([live, np.ones((len(live), 1), dtype=bool)])


def conv_patches(x: np.ndarray, spec: dict, kernel_shape, out_shape, ys=None,
                 xs=None) -> np.ndarray:
    """A Conv2D's input as the rows of the GEMM it runs: (samples * out_h * out_w,
    kh * kw * cin), term order as ``probe_spec`` says; zero padding as Keras pads.
    ``ys``, ``xs``: only the output pixels on those rows and columns of the grid
    (samples * len(ys) * len(xs) rows), as a sampled replay needs."""
    kh, kw, channels, _ = kernel_shape
    sh, sw = spec.get("strides", [1, 1])
    dh, dw = spec.get("dilation_rate", [1, 1])
    _, out_h, out_w = out_shape[:3]
    _, in_h, in_w, _ = x.shape
    pad_h = pad_w = 0
    if spec.get("padding") == "same":
        pad_h = max((out_h - 1) * sh + (kh - 1) * dh + 1 - in_h, 0)
        pad_w = max((out_w - 1) * sw + (kw - 1) * dw + 1 - in_w, 0)
    padded = np.pad(x, ((0, 0), (pad_h // 2, pad_h - pad_h // 2),
                        (pad_w // 2, pad_w - pad_w // 2), (0, 0)))
    ys = np.arange(out_h) if ys is None else np.asarray(ys)
    xs = np.arange(out_w) if xs is None else np.asarray(xs)
    rows = ys[:, None] * sh + np.arange(kh)[None, :] * dh  # (out_h, kh)
    cols = xs[:, None] * sw + np.arange(kw)[None, :] * dw  # (out_w, kw)
    patches = padded[:, rows[:, None, :, None], cols[None, :, None, :], :]
    return patches.reshape(x.shape[0] * len(ys) * len(xs), kh * kw * channels)


def sampled_axis(length: int, count: int, border: int) -> list[int]:
    """At most ``count`` indices of an axis of ``length`` (every one where it has no
    more): ``border`` at each end (at least the first and last: a pixel at the padding
    sums fewer terms), half the rest a contiguous run at the centre (every offset of a
    short period), the other half spread evenly over the interior between them."""
    if length <= count:
        return list(range(length))
    border = max(1, min(border, count // 4))
    chosen = set(range(border)) | set(range(length - border, length))
    run = (count - len(chosen) + 1) // 2
    start = min(max(border, length // 2 - run // 2), length - border - run)
    chosen |= set(range(start, start + run))
    interior = [index for index in range(border, length - border) if index not in chosen]
    spread = min(count - len(chosen), len(interior))
    if spread > 0:
        chosen |= {interior[int(k)] for k in
                   np.linspace(0, len(interior) - 1, spread + 2)[1:-1].round()}
    return sorted(chosen)


def sampled_grid(grid: tuple[int, int], positions: int,
                 border: tuple[int, int] = (1, 1)) -> tuple[list[int], list[int]]:
    """(rows, columns) of the output grid replayed: all of a grid of at most
    ``positions`` pixels, else about ``positions`` pixels as rows x columns, each axis
    sampled_axis's: the corners, the edges, a run at the centre and the interior."""
    height, width = grid
    if height * width <= positions:
        return list(range(height)), list(range(width))
    along_y = min(height, max(2, int(np.sqrt(positions))))
    along_x = min(width, max(2, positions // along_y))
    return (sampled_axis(height, along_y, border[0]), sampled_axis(width, along_x, border[1]))


def sampled_samples(samples: int, count: int) -> list[int]:
    """Rows (the samples in the order they ran) replayed: all of at most ``count``, else
    ``count`` spread evenly from the first to the last (other batch rows can sum in
    other orders)."""
    if samples <= count:
        return list(range(samples))
    return sorted({int(k) for k in np.linspace(0, samples - 1, count).round()})
