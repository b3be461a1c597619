"""A model quantized by LiteRT's converter as a step of the workflow (models.NAME.quantize,
tool litert): the example Keras CNN on the embedded digits images, quantized full-integer
by the rule quantize_model into the very bytes litert_quantization.quantize_model writes
called directly, runs on XNNPACK and on the built-in kernels with its settings in the
records' fingerprint; the same model quantized with int8 edges (a file whose input is
int8, which the devices' float images do not fit) fails those two devices alone, each
with a one-line reason naming the file and the dtypes."""

import numpy as np
import pandas as pd
import pytest
import yaml

from bitdrift import paths
from bitdrift.backends.exported.litert_quantization import quantize_model, tensor_types
from bitdrift.inputs.examples import keras_cnn
from bitdrift.record.reader import Record
from tests.utils import snakemake

pytestmark = pytest.mark.workflow
SAMPLES = [0, 1, 2]
DEVICES = {
    "litert_xnnpack": {"accelerator": "cpu", "backend": "litert", "threads": 1, "repeats": 1},
    "litert_builtin": {"accelerator": "cpu", "backend": "litert", "threads": 1, "repeats": 1,
                       "op_resolver": "builtin"},
}
EDGES = {"inference_input_type": "int8", "inference_output_type": "int8"}


@pytest.fixture(scope="module")
def litert_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("quantized_litert_workflow")
    keras_cnn.write(workdir / "cnn.keras", workdir / "cnn.npy", samples=4)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump({
        "samples": SAMPLES, "analysis": {"precision": "float32"}, "devices": DEVICES,
        "datasets": {"digits": {"source": "digits"}},
        "models": {"cnn": {"file": "cnn.keras", "dataset": "digits"},
                   "cnn_int8": {"quantize": {"model": "cnn", "tool": "litert"}},
                   "cnn_edges": {"quantize": {"model": "cnn", "tool": "litert", **EDGES}}}}))
    targets = [paths.record_file(model, device) for model in ("cnn_int8", "cnn_edges")
               for device in DEVICES]
    result = snakemake(workdir, *targets, paths.table_file("device_failures"),
                       configfile=config, check=False)
    return workdir, result.returncode, result.stdout + result.stderr


def test_the_rule_writes_what_quantize_model_writes_and_the_devices_run_it(litert_run,
                                                                          tmp_path):
    workdir, _, said = litert_run
    direct = tmp_path / "direct.tflite"
    quantize_model(workdir / "cnn.keras", direct, {}, workdir / "results/datasets/digits.h5")
    made = workdir / paths.quantized_model_file("cnn_int8", "tflite")
    assert made.read_bytes() == direct.read_bytes(), said[-3000:]
    assert tensor_types(made)["CONV_2D"] == ["int32", "int8"]
    outputs = {}
    for device in DEVICES:
        with Record(workdir / paths.record_file("cnn_int8", device)) as record:
            said_quantization = record.fingerprint["quantization"]
            assert said_quantization["tool"] == "litert"
            assert said_quantization["mode"] == "full_integer"
            assert said_quantization["model"] == "cnn"
            outputs[device] = np.stack([record.deployed_output(sample).values[0]
                                        for sample in SAMPLES])
    assert all(np.isfinite(found).all() and found.shape == (3, 10)
               for found in outputs.values())


def test_the_int8_edged_file_fails_its_devices_alone(litert_run):
    workdir, returncode, said = litert_run
    assert returncode != 0 and "2 device(s) failed" in said, said[-3000:]
    failures = pd.read_csv(workdir / paths.table_file("device_failures"))
    assert sorted(failures[["model", "device"]].values.tolist()) == [
        ["cnn_edges", "litert_builtin"], ["cnn_edges", "litert_xnnpack"]]
    for reason in failures["reason"]:
        assert "\n" not in reason and "cnn_edges.tflite" in reason
        assert "float32" in reason and "int8" in reason
