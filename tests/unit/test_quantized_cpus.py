"""A dynamically quantized attention encoder (int8 weights, ONNX Runtime's quantize_dynamic)
on this CPU and under `qemu-x86_64 -cpu Haswell-v4` (AVX2, no VNNI), read by
benchmarks/quantized_cpus.py's capture: the first MatMulInteger's int32 output is, bit
for bit, the numpy replay of the path the CPU's instruction sets give (exact int32 with
VNNI or AMX; u8 x s8 pairs into saturated int16 without), its uint8 input the same on
both; how_they_part names saturation where they part. The emulated CPU's outputs through
bitdrift's ONNX Runtime device (emulate: Haswell-v4) are the capture's, bit for bit."""

import importlib.util
import sys

import numpy as np
import pytest

from bitdrift.analysis import integer
from bitdrift.backends.exported.onnx_quantization import quantize_model
from bitdrift.config import validate_config
from bitdrift.inputs.examples import onnx_transformer
from bitdrift.record.reader import Record
from bitdrift.run.devices import cpu_info
from bitdrift.run.inference import infer
from tests.utils import ROOT

SPEC = importlib.util.spec_from_file_location("benchmark_quantized_cpus",
                                              ROOT / "benchmarks" / "quantized_cpus.py")
quantized_cpus = sys.modules[SPEC.name] = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(quantized_cpus)

EMULATED = "Haswell-v4"
SAMPLES = list(range(6))
# the instruction sets that multiply u8 by s8 into int32 exactly; without them MLAS's u8s8
# kernels (AVX2, and AVX-512BW without VNNI) go through vpmaddubsw's saturated int16
EXACT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quantized_cpus")
    onnx_transformer.write(folder / "encoder.onnx", folder / "inputs.npy", samples=6)
    model = folder / "s8.onnx"
    quantize_model(folder / "encoder.onnx", model, {"method": "dynamic",
                                                    "weight_type": "QInt8"})
    found = {cpu: quantized_cpus.capture_on(cpu, model, folder / "inputs.npy",
                                            folder / f"{cpu}.npz")
             for cpu in (None, EMULATED)}
    return folder, model, found


def test_the_first_integer_matmul_is_the_replay_of_each_cpus_path(captured):
    _, model, found = captured
    native = quantized_cpus.replays(model, found[None])
    emulated = quantized_cpus.replays(model, found[EMULATED])
    # the inputs saturate some pairs, so the two paths differ (else the test shows nothing)
    assert sum(integer.saturating_pairs(rows, layer.weights)
               for layer, rows, *_ in native) > 0
    exact_here = any(flag in cpu_info().get("flags", []) for flag in EXACT_FLAGS)
    for mine, theirs in zip(native, emulated, strict=True):
        layer, rows, exact, saturated, recorded = mine
        assert not np.array_equal(exact, saturated)
        assert np.array_equal(rows, theirs[1])  # DynamicQuantizeLinear's codes agree
        assert np.array_equal(theirs[4], theirs[3])  # Haswell: saturated, bit for bit
        assert np.array_equal(recorded, exact if exact_here else saturated)
        verdict = integer.how_they_part(theirs[4], recorded, layer, rows).verdict
        assert verdict == (integer.SATURATION if exact_here else integer.IDENTICAL)
    parted = not np.array_equal(found[None]["deployed"], found[EMULATED]["deployed"])
    assert parted == exact_here


def test_the_emulated_device_gives_the_captured_outputs(captured):
    folder, model, found = captured
    device = {"accelerator": "cpu", "backend": "onnxruntime", "threads": 1, "batch_size": 1,
              "emulate": EMULATED}
    config = validate_config({"models": {"q": {"file": str(model),
                                               "inputs": str(folder / "inputs.npy")}},
                              "devices": {"haswell": device}, "samples": SAMPLES})
    out = folder / "haswell.h5"
    with open(folder / "haswell.log", "w") as log:
        infer(model_name="q", device_name="haswell", device=config["devices"]["haswell"],
              model_path=model, dataset_path=folder / "inputs.npy", samples=SAMPLES,
              out=out, layers=False, kernels=False, log=log)
    with Record(out) as record:
        outputs = np.stack([record.deployed_output(sample).values[0] for sample in SAMPLES])
    assert np.array_equal(outputs.view(np.uint32),
                          found[EMULATED]["deployed"].astype(np.float32).view(np.uint32))
