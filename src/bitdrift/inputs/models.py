"""Model architectures (Keras 3), precision casting and per-layer probes.

Every architecture returns logits (no softmax): the last recorded value is what the
network computes before any normalisation, and training uses ``from_logits=True``.
Keras is imported lazily (through :func:`bitdrift.run.devices.import_keras`) so that the
analysis commands never load TensorFlow or torch.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from pathlib import Path

import h5py
import numpy as np

from bitdrift.inputs.datasets import file_digest

ACTIVATION_CLASSES = {"Activation", "ReLU", "LeakyReLU", "ELU", "PReLU", "Softmax"}
LAYER_KINDS = {"convolution": ("Conv",), "activation": tuple(ACTIVATION_CLASSES),
               "pooling": ("Pooling",), "dense": ("Dense",)}


def layer_kind(layer_class: str) -> str:
    """convolution, activation, pooling, dense, or '' (any other layer), from the layer's
    Keras class name as the records keep it."""
    for kind, markers in LAYER_KINDS.items():
        if any(marker in str(layer_class) for marker in markers):
            return kind
    return ""


def _initializer(activation: str) -> str:
    # Table SUP-7: sigmoid variants use Xavier (glorot) init, ReLU variants He init; the
    # linear model of Figure SUP-6 uses the sigmoid model's initial weights.
    return "glorot_uniform" if activation in ("sigmoid", "linear") else "he_uniform"


def _pool(keras, pooling: str, name: str, pool_size=2, strides=None):
    cls = keras.layers.MaxPooling2D if pooling == "max" else keras.layers.AveragePooling2D
    return cls(pool_size=pool_size, strides=strides, name=name)


def cifar10_small(keras, input_shape, classes, activation="relu", pooling="max", **_):
    """Cifar10-small exactly as Table SUP-6 of Schlögl et al. (59,354 parameters).

    Every activation is a layer of its own (the dense layers' too), so the per-layer
    records see the values before and after each one; with the input layer at index 0
    the activations sit at layer indices 2, 5, 9 and 11, Table SUP-8's positions.
    """
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
    x = layers.Dense(128, kernel_initializer=init, name="dense_1")(x)
    x = layers.Activation(activation, name="activation_2")(x)
    x = layers.Dense(128, kernel_initializer=init, name="dense_2")(x)
    x = layers.Activation(activation, name="activation_3")(x)
    outputs = layers.Dense(classes, name="dense_3")(x)
    return keras.Model(inputs, outputs, name="cifar10_small")


def resnet18(keras, input_shape, classes, activation="relu", pooling="max", **_):
    """Cifar10-R18 as far as the reference study pins it down (Tables SUP-5 and SUP-8).

    Table SUP-5: 11,191,306 parameters, 11,170,816 of them in convolutions; Table SUP-8:
    12 activation layers, at layer indices 5, 9, 12, 18, 23, 26, 32, 37, 40, 46, 51, 54
    (input at 0). One architecture gives all of these: a 7x7 stride-2 stem convolution
    with bias and no BatchNorm or activation, one pooling layer, 4 stages of 2 basic
    blocks whose 3x3 convolutions carry a bias and a BatchNorm, 1x1 projection shortcuts
    without bias or BatchNorm, an activation after the first block's addition of each
    stage but none after the second's, then flatten and the dense output (1x1x512 on
    32x32 inputs). The 2x2 pooling window is an assumption: it changes no count.
    """
    layers = keras.layers
    init = _initializer(activation)

    def conv_bn(x, filters, stride, name):
        x = layers.Conv2D(filters, 3, strides=stride, padding="same",
                          kernel_initializer=init, name=f"{name}_conv")(x)
        return layers.BatchNormalization(name=f"{name}_bn")(x)

    inputs = keras.Input(input_shape, name="input")
    x = layers.Conv2D(64, 7, strides=2, padding="same", kernel_initializer=init,
                      name="stem_conv")(inputs)
    x = _pool(keras, pooling, "stem_pool")(x)
    for stage, filters in enumerate((64, 128, 256, 512), start=1):
        for block in (1, 2):
            stride = 2 if stage > 1 and block == 1 else 1
            name = f"stage{stage}_block{block}"
            y = conv_bn(x, filters, stride, f"{name}_1")
            y = layers.Activation(activation, name=f"{name}_act1")(y)
            y = conv_bn(y, filters, 1, f"{name}_2")
            shortcut = x
            if stride != 1 or x.shape[-1] != filters:  # built after the block's convs:
                shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False,
                                         kernel_initializer=init,  # the layer order
                                         name=f"{name}_shortcut")(x)  # of Table SUP-8
            x = layers.Add(name=f"{name}_add")([y, shortcut])
            if block == 1:
                x = layers.Activation(activation, name=f"{name}_act2")(x)
    x = layers.Flatten(name="flatten")(x)
    outputs = layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="resnet18")


def _set_batch_norm_momentum(keras, model, momentum):
    # keras.applications builds its BatchNormalization layers with Keras' default.
    if momentum is not None:
        for layer in model.layers:
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.momentum = momentum
    return model


def resnet50(keras, input_shape, classes, batch_norm_momentum=None, **_):
    """keras.applications ResNet-50, untrained, logits (Morin & Willetts' model)."""
    model = keras.applications.ResNet50(weights=None, include_top=True,
                                        input_shape=input_shape, classes=classes,
                                        classifier_activation=None)
    return _set_batch_norm_momentum(keras, model, batch_norm_momentum)


def resnet50v2(keras, input_shape, classes, **_):
    return keras.applications.ResNet50V2(weights=None, include_top=True,
                                         input_shape=input_shape, classes=classes,
                                         classifier_activation=None)


def _dropout(keras, x, rate: float, seed: int | None):
    # The dropout seed is its own switch (Zhuang et al.), separate from the init seed.
    if not rate:
        return x
    return keras.layers.Dropout(rate, seed=seed, name="dropout")(x)


def small_cnn(keras, input_shape, classes, batch_norm=False, dropout=0.0, dropout_seed=None,
              batch_norm_momentum=0.99, **_):
    """Zhuang et al.'s three-layer small CNN (Appendix C): 3 x [conv 3x3, ReLU, max pool]
    with 16, 32, 32 filters, a dense layer of 32 and the output layer. ``batch_norm`` puts
    batch normalisation after each convolution (their Figure 3)."""
    layers = keras.layers
    inputs = keras.Input(input_shape, name="input")
    x = inputs
    for index, filters in enumerate((16, 32, 32), start=1):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=not batch_norm,
                          name=f"conv{index}")(x)
        if batch_norm:
            x = layers.BatchNormalization(momentum=batch_norm_momentum, name=f"bn{index}")(x)
        x = layers.Activation("relu", name=f"relu{index}")(x)
        x = layers.MaxPooling2D(2, padding="same", name=f"pool{index}")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(32, activation="relu", name="dense")(x)
    x = _dropout(keras, x, dropout, dropout_seed)
    outputs = layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="small_cnn")


