"""The exported runtimes (ONNX Runtime, OpenVINO, LiteRT): real exports of a small saved
model, real inference in fresh processes, per-layer outputs checked against Keras' own."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bitdrift.backends.exported.expected import Reference, mapped_positions, read_reference
from bitdrift.errors import AcceleratorMissing, InferenceError
from bitdrift.inputs.datasets import prepare_dataset, read_test_images
from bitdrift.record.reader import Record
from bitdrift.run.inference import infer

CPU = {"accelerator": "cpu", "threads": 1, "batch_size": 1, "precision": "float32",
       "env": {}, "repeats": 2, "external": False}
DEVICES = {
    "onnxruntime": {"backend": "onnxruntime", "graph_optimization_level": "all"},
    "onnxruntime_disable_all": {"backend": "onnxruntime",
                                "graph_optimization_level": "disable_all"},
    "openvino": {"backend": "openvino", "execution_mode": "ACCURACY"},
    "litert": {"backend": "litert", "op_resolver": "xnnpack"},
    "litert_builtin": {"backend": "litert", "op_resolver": "builtin", "batch_size": 2},
}
FILES = {"onnxruntime": "model.onnx", "openvino": "model.onnx", "litert": "model.tflite"}
DEPLOYED_FILES = {backend: file.replace("model.", "deployed.") for backend, file in FILES.items()}
SAMPLES = [6, 0, 3]
TF = {**os.environ, "KERAS_BACKEND": "tensorflow"}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A saved model, its exports and reference (bitdrift's own export, in a TensorFlow
    process), and every layer's output as Keras computes it (the truth of the mapping)."""
    tmp = tmp_path_factory.mktemp("exported")
    dataset = tmp / "digits.h5"
    prepare_dataset("digits", {"source": "digits", "limit_train": 8, "limit_test": 40}, dataset)
    model = tmp / "small.keras"
    code = f"""
import sys, keras, numpy as np
from bitdrift.inputs.models import build_model, layer_probe
from bitdrift.inputs.datasets import read_test_images
from bitdrift.backends.keras.export import export_model, write_reference
keras.utils.set_random_seed(0)
build_model(keras, {{'architecture': 'cifar10_small'}}, (32, 32, 3), 10).save(sys.argv[1])
model = keras.saving.load_model(sys.argv[1])
probe, layers = layer_probe(keras, model)
images = read_test_images(sys.argv[2], {SAMPLES}).astype('float32')
outputs = [keras.ops.convert_to_numpy(v) for v in probe(images)]
np.savez(sys.argv[3] + '/keras_layers.npz', names=[n for n, _ in layers], *outputs)
write_reference(sys.argv[1], sys.argv[2], sys.argv[3] + '/reference.npz')
export_model(sys.argv[1], 'onnx', sys.argv[3] + '/model.onnx', sys.argv[3] + '/deployed.onnx')
export_model(sys.argv[1], 'tflite', sys.argv[3] + '/model.tflite',
             sys.argv[3] + '/deployed.tflite')
"""
    subprocess.run([sys.executable, "-c", code, str(model), str(dataset), str(tmp)],
                   check=True, env=TF)
    with np.load(tmp / "keras_layers.npz") as data:
        names = [str(name) for name in data["names"]]
        keras_layers = {name: data[f"arr_{index}"] for index, name in enumerate(names)}
    return tmp, dataset, model, keras_layers


def run(assets, tmp_path, name, device, export=None, reference=None):
    folder, dataset, model, _ = assets
    backend = device["backend"]
    out = tmp_path / f"{name}.h5"
    with open(tmp_path / "log", "w") as log:
        infer(model_name="small", device_name=name, device=device, model_path=model,
              dataset_path=dataset, samples=SAMPLES, out=out, log=log,
              reference=reference or folder / "reference.npz",
              export=export or folder / FILES[backend],
              deployed_export=folder / DEPLOYED_FILES[backend])
    return out


