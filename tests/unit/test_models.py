import json
import os
import re
import zipfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from bitdrift.inputs.datasets import file_digest  # noqa: E402
from bitdrift.inputs.models import (  # noqa: E402
    ACTIVATION_CLASSES,
    build_model,
    cast_model,
    layer_probe,
    model_digest,
)
from bitdrift.run.devices import import_keras  # noqa: E402

keras = import_keras(os.environ["KERAS_BACKEND"])


def test_cifar10_small_is_table_sup6():
    model = build_model(keras, {"architecture": "cifar10_small"}, (32, 32, 3), 10)
    assert model.count_params() == 59354
    shapes = {layer.name: tuple(layer.output.shape[1:]) for layer in model.layers}
    assert shapes["conv2d"] == (32, 32, 3) and shapes["pooling2d"] == (16, 16, 3)
    assert shapes["conv2d_1"] == (16, 16, 5) and shapes["pooling2d_1"] == (8, 8, 5)
    assert shapes["flatten_1"] == (320,) and shapes["dense_3"] == (10,)
    params = {layer.name: layer.count_params() for layer in model.layers}
    assert (params["conv2d"], params["conv2d_1"], params["dense_1"], params["dense_2"],
            params["dense_3"]) == (84, 380, 41088, 16512, 1290)


def _activation_indices(model):
    """Layer indices of the activation layers, the input layer at 0 (Table SUP-8)."""
    return [index for index, layer in enumerate(model.layers)
            if layer.__class__.__name__ in ACTIVATION_CLASSES]


@pytest.mark.parametrize("activation", ["relu", "sigmoid"])
def test_cifar10_small_activations_are_layers_at_the_papers_positions(activation):
    model = build_model(keras, {"architecture": "cifar10_small", "activation": activation},
                        (32, 32, 3), 10)
    assert model.count_params() == 59354
    assert _activation_indices(model) == [2, 5, 9, 11]  # Table SUP-8, Cifar10-small
    assert model.get_layer("dense_1").get_config()["activation"] == "linear"


@pytest.mark.parametrize(("activation", "pooling"), [("relu", "max"), ("sigmoid", "avg")])
def test_resnet18_matches_tables_sup5_and_sup8(activation, pooling):
    model = build_model(keras, {"architecture": "resnet18", "activation": activation,
                                "pooling": pooling}, (32, 32, 3), 10)
    convolutions = sum(layer.count_params() for layer in model.layers
                       if layer.__class__.__name__ == "Conv2D")
    assert (model.count_params(), convolutions) == (11_191_306, 11_170_816)  # Table SUP-5
    assert _activation_indices(model) == [5, 9, 12, 18, 23, 26, 32, 37, 40, 46, 51, 54]
    pools = [i for i, layer in enumerate(model.layers) if "Pooling" in layer.__class__.__name__]
    assert pools == [2]  # the single pooling layer after the first convolution
    expected = "MaxPooling2D" if pooling == "max" else "AveragePooling2D"
    assert model.layers[2].__class__.__name__ == expected


def test_sigmoid_avg_variant_uses_xavier_and_avg_pooling():
    model = build_model(keras, {"architecture": "cifar10_small", "activation": "sigmoid",
                                "pooling": "avg"}, (32, 32, 3), 10)
    assert model.get_layer("pooling2d").__class__.__name__ == "AveragePooling2D"
    assert model.get_layer("activation").get_config()["activation"] == "sigmoid"
    assert model.get_layer("conv2d").kernel_initializer.__class__.__name__ == "GlorotUniform"


@pytest.mark.parametrize("architecture", ["resnet18", "resnet50", "resnet50v2"])
def test_resnets_return_logits(architecture):
    model = build_model(keras, {"architecture": architecture}, (32, 32, 3), 10)
    assert model.output.shape[-1] == 10
    assert model.layers[-1].get_config()["activation"] in ("linear", None)
    out = keras.ops.convert_to_numpy(model(np.random.rand(2, 32, 32, 3).astype("float32")))
    assert not np.allclose(out.sum(axis=1), 1.0)  # no softmax


@pytest.mark.parametrize("precision", ["float16", "float64"])
def test_cast_model_computes_in_the_precision(precision):
    model = build_model(keras, {"architecture": "cifar10_small"}, (32, 32, 3), 10)
    cast = cast_model(keras, model, precision)
    probe, names = layer_probe(keras, cast)
    outputs = probe(np.random.rand(1, 32, 32, 3).astype(precision))
    assert all(keras.ops.convert_to_numpy(o).dtype == np.dtype(precision) for o in outputs)
    assert [n for n, _ in names][:3] == ["conv2d", "activation", "pooling2d"]
    for original, casted in zip(model.get_weights(), cast.get_weights(), strict=True):
        assert np.array_equal(original.astype(precision), casted)