def medium_cnn(keras, input_shape, classes, kernel_size=3, width=1.0, dropout=0.0,
               dropout_seed=None, batch_norm_momentum=0.99, **_):
    """Zhuang et al.'s six-layer medium CNN (Appendix C): 6 x [conv XxX stride 1, BN, ReLU,
    max pool] with 16..512 filters (times ``width``), global average pooling, output layer.
    Pools use 'same' padding so that 32x32 inputs survive six halvings."""
    layers = keras.layers
    inputs = keras.Input(input_shape, name="input")
    x = inputs
    for index, filters in enumerate((16, 32, 64, 128, 256, 512), start=1):
        x = layers.Conv2D(max(1, int(round(filters * width))), kernel_size, padding="same",
                          use_bias=False, name=f"conv{index}")(x)
        x = layers.BatchNormalization(momentum=batch_norm_momentum, name=f"bn{index}")(x)
        x = layers.Activation("relu", name=f"relu{index}")(x)
        x = layers.MaxPooling2D(2, padding="same", name=f"pool{index}")(x)
    x = layers.GlobalAveragePooling2D(name="global_pool")(x)
    x = _dropout(keras, x, dropout, dropout_seed)
    outputs = layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=f"medium_cnn_k{kernel_size}")


def resnet_v2(keras, input_shape, classes, depth=29, **_):
    """ResNet v2 of the Keras example ``cifar10_resnet.py`` (the code Morin & Willetts ran,
    depth 29): pre-activation bottleneck blocks, depth = 9n + 2, L2 1e-4, He-normal init."""
    if depth < 11 or (depth - 2) % 9:
        raise ValueError(f"resnet_v2 depth must be 9n+2 (11, 20, 29, 56, 110...), got {depth}")
    layers = keras.layers
    regularizer = keras.regularizers.L2(1e-4)
    counter = iter(range(10_000))

    def unit(x, filters, kernel=3, strides=1, activation="relu", batch_norm=True,
             conv_first=True):
        index = next(counter)
        conv = layers.Conv2D(filters, kernel, strides=strides, padding="same",
                             kernel_initializer="he_normal", kernel_regularizer=regularizer,
                             name=f"conv{index}")
        if conv_first:
            x = conv(x)
        if batch_norm:
            x = layers.BatchNormalization(name=f"bn{index}")(x)
        if activation:
            x = layers.Activation(activation, name=f"relu{index}")(x)
        return x if conv_first else conv(x)

    blocks = (depth - 2) // 9
    filters_in = 16
    inputs = keras.Input(input_shape, name="input")
    x = unit(inputs, filters_in)
    for stage in range(3):
        for block in range(blocks):
            activation, batch_norm, strides = "relu", True, 1
            if stage == 0:
                filters_out = filters_in * 4
                if block == 0:
                    activation, batch_norm = None, False
            else:
                filters_out = filters_in * 2
                if block == 0:
                    strides = 2
            y = unit(x, filters_in, 1, strides, activation, batch_norm, conv_first=False)
            y = unit(y, filters_in, conv_first=False)
            y = unit(y, filters_out, 1, conv_first=False)
            if block == 0:
                x = unit(x, filters_out, 1, strides, activation=None, batch_norm=False)
            x = layers.Add(name=f"add{stage}_{block}")([x, y])
        filters_in = filters_out
    x = layers.BatchNormalization(name="bn_final")(x)
    x = layers.Activation("relu", name="relu_final")(x)
    x = layers.AveragePooling2D(pool_size=x.shape[1], name="pool")(x)  # 8 for 32x32 inputs
    x = layers.Flatten(name="flatten")(x)
    outputs = layers.Dense(classes, kernel_initializer="he_normal", name="logits")(x)
    return keras.Model(inputs, outputs, name=f"resnet{depth}_v2")