@pytest.mark.parametrize("name", DEVICES)
def test_an_exported_runtime_records_every_layer_as_keras_computes_it(assets, tmp_path, name):
    """The layer mapping: each recorded layer equals the Keras layer of that name within
    float32 tolerance (so no layer carries another's values), before bitwise comparison."""
    _, _, _, keras_layers = assets
    device = {**CPU, **DEVICES[name]}
    out = run(assets, tmp_path, name, device)
    with Record(out) as record:
        assert record.attr("backend") == device["backend"]
        assert record.samples == sorted(SAMPLES)
        names = [info.name for info in record.layers(0) if info.name != "output"]
        assert names == list(keras_layers)  # every layer mapped, in the probe's order
        for row, sample in enumerate(SAMPLES):
            for layer, expected in keras_layers.items():
                values = record.tensor(sample, layer).values
                assert values.shape == (2, *expected.shape[1:]) and values.dtype == np.float32
                np.testing.assert_allclose(values[0], expected[row], rtol=1e-4,
                                           atol=1e-5 * np.abs(expected[row]).max())
            instrumented = record.instrumented_output(sample).values
            assert np.array_equal(instrumented, record.tensor(sample, "dense_3").values)
            # the observer check: the deployed export (final output alone) is the same
            # model, and the record's verdict is the bitwise comparison, recounted here
            deployed = record.tensor(sample, "output").values
            expected = keras_layers["dense_3"][row]
            np.testing.assert_allclose(deployed[0], expected, rtol=1e-4,
                                       atol=1e-5 * np.abs(expected).max())
            assert record.observer_check["samples"][str(sample)] == (
                deployed[0].tobytes() == instrumented[0].tobytes())
        assert DEPLOYED_FILES[device["backend"]] in record.observer_check["program"]
        assert record.attr("deployed_export_sha256")
        agreement = json.loads(record.attr("argmax_agreement"))
        assert agreement["images"] == 40 and agreement["share"] >= 0.99
        assert device["backend"] in record.fingerprint["versions"]
        for framework in ("tensorflow", "torch", "jax", "keras"):
            assert framework not in record.fingerprint["versions"]
        assert record.attr("export_sha256")
        effective = record.effective_precision
        assert sorted(effective) == ["conv2d", "conv2d_1", "dense_1", "dense_2", "dense_3"]
        assert not any(result["reduced"] for result in effective.values())
        check_kernels(record.kernels, name, assets[0] / FILES[device["backend"]])


PREFIXES = {"onnxruntime": ("ort ",), "openvino": ("ov ",), "litert": ("xnnpack ", "tflite ")}


def check_kernels(kernels, name, export):
    """The runtime's description of its compiled graph, in the record's kernels: a kernel
    for every Conv and Dense layer, of the runtime's own naming, the traced repeat's
    outputs equal to the measured ones; and what can be known another way: ONNX Runtime
    without optimisations runs the file's own MatMul/Add/Gemm nodes, LiteRT's built-in
    resolver runs no XNNPACK, OpenVINO's ACCURACY mode computes in f32 with kernels of an
    instruction set this CPU has."""
    import onnx

    backend = DEVICES[name]["backend"]
    assert kernels["traced"] and kernels["outputs_match"]
    compute = {layer: kernels["layers"][layer]["signature"]
               for layer, layer_class in kernels["layer_classes"].items()
               if layer_class in ("Conv2D", "Dense")}
    assert len(compute) == 5
    for names in compute.values():
        assert all(part.startswith(PREFIXES[backend]) for part in names.split("+")), names
    if name == "onnxruntime_disable_all":
        # the file's own products and sums (its dense layers are alike)
        file_ops = {node.op_type for node in onnx.load(export).graph.node}
        dense_ops = "+".join(sorted(f"ort {op}" for op in file_ops & {"MatMul", "Add", "Gemm"}))
        assert {compute[layer] for layer in ("dense_1", "dense_2", "dense_3")} == {dense_ops}
    if name == "litert_builtin":
        assert all(names.startswith("tflite ") and names.endswith("(optimized)")
                   for names in compute.values()), compute
    # the deployed graph's kernels beside the instrumented graph's (the observer check)
    deployed = kernels["deployed"]
    assert deployed["deployed"] and deployed["instrumented"]
    assert deployed["differs"] == (sorted(deployed["deployed"])
                                   != sorted(deployed["instrumented"]))
    if name == "onnxruntime_disable_all":
        # unoptimised, each graph runs its file's own arithmetic nodes
        from bitdrift.backends.exported.onnxruntime import LAYOUT_OPS

        for side, file in (("deployed", "deployed.onnx"), ("instrumented", "model.onnx")):
            file_ops = sorted(f"ort {node.op_type}" for node in
                              onnx.load(export.parent / file).graph.node
                              if node.op_type not in LAYOUT_OPS | {"Cast"})
            assert sorted(call for call in deployed[side] if call != "ort Cast") == file_ops
    if backend == "litert":
        # XNNPACK takes every arithmetic node of both files, the built-in resolver none
        prefix = "tflite " if name == "litert_builtin" else "xnnpack "
        assert all(call.startswith(prefix) for call in deployed["deployed"]), deployed
    if name == "openvino":
        with open("/proc/cpuinfo") as cpuinfo:
            flags = set(next(line for line in cpuinfo if line.startswith("flags")).split())
        for layer, names in compute.items():
            assert names.endswith("f32"), (layer, names)
            calls = kernels["layers"][layer]["calls"]
            assert all(not call["isa"] or any(flag.startswith(call["isa"]) for flag in flags)
                       for call in calls), calls