def resave_as_another_process(source, target):
    """Rewrite a .keras file as a save at another time, in another process would: a new
    `date_saved` and new `shared_object_id`s (as seen between a cluster and a local run)."""
    with zipfile.ZipFile(source) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    metadata = json.loads(members["metadata.json"])
    metadata["date_saved"] = "1999-01-01@00:00:00"
    members["metadata.json"] = json.dumps(metadata).encode()
    members["config.json"] = re.sub(rb'("shared_object_id": )(\d+)', rb"\g<1>12345",
                                    members["config.json"])
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def test_model_digest_ignores_save_time_but_not_weights(tmp_path):
    spec = {"architecture": "cifar10_small", "activation": "relu", "pooling": "max"}
    keras.utils.set_random_seed(0)
    model = build_model(keras, spec, (32, 32, 3), 10)
    first, second, changed = (tmp_path / f"{name}.keras" for name in ("a", "b", "c"))
    model.save(first)
    resave_as_another_process(first, second)
    assert b"shared_object_id" in zipfile.ZipFile(first).read("config.json")
    assert file_digest(first) != file_digest(second)
    assert model_digest(first) == model_digest(second)
    kernel = model.get_layer("dense_3").kernel
    kernel.assign(kernel.numpy() + np.float32(1e-7))  # a change in the last bits
    model.save(changed)
    assert model_digest(changed) != model_digest(first)


def test_small_cnn_is_zhuang_appendix_c():
    model = build_model(keras, {"architecture": "small_cnn"}, (32, 32, 3), 10)
    shapes = {layer.name: tuple(layer.output.shape[1:]) for layer in model.layers}
    assert (shapes["pool1"], shapes["pool2"], shapes["pool3"]) == \
        ((16, 16, 16), (8, 8, 32), (4, 4, 32))
    assert shapes["dense"] == (32,) and shapes["logits"] == (10,)
    # conv 448 + 4640 + 9248, dense 512*32+32, logits 32*10+10
    assert model.count_params() == 448 + 4640 + 9248 + 16416 + 330
    with_bn = build_model(keras, {"architecture": "small_cnn", "batch_norm": True},
                          (32, 32, 3), 10)
    assert [layer.name for layer in with_bn.layers if "bn" in layer.name] == ["bn1", "bn2", "bn3"]


@pytest.mark.parametrize("kernel_size", [1, 3, 5, 7])
def test_medium_cnn_has_six_conv_bn_blocks_of_kernel_x(kernel_size):
    model = build_model(keras, {"architecture": "medium_cnn", "kernel_size": kernel_size},
                        (32, 32, 3), 100)
    convs = [layer for layer in model.layers if layer.__class__.__name__ == "Conv2D"]
    assert [c.filters for c in convs] == [16, 32, 64, 128, 256, 512]
    assert {tuple(c.kernel_size) for c in convs} == {(kernel_size, kernel_size)}
    assert sum(layer.__class__.__name__ == "BatchNormalization" for layer in model.layers) == 6
    assert tuple(model.output.shape[1:]) == (100,)


def test_medium_cnn_with_1x1_kernels_cannot_tell_an_image_from_its_mirror_image():
    """Why the default config times kernel 2, not Zhuang's 1: with 1x1 kernels only the
    2x2 max pools (symmetric) mix pixels, so a mirrored or upside-down 32x32 image gives
    the same logits; 2x2 kernels see the order of neighbouring pixels."""
    rng = np.random.default_rng(0)
    image = rng.random((1, 32, 32, 3), dtype=np.float32)
    for mirrored in (image[:, :, ::-1], image[:, ::-1, ::-1]):
        logits = {}
        for kernel_size in (1, 2):
            keras.utils.set_random_seed(0)
            model = build_model(keras, {"architecture": "medium_cnn", "kernel_size": kernel_size,
                                        "width": 0.25}, (32, 32, 3), 10)
            logits[kernel_size] = [keras.ops.convert_to_numpy(model(x, training=False))
                                   for x in (image, np.ascontiguousarray(mirrored))]
        np.testing.assert_allclose(*logits[1], rtol=1e-5, atol=1e-6)
        assert np.abs(logits[2][0] - logits[2][1]).max() > 1e-3


def test_resnet_v2_follows_the_keras_example_depth():
    for depth, blocks in ((11, 1), (29, 3)):
        model = build_model(keras, {"architecture": "resnet_v2", "depth": depth},
                            (32, 32, 3), 10)
        convs = [layer for layer in model.layers if layer.__class__.__name__ == "Conv2D"]
        # 9n+2 = stem + 3 stages x n blocks x 3 convs + dense; plus 3 projection shortcuts
        assert len(convs) == 1 + 9 * blocks + 3 and tuple(model.output.shape[1:]) == (10,)
        assert convs[0].kernel_regularizer is not None
    with pytest.raises(ValueError, match="9n\\+2"):
        build_model(keras, {"architecture": "resnet_v2", "depth": 30}, (32, 32, 3), 10)


def test_dropout_seed_reaches_the_layer():
    model = build_model(keras, {"architecture": "small_cnn", "dropout": 0.5}, (32, 32, 3), 10,
                        dropout_seed=123)
    assert model.get_layer("dropout").seed == 123


def test_model_digest_survives_a_load_and_resave(tmp_path):
    """A trained, compiled model saved, loaded and saved again computes bit for bit the
    same: the digest must agree (before the fix the absent `shared_object_id`s, compile
    settings and optimizer state made it "another model")."""
    keras.utils.set_random_seed(0)
    model = build_model(keras, {"architecture": "cifar10_small"}, (32, 32, 3), 10)
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.zeros((4, 32, 32, 3)), np.zeros((4, 10)), verbose=0)
    first, again, weights_only = (tmp_path / f"{n}.keras" for n in ("a", "b", "c"))
    model.save(first)
    keras.saving.load_model(first).save(again)
    keras.saving.load_model(first, compile=False).save(weights_only)
    assert model_digest(first) == model_digest(again) == model_digest(weights_only)