_CUSTOM_LAYERS: dict = {}


def register_layers(keras) -> dict:
    """bitdrift's own Keras layers, registered for loading (``bitdrift>Name`` in a saved
    model's config); every process that loads a model calls this first."""
    if _CUSTOM_LAYERS:
        return _CUSTOM_LAYERS

    @keras.saving.register_keras_serializable(package="bitdrift")
    class PositionEmbedding(keras.layers.Layer):
        """A learned embedding per position, added to its input (batch, length, width);
        ``context`` positions exist, so a sequence may be any length up to it."""

        def __init__(self, context, embeddings_initializer="glorot_uniform", **kwargs):
            super().__init__(**kwargs)
            self.context = int(context)
            self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

        def build(self, input_shape):
            self.embeddings = self.add_weight(
                shape=(self.context, int(input_shape[-1])), name="embeddings",
                initializer=self.embeddings_initializer)

        def call(self, inputs):
            # A gather of positions 0..length-1 (LiteRT has no built-in slice of a length
            # known only at run time; a gather and a range it has).
            positions = keras.ops.take(self.embeddings,
                                       keras.ops.arange(keras.ops.shape(inputs)[1]), axis=0)
            return inputs + keras.ops.expand_dims(keras.ops.cast(positions, inputs.dtype), 0)

        def compute_output_shape(self, input_shape):
            return input_shape

        def get_config(self):
            return {**super().get_config(), "context": self.context,
                    "embeddings_initializer":
                        keras.initializers.serialize(self.embeddings_initializer)}

    @keras.saving.register_keras_serializable(package="bitdrift")
    class CausalMask(keras.layers.Layer):
        """The causal attention mask of a (batch, length, ...) input: (1, length, length),
        True where a position may attend (itself and earlier positions). Built here, not
        by MultiHeadAttention's ``use_causal_mask``, whose mask LiteRT cannot run without
        TensorFlow's own kernels (a 4-D strided slice)."""

        def call(self, inputs):
            positions = keras.ops.arange(keras.ops.shape(inputs)[1])
            return keras.ops.expand_dims(keras.ops.expand_dims(positions, 1)
                                         >= keras.ops.expand_dims(positions, 0), 0)

        def compute_output_spec(self, inputs):
            return keras.KerasTensor((1, inputs.shape[1], inputs.shape[1]), dtype="bool")

    _CUSTOM_LAYERS.update(PositionEmbedding=PositionEmbedding, CausalMask=CausalMask)
    return _CUSTOM_LAYERS


