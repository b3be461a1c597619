"""A small Keras CNN saved as a ``.keras`` archive, NHWC: Conv2D, ReLU, DepthwiseConv2D,
ReLU, MaxPooling2D, Flatten, Dense, ReLU, Dense; seeded weights (numpy, not Keras'
initialisers, so the file is the same whatever Keras backend builds it). Its input is
(32, 32, 3), the shape of the embedded digits dataset's images (config key
``dataset: digits``, no download), which a Keras model reads; its inputs file holds
seeded uniform [0, 1) samples of that shape, float32, for the tests and the quantizers'
calibration (bitdrift.backends.exported.litert_quantization)."""

from __future__ import annotations

import numpy as np

INPUT_SHAPE = (32, 32, 3)
CLASSES = 10
SUFFIX = ".keras"


def build_model(seed: int = 0):
    """The keras.Model with seeded weights."""
    import os

    # any backend builds the same file (numpy weights); TensorFlow where none is loaded yet
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras

    layers = keras.layers
    inputs = keras.Input(shape=INPUT_SHAPE, name="image")
    x = layers.Conv2D(8, 3, padding="same", name="conv")(inputs)
    x = layers.ReLU(name="conv_relu")(x)
    x = layers.DepthwiseConv2D(3, padding="same", name="depthwise")(x)
    x = layers.ReLU(name="depthwise_relu")(x)
    x = layers.MaxPooling2D(4, name="pool")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(32, name="fc1")(x)
    x = layers.ReLU(name="fc1_relu")(x)
    outputs = layers.Dense(CLASSES, name="fc2")(x)
    model = keras.Model(inputs, outputs, name="keras_cnn")
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        weights = []
        for value in layer.get_weights():
            terms = int(np.prod(value.shape[:-1])) if value.ndim > 1 else value.shape[0]
            weights.append((rng.standard_normal(value.shape) / np.sqrt(max(terms, 1)))
                           .astype(np.float32))
        layer.set_weights(weights)
    return model


def make_inputs(samples: int = 16, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((samples, *INPUT_SHAPE), dtype=np.float32)


def write(model_path, inputs_path, samples: int = 16, seed: int = 0) -> None:
    """The model (Keras' .keras archive) and its inputs, each written atomically."""
    from bitdrift.atomic import atomic_output

    with atomic_output(model_path) as partial:
        build_model(seed).save(str(partial))
    with atomic_output(inputs_path) as partial:
        with open(partial, "wb") as handle:
            np.save(handle, make_inputs(samples))