def onnx_graph_digest(path) -> str:
    """What an ONNX file computes, its node and value names left out: each node's digest
    is its op, its attributes and its inputs' digests (a weight's by its values); the
    file's is the nodes' digests and the outputs'. tf2onnx names the Transpose nodes its
    optimiser adds from a counter whose order varies from one process to the next (two
    runs of one export differ in bytes), so equal files are compared by this."""
    import hashlib

    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)

    def digest(*parts):
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    values = {"": ""}
    for weight in model.graph.initializer:
        array = numpy_helper.to_array(weight)
        values[weight.name] = digest(str(array.dtype), array.shape, array.tobytes())
    for given in model.graph.input:
        values.setdefault(given.name, digest("input", given.name))
    nodes = []
    for node in model.graph.node:  # ONNX lists nodes in topological order
        nodes.append(digest(node.op_type, node.domain,
                            sorted((a.name, a.SerializeToString()) for a in node.attribute),
                            [values[name] for name in node.input]))
        values.update({name: digest(nodes[-1], index)
                       for index, name in enumerate(node.output)})
    return digest(sorted(nodes), [(output.name, values[output.name])
                                  for output in model.graph.output],
                  [(opset.domain, opset.version) for opset in model.opset_import])


def test_the_exports_are_what_they_were_without_the_collections(assets, tmp_path):
    """export_model converts under frequent garbage collections (bitdrift.backends.keras.export:
    tf2onnx's
    graph copies bounded in memory). The same calls in two fresh processes, one with the
    collections and one without (the conversion as it was): the LiteRT files are equal
    byte for byte, the ONNX files node for node (their Transpose names vary per process,
    see onnx_graph_digest), and ONNX Runtime gives every output bit for bit on test
    images."""
    import hashlib

    import onnxruntime

    _, dataset, model, keras_layers = assets
    code = """
import contextlib, sys
import bitdrift.backends.keras.export as export
if sys.argv[3] == 'plain':  # the conversion as it was, nothing around Keras' export
    export._collecting_often = contextlib.nullcontext
for kind in ('onnx', 'tflite'):
    export.export_model(sys.argv[1], kind, f'{sys.argv[2]}/model.{kind}',
                        f'{sys.argv[2]}/deployed.{kind}')
"""
    for how in ("collected", "plain"):
        (tmp_path / how).mkdir()
        subprocess.run([sys.executable, "-c", code, str(model), str(tmp_path / how), how],
                       check=True, env=TF)
    collected, plain = tmp_path / "collected", tmp_path / "plain"
    for file in ("model.tflite", "deployed.tflite"):
        assert hashlib.sha256((collected / file).read_bytes()).digest() == \
            hashlib.sha256((plain / file).read_bytes()).digest()
    images = read_test_images(dataset, SAMPLES).astype(np.float32)
    for file, count in (("model.onnx", len(keras_layers)), ("deployed.onnx", 1)):
        assert onnx_graph_digest(collected / file) == onnx_graph_digest(plain / file)
        outputs = []
        for path in (collected / file, plain / file):
            session = onnxruntime.InferenceSession(str(path),
                                                   providers=["CPUExecutionProvider"])
            name = session.get_inputs()[0].name
            outputs.append([session.run(None, {name: images[row:row + 1]})
                            for row in range(len(images))])
        assert len(outputs[0][0]) == count  # every layer of the probe; the model's output
        assert all(ours.tobytes() == theirs.tobytes() and ours.shape == theirs.shape
                   for rows in zip(*outputs, strict=True)
                   for ours, theirs in zip(*rows, strict=True))