def tiny_transformer(keras, input_shape, classes, blocks=2, embedding_size=64, heads=4,
                     context=64, **_):
    """A small decoder-only transformer (the batch-invariance study's model): token and
    position embeddings, ``blocks`` pre-norm blocks of causal multi-head self-attention
    and a SiLU MLP (4x wide; not GELU, whose erfc tf2onnx cannot export) with residual
    additions, a final LayerNorm and the vocabulary head (``classes`` logits per
    position). Inputs are token ids as floats (every runtime takes float32; the
    embedding casts them to integers), of any length up to ``context``: the sequence
    axis is left open so the same model runs padded."""
    layers = keras.layers
    custom = register_layers(keras)
    inputs = keras.Input((None,), name="tokens")
    mask = custom["CausalMask"](name="causal_mask")(inputs)
    x = layers.Embedding(classes, embedding_size, name="token_embedding")(inputs)
    x = custom["PositionEmbedding"](context, name="position_embedding")(x)
    for block in range(1, blocks + 1):
        name = f"block{block}"
        h = layers.LayerNormalization(epsilon=1e-5, name=f"{name}_norm1")(x)
        h = layers.MultiHeadAttention(heads, embedding_size // heads,
                                      name=f"{name}_attention")(h, h, attention_mask=mask)
        x = layers.Add(name=f"{name}_add1")([x, h])
        h = layers.LayerNormalization(epsilon=1e-5, name=f"{name}_norm2")(x)
        h = layers.Dense(4 * embedding_size, name=f"{name}_mlp_up")(h)
        h = layers.Activation("silu", name=f"{name}_silu")(h)
        h = layers.Dense(embedding_size, name=f"{name}_mlp_down")(h)
        x = layers.Add(name=f"{name}_add2")([x, h])
    x = layers.LayerNormalization(epsilon=1e-5, name="final_norm")(x)
    outputs = layers.Dense(classes, name="logits")(x)
    return keras.Model(inputs, outputs, name="tiny_transformer")


ARCHITECTURES = {"cifar10_small": cifar10_small, "resnet18": resnet18, "resnet50": resnet50,
                 "resnet50v2": resnet50v2, "small_cnn": small_cnn, "medium_cnn": medium_cnn,
                 "resnet_v2": resnet_v2, "tiny_transformer": tiny_transformer}
