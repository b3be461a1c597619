"""Model architectures (Keras 3), precision casting and per-layer probes.

Every architecture returns logits (no softmax): the last recorded value is what the
network computes before any normalisation, and training uses ``from_logits=True``.
Keras is imported lazily (through :func:`bitdrift.devices.import_keras`) so that the
analysis commands never load TensorFlow or torch.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import h5py
import numpy as np

from bitdrift.datasets import file_digest

ACTIVATION_CLASSES = {"Activation", "ReLU", "LeakyReLU", "ELU", "PReLU", "Softmax"}


def _initializer(activation: str) -> str:
    # Table SUP-7: sigmoid variants use Xavier (glorot) init, ReLU variants He init.
    return "glorot_uniform" if activation == "sigmoid" else "he_uniform"


def _pool(keras, pooling: str, name: str, pool_size=2, strides=None):
    cls = keras.layers.MaxPooling2D if pooling == "max" else keras.layers.AveragePooling2D
    return cls(pool_size=pool_size, strides=strides, name=name)


def cifar10_small(keras, input_shape, classes, activation="relu", pooling="max"):
    """Cifar10-small exactly as Table SUP-6 of Schlögl et al. (59,354 parameters)."""
    layers = keras.layers
    init = _initializer(activation)
    inputs = keras.Input(input_shape, name="input")
    x = layers.Conv2D(3, 3, padding="same", kernel_initializer=init, name="conv2d")(inputs)
    x = layers.Activation(activation, name="activation")(x)
    x = _pool(keras, pooling, "pooling2d")(x)
    x = layers.Conv2D(5, 5, padding="same", kernel_initializer=init, name="conv2d_1")(x)
    x = layers.Activation(activation, name="activation_1")(x)
    x = _pool(keras, pooling, "pooling2d_1")(x)
    x = layers.Flatten(name="flatten_1")(x)
    x = layers.Dense(128, activation=activation, kernel_initializer=init, name="dense_1")(x)
    x = layers.Dense(128, activation=activation, kernel_initializer=init, name="dense_2")(x)
    outputs = layers.Dense(classes, name="dense_3")(x)
    return keras.Model(inputs, outputs, name="cifar10_small")


def resnet18(keras, input_shape, classes, activation="relu", pooling="max"):
    """CIFAR ResNet-18: 3x3 stem, one pooling layer after it, 4 stages of 2 basic blocks."""
    layers = keras.layers
    init = _initializer(activation)

    def conv_bn(x, filters, kernel, stride, name):
        x = layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False,
                          kernel_initializer=init, name=f"{name}_conv")(x)
        return layers.BatchNormalization(name=f"{name}_bn")(x)

    inputs = keras.Input(input_shape, name="input")
    x = conv_bn(inputs, 64, 3, 1, "stem")
    x = layers.Activation(activation, name="stem_act")(x)
    x = _pool(keras, pooling, "stem_pool")(x)
    for stage, filters in enumerate((64, 128, 256, 512), start=1):
        for block in (1, 2):
            stride = 2 if stage > 1 and block == 1 else 1
            name = f"stage{stage}_block{block}"
            shortcut = x
            y = conv_bn(x, filters, 3, stride, f"{name}_1")
            y = layers.Activation(activation, name=f"{name}_act1")(y)
            y = conv_bn(y, filters, 3, 1, f"{name}_2")
            if stride != 1 or x.shape[-1] != filters:
                shortcut = conv_bn(x, filters, 1, stride, f"{name}_shortcut")
            x = layers.Add(name=f"{name}_add")([y, shortcut])
            x = layers.Activation(activation, name=f"{name}_act2")(x)
    x = layers.GlobalAveragePooling2D(name="global_pool")(x)
    outputs = layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="resnet18")


def resnet50(keras, input_shape, classes, **_):
    return keras.applications.ResNet50(weights=None, include_top=True, input_shape=input_shape,
                                       classes=classes, classifier_activation=None)


def resnet50v2(keras, input_shape, classes, **_):
    return keras.applications.ResNet50V2(weights=None, include_top=True,
                                         input_shape=input_shape, classes=classes,
                                         classifier_activation=None)


ARCHITECTURES = {"cifar10_small": cifar10_small, "resnet18": resnet18, "resnet50": resnet50,
                 "resnet50v2": resnet50v2}


def build_model(keras, spec: dict, input_shape, classes: int):
    builder = ARCHITECTURES[spec["architecture"]]
    return builder(keras, tuple(input_shape), classes, activation=spec.get("activation", "relu"),
                   pooling=spec.get("pooling", "max"))


def numpy_dtype(precision: str):
    if precision == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(precision)


def _rewrite_dtypes(node, precision: str):
    if isinstance(node, dict):
        return {key: (precision if key == "dtype" and _is_float_dtype(value)
                      else _rewrite_dtypes(value, precision))
                for key, value in node.items()}
    if isinstance(node, list):
        return [_rewrite_dtypes(item, precision) for item in node]
    return node


def _is_float_dtype(value) -> bool:
    if isinstance(value, str):
        return "float" in value
    if isinstance(value, dict):  # serialized DTypePolicy
        return "float" in str(value.get("config", {}).get("name", ""))
    return False


def cast_model(keras, model, precision: str):
    """The same network computing in ``precision``: every layer's dtype policy and every
    weight cast (the reference study's precision casting). float32 returns the model."""
    current = model.dtype_policy.name if hasattr(model, "dtype_policy") else "float32"
    if precision == current:
        return model
    config = _rewrite_dtypes(model.get_config(), precision)
    cast = model.__class__.from_config(config)
    target = numpy_dtype(precision)
    cast.set_weights([np.asarray(w).astype(target) if np.asarray(w).dtype.kind == "f"
                      else w for w in model.get_weights()])
    return cast


def layer_probe(keras, model):
    """A model returning every layer's output; and the recorded layers' (name, class)."""
    outputs, names = [], []
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        try:
            output = layer.output
        except (AttributeError, ValueError):
            continue  # a layer used several times has no single output to record
        if isinstance(output, list | tuple):
            continue
        outputs.append(output)
        names.append((layer.name, layer.__class__.__name__))
    return keras.Model(model.inputs, outputs), names


def _canonical_config(node, shared_ids: dict):
    """A Keras config with run-specific parts made canonical: `shared_object_id` is a
    Python object id (differs per process), so it is renumbered by first appearance."""
    if isinstance(node, dict):
        return {
            key: (shared_ids.setdefault(value, len(shared_ids)) if key == "shared_object_id"
                  else _canonical_config(value, shared_ids))
            for key, value in sorted(node.items())
        }
    if isinstance(node, list):
        return [_canonical_config(item, shared_ids) for item in node]
    return node


def _hash_weights(digest, handle) -> None:
    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            values = np.ascontiguousarray(obj[()])
            digest.update(f"{name}|{values.dtype.str}|{values.shape}\n".encode())
            digest.update(values.tobytes())

    handle.visititems(visit)


def model_digest(path) -> str:
    """SHA-256 of what a saved model computes: its architecture and its weights.

    A `.keras` file also stores the save time and process-specific object ids, so two
    saves of the same trained model differ byte for byte; this digest does not (the same
    training on a cluster node and on a laptop gives the same digest). Other files are
    hashed as bytes.
    """
    path = Path(path)
    if not zipfile.is_zipfile(path):
        return file_digest(path)
    digest = hashlib.sha256()
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
        digest.update(json.dumps(_canonical_config(config, {}), sort_keys=True).encode())
        with h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as weights:
            _hash_weights(digest, weights)
    return digest.hexdigest()
