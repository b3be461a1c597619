"""A quantized model as a step of the workflow (config key models.NAME.quantize): rule
quantize_model writes the very bytes onnx_quantization.quantize_model writes called
directly, the quantized model runs on the ONNX Runtime device with its settings in the
record's fingerprint, and the table quantization_error gives the SQNR that numpy gives
from the two records."""

import math

import numpy as np
import pandas as pd
import pytest
import yaml

from bitdrift import paths
from bitdrift.backends.exported.onnx_quantization import quantize_model
from bitdrift.inputs.examples import onnx_cnn
from bitdrift.record.reader import Record
from tests.utils import snakemake

pytestmark = pytest.mark.workflow
SAMPLES = [0, 1, 2]
SETTINGS = {"method": "static", "per_channel": False}
DEVICE = "ort"


@pytest.fixture(scope="module")
def quantized_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("quantized_workflow")
    onnx_cnn.write(workdir / "cnn.onnx", workdir / "cnn.npy", samples=8)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump({
        "samples": SAMPLES, "analysis": {"precision": "float32"},
        # no graph optimisations: the QDQ pairs stay, and every layer is recorded
        "devices": {DEVICE: {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1,
                             "repeats": 1, "graph_optimization_level": "disable_all"}},
        "models": {"cnn": {"file": "cnn.onnx", "inputs": "cnn.npy"},
                   "cnn_qdq": {"quantize": {"model": "cnn", **SETTINGS}}}}))
    snakemake(workdir, paths.table_file(paths.QUANTIZATION_ERROR_TABLE), configfile=config)
    return workdir


def test_the_rule_writes_what_quantize_model_writes(quantized_run, tmp_path):
    direct = tmp_path / "direct.onnx"
    quantize_model(quantized_run / "cnn.onnx", direct, SETTINGS, quantized_run / "cnn.npy")
    made = quantized_run / paths.quantized_model_file("cnn_qdq", "onnx")
    assert made.read_bytes() == direct.read_bytes()
    with Record(quantized_run / paths.record_file("cnn_qdq", DEVICE)) as record:
        said = record.fingerprint["quantization"]
    assert said["model"] == "cnn" and said["model_file"] == "cnn.onnx"
    assert said["method"] == "static" and said["format"] == "QDQ"  # ORT's default format


def test_the_table_gives_the_sqnr_numpy_gives_from_the_records(quantized_run):
    table = pd.read_csv(quantized_run / paths.table_file(paths.QUANTIZATION_ERROR_TABLE))
    assert set(table["model"]) == {"cnn_qdq"} and set(table["device"]) == {DEVICE}
    assert "output" in set(table["layer"])
    # a QDQ tensor as the quantized model passes it on, after its QuantizeLinear and
    # DequantizeLinear, where the record holds it (ONNX Runtime's names)
    for row in table.itertuples():
        assert row.quantized_layer in (row.layer, f"{row.layer}_DequantizeLinear_Output")
    assert "conv_relu_DequantizeLinear_Output" in set(table["quantized_layer"])
    with Record(quantized_run / paths.record_file("cnn", DEVICE)) as float_record, \
            Record(quantized_run / paths.record_file("cnn_qdq", DEVICE)) as quantized:
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
