"""A user's own LiteRT .tflite with its own .npy inputs, run as it is by the litert
runtime (bitdrift.formats.tflite): every float tensor a node outputs recorded under the
file's tensor names, checked against numpy from the Keras model's weights; a tensor
XNNPACK keeps inside a delegate is absent, never guessed. The .tflite is converted here
from a Keras model by TensorFlow's LiteRT converter, in a process of its own
(tests.utils.KERAS_TO_TFLITE, once per session: the tflite_model_copy fixture)."""

import numpy as np
import pytest

from bitdrift import formats
from bitdrift.config import validate_config
from bitdrift.errors import ModelFormatError
from bitdrift.record.reader import Record

DEVICES = {
    "litert_xnnpack": {"accelerator": "cpu", "backend": "litert", "threads": 1,
                       "repeats": 2, "batch_size": 4},
    "litert_builtin": {"accelerator": "cpu", "backend": "litert", "threads": 1,
                       "op_resolver": "builtin", "repeats": 2},
    "litert_reference": {"accelerator": "cpu", "backend": "litert", "threads": 2,
                         "op_resolver": "reference", "repeats": 2},
}
SAMPLES = [0, 1, 5]


@pytest.fixture(scope="module")
def tflite_records(tflite_model_copy, tmp_path_factory):
    from bitdrift.run.inference import infer

    folder = tmp_path_factory.mktemp("tflite")
    tflite_model_copy(folder)
    np.save(folder / "inputs.npy",
            np.random.default_rng(1).standard_normal((8, 6)).astype(np.float32))
    config = validate_config({"models": {"mine": {"file": str(folder / "model.tflite"),
                                                  "inputs": str(folder / "inputs.npy")}},
                              "devices": DEVICES, "samples": SAMPLES})
    records = {}
    for device in DEVICES:
        records[device] = folder / f"{device}.h5"
        infer(model_name="mine", device_name=device, device=config["devices"][device],
              model_path=folder / "model.tflite", dataset_path=folder / "inputs.npy",
              samples=SAMPLES, out=records[device], layers=True,
              kernels=device != "litert_reference")
    return folder, records


def numpy_forward(folder, inputs: np.ndarray) -> list[np.ndarray]:
    """The Keras model in float64 numpy from its weights: fc1 (relu), fc2, softmax."""
    with np.load(folder / "weights.npz") as data:
        kernel1, bias1, kernel2, bias2 = (data[f"arr_{i}"].astype(np.float64)
                                          for i in range(4))
    fc1 = np.maximum(inputs.astype(np.float64) @ kernel1 + bias1, 0)
    fc2 = fc1 @ kernel2 + bias2
    exp = np.exp(fc2 - fc2.max(axis=1, keepdims=True))
    return [fc1, fc2, exp / exp.sum(axis=1, keepdims=True)]


def test_every_tensor_is_recorded_by_its_name_and_computes_the_model(tflite_records):
    folder, records = tflite_records
    inputs = np.load(folder / "inputs.npy")[SAMPLES]
    truth = numpy_forward(folder, inputs)
    for device, path in records.items():
        with Record(path) as record:
            layers = [info for info in record.layers(0) if not info.final]
            assert [info.class_name for info in layers] == [
                "FULLY_CONNECTED", "FULLY_CONNECTED", "SOFTMAX"], device
            # the converter's tensor names: fc1 with its fused relu, then fc2
            assert "fc1" in layers[0].name and "Relu" in layers[0].name, layers[0].name
            assert "fc2" in layers[1].name and "fc1" not in layers[1].name, layers[1].name
            for row, sample in enumerate(SAMPLES):
                for info, values in zip(layers, truth, strict=True):
                    recorded = record.tensor(sample, info.name).values
                    assert recorded.shape == (2, *values.shape[1:])  # the repeats
                    np.testing.assert_allclose(recorded[0], values[row], rtol=2e-6,
                                               atol=1e-7, err_msg=f"{device} {info.name}")
                assert np.array_equal(record.tensor(sample, "output").values[0],
                                      record.tensor(sample, layers[-1].name).values[0])
            assert record.observer_check["equal"], device
            assert record.observer_check["program"] == "model.tflite on litert, as given"
            assert not record.has_attr("unmapped_layers")  # no tensor left out
            fingerprint = record.fingerprint
            assert fingerprint["accelerator"]["model_format"] == "tflite"
            assert fingerprint["versions"]["litert"]


