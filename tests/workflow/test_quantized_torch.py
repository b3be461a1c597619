"""A torch.export program quantized by PyTorch's PT2E flow as a step of the workflow
(models.NAME.quantize.tool torch): rule quantize_model writes a program with the
constants quantize_model writes called directly, the quantized model runs on torch eager
with its settings in the record's fingerprint, ExecuTorch (which cannot run it) fails alone
in one line naming the model, the device and why, and the table quantization_error gives
the scales the quantized program holds."""

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from bitdrift import paths
from bitdrift.analysis.quantization_error import tensor_scales
from bitdrift.backends.torch_program.pt2e_quantization import quantize_model
from bitdrift.formats.pt2 import load_program
from bitdrift.inputs.examples import torch_cnn
from bitdrift.record.reader import Record
from tests.utils import snakemake

pytestmark = pytest.mark.workflow
SAMPLES = [0, 1, 2]
SETTINGS = {"tool": "torch", "reduce_range": True}


@pytest.fixture(scope="module")
def quantized_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("quantized_torch")
    torch_cnn.write(workdir / "cnn.pt2", workdir / "cnn.npy", samples=8)
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump({
        "samples": SAMPLES, "analysis": {"precision": "float32"},
        "devices": {"eager": {"accelerator": "cpu", "backend": "torch_export", "threads": 1,
                              "repeats": 1},
                    "et": {"accelerator": "cpu", "backend": "executorch", "threads": 1,
                           "repeats": 1}},
        "models": {"cnn": {"file": "cnn.pt2", "inputs": "cnn.npy"},
                   "cnn_q": {"quantize": {"model": "cnn", **SETTINGS}}}}))
    result = snakemake(workdir, paths.table_file(paths.QUANTIZATION_ERROR_TABLE),
                       paths.table_file("device_failures"), "--keep-going",
                       configfile=config, check=False)
    return workdir, result.returncode, result.stdout + result.stderr


def test_the_rule_writes_what_quantize_model_writes(quantized_run, tmp_path):
    workdir, _, _ = quantized_run
    direct = tmp_path / "direct.pt2"
    quantize_model(workdir / "cnn.pt2", direct, {"reduce_range": True}, workdir / "cnn.npy")
    made = load_program(workdir / paths.quantized_model_file("cnn_q", "pt2"))
    expected = load_program(direct)
    assert made.state_dict.keys() == expected.state_dict.keys()
    for key in [*made.state_dict, *made.constants]:
        held = {**made.state_dict, **made.constants}[key]
        wanted = {**expected.state_dict, **expected.constants}[key]
        assert held.dtype == wanted.dtype and torch.equal(held, wanted), key
    with Record(workdir / paths.record_file("cnn_q", "eager")) as record:
        said = record.fingerprint["quantization"]
    assert said["model"] == "cnn" and said["tool"] == "torch"
    assert said["method"] == "static" and said["reduce_range"] is True


def test_executorch_fails_alone_in_one_line(quantized_run):
    workdir, returncode, said = quantized_run
    assert returncode != 0 and "1 device(s) failed" in said
    failures = pd.read_csv(workdir / paths.table_file("device_failures"))
    assert failures[["model", "device"]].values.tolist() == [["cnn_q", "et"]]
    reason = failures["reason"].iloc[0]
    assert "\n" not in reason and "quantized_decomposed" in reason
    for model, device in (("cnn", "eager"), ("cnn", "et"), ("cnn_q", "eager")):
        with Record(workdir / paths.record_file(model, device)) as record:
            assert record.tensor(SAMPLES[0], "output").values[0].shape == (10,)


def test_the_table_gives_the_programs_scales(quantized_run):
    workdir, _, _ = quantized_run
    table = pd.read_csv(workdir / paths.table_file(paths.QUANTIZATION_ERROR_TABLE))
    assert set(table["model"]) == {"cnn_q"} and set(table["device"]) == {"eager"}
    scales = tensor_scales(workdir / paths.quantized_model_file("cnn_q", "pt2"))
    scaled = table.dropna(subset=["scale"])
    assert not scaled.empty and set(scaled["layer"]) == set(scales)
    for row in scaled.itertuples():
        assert row.scale == scales[row.layer]
    output = table[table["layer"] == "output"].iloc[0]
    with Record(workdir / paths.record_file("cnn", "eager")) as before, \
            Record(workdir / paths.record_file("cnn_q", "eager")) as after:
        difference = max(np.abs(before.tensor(s, "output").values[0].astype(np.float64)
                                - after.tensor(s, "output").values[0]).max()
                         for s in SAMPLES)
    assert output["largest_error"] == difference > 0
