"""Quantized models as a step of the workflow (config key models.NAME.quantize), one small
run for the three quantizers' tools (each float model kept to its runtime's devices by
models.NAME.devices, so no runtime converts another's model):

- ONNX Runtime's (static QDQ): rule quantize_model writes the very bytes
  onnx_quantization.quantize_model writes called directly, the quantized model runs on the
  ONNX Runtime device with its settings in the record's fingerprint, and the table
  quantization_error gives the SQNR that numpy gives from the two records;
- LiteRT's converter (tool litert): the example Keras CNN on the embedded digits images,
  quantized full-integer into the very bytes litert_quantization.quantize_model writes,
  runs on XNNPACK and on the built-in kernels with its settings in the records'
  fingerprint; the same model quantized with int8 edges (a file whose input is int8, which
  the devices' float images do not fit) fails those two devices alone, each with a
  one-line reason naming the file and the dtypes;
- PyTorch's PT2E (tool torch): a program with the constants pt2e_quantization's
  quantize_model writes, run on torch eager with its settings in the record's
  fingerprint; ExecuTorch (which cannot run it) fails alone in one line naming why, and
  the table quantization_error gives the scales the quantized program holds."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from bitdrift import paths
from bitdrift.analysis.quantization_error import tensor_scales
from bitdrift.backends.exported import litert_quantization, onnx_quantization
from bitdrift.backends.torch_program import pt2e_quantization
from bitdrift.formats.pt2 import load_program
from bitdrift.inputs.examples import keras_cnn, onnx_cnn, torch_cnn
from bitdrift.record.reader import Record
from tests.utils import snakemake

pytestmark = pytest.mark.workflow
SAMPLES = [0, 1]  # two: the SQNR, the largest error and the labels sum over samples
ONNX_SETTINGS = {"method": "static", "per_channel": False}
TORCH_SETTINGS = {"tool": "torch", "reduce_range": True}
LITERT_DEVICES = ["litert_xnnpack", "litert_builtin"]
EDGES = {"inference_input_type": "int8", "inference_output_type": "int8"}
CPU = {"accelerator": "cpu", "threads": 1, "repeats": 1}
DEVICES = {
    # no graph optimisations: the QDQ pairs stay, and every layer is recorded
    "ort": {**CPU, "backend": "onnxruntime", "graph_optimization_level": "disable_all"},
    "litert_xnnpack": {**CPU, "backend": "litert"},
    "litert_builtin": {**CPU, "backend": "litert", "op_resolver": "builtin"},
    "eager": {**CPU, "backend": "torch_export"},
    "et": {**CPU, "backend": "executorch"},
}


@pytest.fixture(scope="module")
def quantized_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("quantized_models")
    onnx_cnn.write(workdir / "cnn.onnx", workdir / "cnn.npy", samples=8)
    keras_cnn.write(workdir / "keras_cnn.keras", workdir / "keras_cnn.npy", samples=4)
    torch_cnn.write(workdir / "torch_cnn.pt2", workdir / "torch_cnn.npy", samples=8)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump({
        "samples": SAMPLES, "analysis": {"precision": "float32"}, "devices": DEVICES,
        "datasets": {"digits": {"source": "digits"}},
        "models": {
            "cnn": {"file": "cnn.onnx", "inputs": "cnn.npy", "devices": ["ort"]},
            "cnn_qdq": {"quantize": {"model": "cnn", **ONNX_SETTINGS}},
            # the float Keras model on one device: its quantized models on both
            "keras_cnn": {"file": "keras_cnn.keras", "dataset": "digits",
                          "devices": LITERT_DEVICES[:1]},
            "cnn_int8": {"quantize": {"model": "keras_cnn", "tool": "litert"},
                         "devices": LITERT_DEVICES},
            "cnn_edges": {"quantize": {"model": "keras_cnn", "tool": "litert", **EDGES},
                          "devices": LITERT_DEVICES},
            "torch_cnn": {"file": "torch_cnn.pt2", "inputs": "torch_cnn.npy",
                          "devices": ["eager", "et"]},
            "cnn_q": {"quantize": {"model": "torch_cnn", **TORCH_SETTINGS}}}}))
    result = snakemake(workdir, paths.table_file(paths.QUANTIZATION_ERROR_TABLE),
                       paths.table_file("device_failures"), "--keep-going",
                       configfile=config, check=False)
    said = result.stdout + result.stderr
    table = pd.read_csv(workdir / paths.table_file(paths.QUANTIZATION_ERROR_TABLE))
    return workdir, result.returncode, said, table


def test_the_table_holds_each_quantized_model_on_the_devices_that_ran_it(quantized_run):
    workdir, _, said, table = quantized_run
    # no float model; the int8-edged model failed on every device, so it has no row
    assert set(table["model"]) == {"cnn_qdq", "cnn_int8", "cnn_q"}, said[-3000:]
    devices = {model: set(rows["device"]) for model, rows in table.groupby("model")}
    assert devices == {"cnn_qdq": {"ort"}, "cnn_int8": {"litert_xnnpack"}, "cnn_q": {"eager"}}


def test_the_devices_that_cannot_run_a_file_fail_alone_in_one_line(quantized_run):
    workdir, returncode, said, _ = quantized_run
    assert returncode != 0 and "3 device(s) failed" in said, said[-3000:]
    failures = pd.read_csv(workdir / paths.table_file("device_failures"))
    assert sorted(failures[["model", "device"]].values.tolist()) == [
        ["cnn_edges", "litert_builtin"], ["cnn_edges", "litert_xnnpack"], ["cnn_q", "et"]]
    for row in failures.itertuples():
        assert "\n" not in row.reason
        if row.model == "cnn_edges":  # its int8 input, the devices' float images
            assert "cnn_edges.tflite" in row.reason
            assert "float32" in row.reason and "int8" in row.reason
        else:  # ExecuTorch has no kernels for the quantize/dequantize ops
            assert "quantized_decomposed" in row.reason
    for model, device in (("torch_cnn", "eager"), ("torch_cnn", "et"), ("cnn_q", "eager")):
        with Record(workdir / paths.record_file(model, device)) as record:
            assert record.tensor(SAMPLES[0], "output").values[0].shape == (10,)


# -- ONNX Runtime's quantizer ------------------------------------------------------------
def test_onnx_the_rule_writes_what_quantize_model_writes(quantized_run, tmp_path):
    workdir = quantized_run[0]
    direct = tmp_path / "direct.onnx"
    onnx_quantization.quantize_model(workdir / "cnn.onnx", direct, ONNX_SETTINGS,
                                     workdir / "cnn.npy")
    made = workdir / paths.quantized_model_file("cnn_qdq", "onnx")
    assert made.read_bytes() == direct.read_bytes()
    with Record(workdir / paths.record_file("cnn_qdq", "ort")) as record:
        said = record.fingerprint["quantization"]
    assert said["model"] == "cnn" and said["model_file"] == "cnn.onnx"
    assert said["method"] == "static" and said["format"] == "QDQ"  # ORT's default format


def test_onnx_the_table_gives_the_sqnr_numpy_gives_from_the_records(quantized_run):
    workdir, _, _, table = quantized_run
    table = table[table["model"] == "cnn_qdq"]
    assert "output" in set(table["layer"])
    # a QDQ tensor as the quantized model passes it on, after its QuantizeLinear and
    # DequantizeLinear, where the record holds it (ONNX Runtime's names)
    for row in table.itertuples():
        assert row.quantized_layer in (row.layer, f"{row.layer}_DequantizeLinear_Output")
    assert "conv_relu_DequantizeLinear_Output" in set(table["quantized_layer"])
    with Record(workdir / paths.record_file("cnn", "ort")) as float_record, \
            Record(workdir / paths.record_file("cnn_qdq", "ort")) as quantized:
        for row in table.itertuples():
            before = np.stack([float_record.tensor(s, row.layer).values[0]
                               for s in SAMPLES]).astype(np.float64)
            after = np.stack([quantized.tensor(s, row.quantized_layer).values[0]
                              for s in SAMPLES]).astype(np.float64)
            noise = np.sum((before - after) ** 2)
            assert row.sqnr_db == pytest.approx(
                10 * math.log10(np.sum(before ** 2) / noise), rel=1e-12)
            assert row.largest_error == np.abs(before - after).max()
            if row.layer == "output":
                assert row.changed_labels == np.count_nonzero(
                    before.argmax(-1) != after.argmax(-1))
                assert row.scale > 0  # static QDQ fixes the output's scale


# -- LiteRT's converter ------------------------------------------------------------------
def test_litert_the_rule_writes_what_quantize_model_writes_and_the_devices_run_it(
        quantized_run, tmp_path):
    workdir, _, said, _ = quantized_run
    direct = tmp_path / "direct.tflite"
    litert_quantization.quantize_model(workdir / "keras_cnn.keras", direct, {},
                                       workdir / "results/datasets/digits.h5")
    made = workdir / paths.quantized_model_file("cnn_int8", "tflite")
    assert made.read_bytes() == direct.read_bytes(), said[-3000:]
    assert litert_quantization.tensor_types(made)["CONV_2D"] == ["int32", "int8"]
    outputs = {}
    for device in LITERT_DEVICES:
        with Record(workdir / paths.record_file("cnn_int8", device)) as record:
            said_quantization = record.fingerprint["quantization"]
            assert said_quantization["tool"] == "litert"
            assert said_quantization["mode"] == "full_integer"
            assert said_quantization["model"] == "keras_cnn"
            outputs[device] = np.stack([record.deployed_output(sample).values[0]
                                        for sample in SAMPLES])
    assert all(np.isfinite(found).all() and found.shape == (len(SAMPLES), 10)
               for found in outputs.values())


# -- PyTorch's PT2E ----------------------------------------------------------------------
def test_torch_the_rule_writes_what_quantize_model_writes(quantized_run, tmp_path):
    workdir = quantized_run[0]
    direct = tmp_path / "direct.pt2"
    pt2e_quantization.quantize_model(workdir / "torch_cnn.pt2", direct,
                                     {"reduce_range": True}, workdir / "torch_cnn.npy")
    made = load_program(workdir / paths.quantized_model_file("cnn_q", "pt2"))
    expected = load_program(direct)
    assert made.state_dict.keys() == expected.state_dict.keys()
    for key in [*made.state_dict, *made.constants]:
        held = {**made.state_dict, **made.constants}[key]
        wanted = {**expected.state_dict, **expected.constants}[key]
        assert held.dtype == wanted.dtype and torch.equal(held, wanted), key
    with Record(workdir / paths.record_file("cnn_q", "eager")) as record:
        said = record.fingerprint["quantization"]
    assert said["model"] == "torch_cnn" and said["tool"] == "torch"
    assert said["method"] == "static" and said["reduce_range"] is True


def test_torch_the_table_gives_the_programs_scales(quantized_run):
    workdir, _, _, table = quantized_run
    table = table[table["model"] == "cnn_q"]
    scales = tensor_scales(workdir / paths.quantized_model_file("cnn_q", "pt2"))
    scaled = table.dropna(subset=["scale"])
    assert not scaled.empty and set(scaled["layer"]) == set(scales)
    for row in scaled.itertuples():
        assert row.scale == scales[row.layer]
    output = table[table["layer"] == "output"].iloc[0]
    with Record(workdir / paths.record_file("torch_cnn", "eager")) as before, \
            Record(workdir / paths.record_file("cnn_q", "eager")) as after:
        difference = max(np.abs(before.tensor(s, "output").values[0].astype(np.float64)
                                - after.tensor(s, "output").values[0]).max()
                         for s in SAMPLES)
    assert output["largest_error"] == difference > 0
