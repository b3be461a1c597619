"""What the Keras backends share: importing Keras on one backend in a process."""

from __future__ import annotations

import importlib
import os
import sys


def import_keras(backend: str):
    """Import Keras with ``backend``; refuse if Keras was already loaded with another."""
    if "keras" in sys.modules:
        keras = sys.modules["keras"]
        if keras.backend.backend() != backend:
            raise RuntimeError(f"Keras already loaded with backend {keras.backend.backend()!r}, "
                               f"cannot switch to {backend!r} in this process")
        return keras
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    keras = importlib.import_module("keras")
    if backend != "tensorflow":
        # Keras' serialisation asks whether TensorFlow is installed (`tf.available`) and
        # imports it to find out: a torch process would load TensorFlow (seconds of
        # start-up, and a TensorFlow version in a torch device's fingerprint). A process
        # of another backend never uses it, so Keras is told it is absent.
        from keras.src.utils import module_utils

        if "tensorflow" not in sys.modules:
            module_utils.tensorflow._available = False
    return keras


def keras_environment(backend: str) -> dict:
    return {"KERAS_BACKEND": backend}