def test_a_layer_the_export_exposes_wrongly_is_unmapped_never_mislabelled(assets, tmp_path):
    """An ONNX file whose first two outputs (conv2d and activation, of one shape) are
    swapped: both are listed as unmapped and left out; the others are recorded."""
    import onnx

    folder = assets[0]
    graph = onnx.load(folder / "model.onnx")
    outputs = list(graph.graph.output)
    del graph.graph.output[:]
    graph.graph.output.extend([outputs[1], outputs[0], *outputs[2:]])
    swapped = tmp_path / "swapped.onnx"
    onnx.save(graph, swapped)
    out = run(assets, tmp_path, "ort", {**CPU, "backend": "onnxruntime"}, export=swapped)
    with Record(out) as record:
        names = [info.name for info in record.layers(0) if info.name != "output"]
        assert "conv2d" not in names and "activation" not in names
        assert names[0] == "pooling2d" and names[-1] == "dense_3"
        assert json.loads(record.attr("unmapped_layers")) == ["conv2d", "activation"]
        # conv2d_1's input (pooling2d) and itself are recorded: still checked
        assert "conv2d_1" in record.effective_precision
        assert "conv2d" not in record.effective_precision


def test_mapping_against_a_hand_built_reference():
    rng = np.random.default_rng(0)
    first, second = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 5))
    reference = Reference(layers=[("a", "Conv2D"), ("b", "Dense")], checked={},
                          check_indices=[0, 1], check_outputs=[first, second],
                          argmax_indices=[], argmax=np.array([]), model_sha256="")
    close = [first + 1e-7, second.astype(np.float32)]
    assert mapped_positions(close, reference) == ["float32", "float32"]
    assert mapped_positions([first, second + 0.1], reference) == ["float32", None]
    assert mapped_positions([first[:, :3], second], reference) == [None, "float32"]  # shape
    # a runtime computing in bfloat16: every value rounded to 8 significant bits maps, as
    # reduced; another layer's values of the same shape never do
    import ml_dtypes

    in_bf16 = [value.astype(ml_dtypes.bfloat16).astype(np.float64) for value in (first, second)]
    assert mapped_positions(in_bf16, reference) == ["reduced", "reduced"]
    assert mapped_positions([first[::-1], second], reference) == [None, "float32"]


def test_openvinos_own_default_precision_is_a_finding_not_a_failure(assets, tmp_path):
    """OpenVINO at its plugin's default (bfloat16 on a CPU with native bf16) and with the
    hint bf16: the record is written either way. Where the plugin says it computes in
    bfloat16 (its own property, in the fingerprint), the check recomputing every layer in
    numpy must name bfloat16 for every checked layer; where it says float32, none is
    reduced. The values stay within a bfloat16 runtime's error of Keras' own."""
    _, _, _, keras_layers = assets
    with open("/proc/cpuinfo") as handle:
        flags = set(next(line for line in handle if line.startswith("flags")).split())
    native_bf16 = bool(flags & {"avx512_bf16", "amx_bf16"})
    for name, extra in (("openvino_default", {}),
                        ("openvino_bf16", {"inference_precision_hint": "bf16"})):
        out = run(assets, tmp_path, name, {**CPU, "backend": "openvino", **extra})
        with Record(out) as record:
            chose = record.fingerprint["accelerator"]["inference_precision"]
            # OpenVINO's CPU plugin computes in bfloat16 by default exactly where the CPU
            # has native bf16 (AVX512_BF16 or AMX)
            assert (chose == "bfloat16") == native_bf16 or extra, (chose, native_bf16)
            effective = record.effective_precision
            assert sorted(effective) == ["conv2d", "conv2d_1", "dense_1", "dense_2",
                                         "dense_3"]
            formats = {result["format"] for result in effective.values()}
            if chose == "bfloat16":
                assert formats == {"bfloat16"}
                assert all(result["reduced"] for result in effective.values())
            else:
                assert chose == "float32" and formats == {"float32"}, (chose, formats)
            for row, sample in enumerate(SAMPLES):
                for layer, expected in keras_layers.items():
                    values = record.tensor(sample, layer).values[0].astype(np.float64)
                    scale = np.abs(expected[row]).max()
                    assert np.abs(values - expected[row]).max() <= 16 * 2.0**-8 * scale
            assert json.loads(record.attr("argmax_agreement"))["share"] >= 0.9


def test_a_runtime_that_disagrees_with_tensorflow_fails(assets, tmp_path):
    """A reference whose classes are shifted by one: the device agrees on no image, which
    is a bug to find, not a class."""
    folder = assets[0]
    with np.load(folder / "reference.npz") as data:
        arrays = {key: data[key] for key in data.files}
    arrays["argmax"] = (arrays["argmax"] + 1) % 10
    shifted = tmp_path / "shifted.npz"
    np.savez(shifted, **arrays)
    with pytest.raises(InferenceError, match=r"agrees with TensorFlow's on 0 of 40 test images"):
        run(assets, tmp_path, "ort", {**CPU, "backend": "onnxruntime"}, reference=shifted)
    assert not (tmp_path / "ort.h5").exists()


