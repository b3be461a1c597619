"""What a 16-bit convolution computes on this CPU (run on demand; quoted in README).

    python benchmarks/half_precision.py

A 3x3 convolution of float16 inputs and weights (Cifar10-small's first layer's shape) in
Keras/TensorFlow and in torch, compared element by element with two references computed
in NumPy from the same float16 numbers:
- wide: every product and sum in float64, the result rounded to float16 once (what a
  float32 accumulator gives, up to rare ties);
- narrow: products and running sums rounded to float16 at every step (float16 arithmetic
  throughout).
The share of outputs equal to each reference says which one the framework does.
"""

from __future__ import annotations

import os

import numpy as np


def references(x: np.ndarray, kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(wide, narrow) results of a stride-1 'same' convolution, NHWC x HWIO."""
    pad = kernel.shape[0] // 2
    padded = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, kernel.shape[:2], axis=(1, 2))
    # windows: (N, H, W, C_in, kh, kw) -> terms (N, H, W, kh*kw*C_in, C_out)
    patches = windows.transpose(0, 1, 2, 4, 5, 3).reshape(*windows.shape[:3], -1)
    weights = kernel.reshape(-1, kernel.shape[-1])
    wide = (patches.astype(np.float64) @ weights.astype(np.float64)).astype(np.float16)
    narrow = np.zeros(wide.shape, dtype=np.float16)
    for term in range(patches.shape[-1]):
        product = (patches[..., term, None] * weights[term]).astype(np.float16)
        narrow = (narrow + product).astype(np.float16)
    return wide, narrow


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((1, 32, 32, 3)).astype(np.float16)
    kernel = (rng.standard_normal((3, 3, 3, 3)) * 0.5).astype(np.float16)
    wide, narrow = references(x, kernel)
    print(f"references differ on {np.mean(wide != narrow):.1%} of the outputs")
    results = {}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    results["tensorflow"] = tf.nn.conv2d(x, kernel, 1, "SAME").numpy()
    import torch

    nchw = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
    oihw = torch.from_numpy(kernel.transpose(3, 2, 0, 1).copy())
    results["torch"] = torch.nn.functional.conv2d(nchw, oihw, padding=1).numpy().transpose(
        0, 2, 3, 1)
    for name, result in results.items():
        print(f"{name}: dtype {result.dtype}; equal to wide (float32 accumulate, round once) "
              f"{np.mean(result == wide):.1%}, to narrow (float16 throughout) "
              f"{np.mean(result == narrow):.1%}")


if __name__ == "__main__":
    main()