# Options an architecture entry may carry (config keys passed on to the builder).
ARCHITECTURE_OPTIONS = ("activation", "pooling", "batch_norm", "kernel_size", "width", "depth",
                        "dropout", "batch_norm_momentum", "blocks", "embedding_size", "heads",
                        "context")


def build_model(keras, spec: dict, input_shape, classes: int, dropout_seed: int | None = None):
    builder = ARCHITECTURES[spec["architecture"]]
    options = {key: spec[key] for key in ARCHITECTURE_OPTIONS if key in spec}
    if dropout_seed is not None:
        options["dropout_seed"] = dropout_seed
    return builder(keras, tuple(input_shape), classes, **options)


def numpy_dtype(precision: str):
    if precision == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(precision)


def rewrite_dtypes(node, precision: str):
    if isinstance(node, dict):
        return {key: (precision if key == "dtype" and _is_float_dtype(value)
                      else rewrite_dtypes(value, precision))
                for key, value in node.items()}
    if isinstance(node, list):
        return [rewrite_dtypes(item, precision) for item in node]
    return node


def _is_float_dtype(value) -> bool:
    if isinstance(value, str):
        return "float" in value
    if isinstance(value, dict):  # serialized DTypePolicy
        return "float" in str(value.get("config", {}).get("name", ""))
    return False


def keep_float64(keras) -> None:
    """Keras 3 promotes float64 with float64 to float32 on every backend but TensorFlow
    (``BIT64_TO_BIT32_DTYPE``, JAX's default without x64), and the torch backend's matmul
    computes in that promoted type: a float64 model's Dense layers ran in float32. A
    float64 device must compute in float64, so the promotion table keeps it (this process
    computes in float64 only; the effective-precision check verifies every layer)."""
    from keras.src.backend.common import dtypes

    dtypes.BIT64_TO_BIT32_DTYPE["float64"] = "float64"


def cast_model(keras, model, precision: str):
    """The same network computing in ``precision``: every layer's dtype policy and every
    weight cast (the reference study's precision casting). float32 returns the model."""
    if precision == "float64":
        keep_float64(keras)
    current = model.dtype_policy.name if hasattr(model, "dtype_policy") else "float32"
    if precision == current:
        return model
    config = rewrite_dtypes(model.get_config(), precision)
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
        if isinstance(output, list | tuple) or "float" not in str(output.dtype):
            continue  # several outputs, or no values to compare (a boolean mask)
        outputs.append(output)
        names.append((layer.name, layer.__class__.__name__))
    # A single input as a tensor, not a one-element list: called with a batch, a list
    # structure would warn on every call ("structure of `inputs` doesn't match").
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
    return keras.Model(inputs, outputs), names


# Parts of a saved model that do not change what it computes: Python object ids (present
# on a first save, absent after a load and re-save), the compile settings and the input
# build record (the layers' own configs carry their shapes).
_NOT_ARCHITECTURE = {"shared_object_id", "compile_config", "build_config"}


def _canonical_config(node):
    """A Keras config with what does not change the computation left out, keys sorted."""
    if isinstance(node, dict):
        return {key: _canonical_config(value) for key, value in sorted(node.items())
                if key not in _NOT_ARCHITECTURE}
    if isinstance(node, list):
        return [_canonical_config(item) for item in node]
    return node


def _hash_weights(digest, handle) -> None:
    def visit(name, obj):
        # The optimizer's state (slots, iteration count) is not part of the model's function.
        if isinstance(obj, h5py.Dataset) and not name.startswith("optimizer"):
            values = np.ascontiguousarray(obj[()])
            digest.update(f"{name}|{values.dtype.str}|{values.shape}\n".encode())
            digest.update(values.tobytes())

    handle.visititems(visit)