def test_the_traced_repeat_names_each_nodes_kernel(tflite_records):
    """XNNPACK takes every node of the file; the built-in resolver runs LiteRT's own
    optimised kernels (the resolver each device names)."""
    _, records = tflite_records
    for device, prefix in (("litert_xnnpack", "xnnpack "), ("litert_builtin", "tflite ")):
        with Record(records[device]) as record:
            kernels = record.kernels
            assert kernels["traced"] and kernels["outputs_match"], device
            signatures = {layer: found["signature"]
                          for layer, found in kernels["layers"].items()}
            assert len(signatures) == 3, signatures  # fc1, fc2, the softmax
            for layer, signature in signatures.items():
                assert signature.startswith(prefix), (device, layer, signature)
            if device == "litert_builtin":
                assert all(signature.endswith("(optimized)")
                           for signature in signatures.values())
            # the summing nodes' orders are not probed yet, said under the record's names
            names = [info.name for info in record.layers(0) if not info.final]
            orders = record.accumulation_orders
            assert sorted(orders) == sorted(names[:2]), orders
            assert all(found["order"] == "not revealed" and found["replay"].endswith(
                "FULLY_CONNECTED node, whose order is not probed yet")
                for found in orders.values()), orders


def test_a_tensor_xnnpack_keeps_inside_its_delegate_is_absent(tflite_records):
    """The file as deployed (no tensor kept): XNNPACK takes fc1, fc2 and the softmax into
    one delegate node, which writes the final output only; fc1's and fc2's tensors are
    then absent. Keeping every tensor, the record's run, gives every one a value."""
    from ai_edge_litert import interpreter

    from bitdrift.backends.exported import litert

    folder, _ = tflite_records
    path = folder / "model.tflite"
    tensors = formats.get("tflite").file_tensors(path)
    batch = np.load(folder / "inputs.npy")[:4]
    deployed = interpreter.Interpreter(model_path=str(path), num_threads=1)
    runner = deployed.get_signature_runner()
    runner(**{next(iter(runner.get_input_details())): batch})
    details = deployed._get_ops_details()
    delegates = [op for op in details if op["op_name"] == "DELEGATE"]
    assert len(delegates) == 1
    hidden = litert._hidden(details)
    assert hidden == {index for index, _, op in tensors if op != "SOFTMAX"}
    run, _ = litert.compile(path, DEVICES["litert_xnnpack"], {},
                            tensors=[index for index, _, _ in tensors])
    values = run(batch)
    assert all(value is not None for value in values)
    np.testing.assert_allclose(values[0], numpy_forward(folder, batch)[0], rtol=2e-6,
                               atol=1e-7)


def test_inputs_that_do_not_fit_the_signature_are_one_line(tflite_records, tmp_path):
    folder, _ = tflite_records
    np.save(tmp_path / "wide.npy", np.zeros((4, 7), np.float32))
    with pytest.raises(ModelFormatError) as error:
        formats.check_inputs(tmp_path / "wide.npy", folder / "model.tflite")
    assert str(error.value) == (f"{tmp_path / 'wide.npy'}: inputs of shape (samples, 7) "
                                f"float32, but model {folder / 'model.tflite'} takes input "
                                "'serving_default_x:0' (?, 6) float32")
    damaged = tmp_path / "damaged.tflite"
    damaged.write_bytes((folder / "model.tflite").read_bytes()[:200])
    with pytest.raises(ModelFormatError) as error:
        formats.detect(damaged)
    assert str(error.value).startswith(f"{damaged}: a damaged LiteRT .tflite file (")
    assert "\n" not in str(error.value)