def test_the_reference_holds_tensorflows_classes(assets):
    folder, dataset, _, _ = assets
    reference = read_reference(folder / "reference.npz")
    assert reference.argmax_indices == list(range(40))
    assert len(reference.argmax) == 40 and set(reference.argmax) <= set(range(10))
    images = read_test_images(dataset, reference.check_indices)
    assert reference.check_outputs[0].shape[0] == len(images)


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_gpu_device_without_gpu_fails_loudly(assets, tmp_path, backend):
    device = {**CPU, "backend": backend, "accelerator": "gpu", "repeats": 1}
    with pytest.raises(AcceleratorMissing, match="refusing to fall back"):
        run(assets, tmp_path, "gpu", device)
    assert "refusing to fall back" in (tmp_path / "log").read_text()


def test_a_runtime_that_is_not_installed_names_the_package(assets, tmp_path):
    """The worker cannot import openvino (a module of that name that fails to import is
    first on its path): one line naming what to install."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "openvino.py").write_text("raise ImportError('No module named openvino')\n")
    device = {**CPU, "backend": "openvino", "repeats": 1, "env": {"PYTHONPATH": str(shadow)}}
    with pytest.raises(InferenceError, match="repeat 1 failed"):
        run(assets, tmp_path, "ov", device)
    log = (tmp_path / "log").read_text()
    assert "backend 'openvino' needs the Python package 'openvino' (pip install " \
           "openvino==2026.4.1" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(("runtime", "damage", "message"), [
    ("onnxruntime", "truncated", "onnxruntime cannot read it as an ONNX model, damaged or "
     "truncated"),
    ("litert", "random", "not a LiteRT FlatBuffer, but litert needs a LiteRT FlatBuffer"),
    ("litert", "other", "not a LiteRT FlatBuffer, but litert needs a LiteRT FlatBuffer"),
    ("onnxruntime", "other", "a LiteRT FlatBuffer, but onnxruntime needs an ONNX model"),
    ("openvino", "empty", "empty, but openvino needs an ONNX model")])
def test_a_damaged_or_wrong_model_file_is_one_line_naming_it_and_the_fix(
        assets, tmp_path, runtime, damage, message):
    folder = assets[0]
    right = folder / FILES[runtime]
    other = folder / ("model.tflite" if right.suffix == ".onnx" else "model.onnx")
    bad = tmp_path / f"bad{right.suffix}"
    data = {"truncated": right.read_bytes()[: right.stat().st_size // 2],
            "random": np.random.default_rng(0).bytes(5000), "other": other.read_bytes(),
            "empty": b""}[damage]
    bad.write_bytes(data)
    with pytest.raises(InferenceError) as error:
        run(assets, tmp_path, runtime, {**CPU, "backend": runtime}, export=bad)
    text = str(error.value)
    assert message in text and str(bad) in text and "\n" not in text
    assert "snakemake --forcerun export_model" in text


def test_a_truncated_reference_is_one_line(assets, tmp_path):
    folder = assets[0]
    data = (folder / "reference.npz").read_bytes()
    truncated = tmp_path / "reference.npz"
    truncated.write_bytes(data[: len(data) // 3])
    from bitdrift.errors import RecordError

    with pytest.raises(RecordError, match=r"not a bitdrift export reference, damaged or of "
                       r"another kind \(BadZipFile.*snakemake --forcerun export_reference"):
        run(assets, tmp_path, "ort", {**CPU, "backend": "onnxruntime"}, reference=truncated)


def test_without_recorded_layers_the_revealed_orders_are_named_and_read(assets, tmp_path):
    """`analysis.layers: false` with kernels on: an exported runtime still reveals its
    orders; each is named (there is no recorded layer to replay it against, and the record
    says so), and the record reads back through the checked reader, every order a phrase."""
    folder, dataset, model, _ = assets
    out = tmp_path / "no_layers.h5"
    with open(tmp_path / "log", "w") as log:
        infer(model_name="small", device_name="ort", device={**CPU, **DEVICES["onnxruntime"]},
              model_path=model, dataset_path=dataset, samples=SAMPLES, out=out, log=log,
              layers=False, reference=folder / "reference.npz",
              export=folder / FILES["onnxruntime"],
              deployed_export=folder / DEPLOYED_FILES["onnxruntime"])
    with Record(out) as record:
        orders = record.accumulation_orders
        assert orders  # the order search ran
        for layer, entry in orders.items():
            assert entry["order"], layer
            if entry["order"] != "not revealed":
                assert entry["replay"] == "not replayed: its input is not recorded", layer