def model_input_shape(path) -> tuple | None:
    """The input shape (without the batch) a `.keras` file declares, read from its
    config without Keras; None for other files or a model with several inputs."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
    shapes = [layer["config"].get("batch_shape")
              for layer in config.get("config", {}).get("layers", [])
              if layer.get("class_name") == "InputLayer"]
    if len(shapes) != 1 or not shapes[0]:
        return None
    return tuple(shapes[0][1:])


def layer_inbound(path) -> dict[str, list[str]]:
    """{layer: the layers whose outputs it takes} of a `.keras` file, read from its
    config without Keras (every tensor a layer's call receives, masks included)."""
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))

    def sources(node):
        if isinstance(node, dict):
            history = node.get("config", {}).get("keras_history") \
                if node.get("class_name") == "__keras_tensor__" else None
            if history:
                return [history[0]]
            return [name for value in node.values() for name in sources(value)]
        if isinstance(node, list):
            return [name for value in node for name in sources(value)]
        return []

    return {layer["config"]["name"]: list(dict.fromkeys(sources(layer.get("inbound_nodes"))))
            for layer in config.get("config", {}).get("layers", [])}


def _snake_case(name: str) -> str:
    """Keras' own name of a layer class in its weights file (keras.src.utils.naming)."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def keras_file_layers(path) -> list[dict]:
    """Every top-level layer of a `.keras` file, read without Keras, in model order:
    ``{"name", "class_name", "config", "inbound": [layer names], "weights": [arrays]}``.

    Keras stores a functional model's weights under ``layers/<class in snake case>[_k]``
    (the k-th layer of that class), not under the layer's own name; the shapes are
    checked against the config's units/filters so a file laid out otherwise is refused."""
    from bitdrift.errors import RecordError

    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
            weights_bytes = archive.read("model.weights.h5")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
        raise RecordError(f"{path}: not a readable .keras model ({error})") from error
    inbound = layer_inbound(path)
    layers, used = [], {}
    with h5py.File(io.BytesIO(weights_bytes), "r") as weights:
        for entry in config.get("config", {}).get("layers", []):
            key = _snake_case(entry["class_name"])
            used[key] = used.get(key, -1) + 1
            key = f"{key}_{used[key]}" if used[key] else key
            group = weights.get(f"layers/{key}/vars")
            values = [np.asarray(group[str(index)]) for index in range(len(group))] \
                if isinstance(group, h5py.Group) else []
            layer = {"name": entry["config"]["name"], "class_name": entry["class_name"],
                     "config": entry["config"], "inbound": inbound.get(entry["config"]["name"],
                                                                       []),
                     "weights": values}
            size = entry["config"].get("units") or entry["config"].get("filters")
            if size and values and values[0].shape[-1] != size:
                raise RecordError(f"{path}: weights of layer {layer['name']!r} have shape "
                                  f"{values[0].shape}, not {size} outputs (another Keras "
                                  "weights layout)")
            layers.append(layer)
    return layers


def model_digest(path) -> str:
    """SHA-256 of what a saved model computes: its architecture and its weights.

    A `.keras` file also stores the save time, process-specific object ids, the compile
    settings and the optimizer's state, so two saves of the same trained model differ byte
    for byte; this digest does not (a load and re-save, or the same training on a cluster
    node and on a laptop, give the same digest). Other files are hashed as bytes.
    """
    path = Path(path)
    if not zipfile.is_zipfile(path):
        return file_digest(path)
    digest = hashlib.sha256()
    with zipfile.ZipFile(path) as archive:
        if "config.json" not in archive.namelist():  # a zip of another format (.pt2)
            return file_digest(path)
        config = json.loads(archive.read("config.json"))
        digest.update(json.dumps(_canonical_config(config), sort_keys=True).encode())
        with h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as weights:
            _hash_weights(digest, weights)
    return digest.hexdigest()
