"""A quantized model as a step of the workflow (config key models.NAME.quantize): its
settings completed with ONNX Runtime's defaults and checked when the config is read,
each error naming the key; its file and inputs (bitdrift.paths) and its runs (bitdrift.plan)
as any ONNX model's; a model quantized already is a `file` like any other."""

import copy

import pytest

from bitdrift import paths
from bitdrift.backends.exported.onnx_quantization import quantize_model
from bitdrift.config import validate_config
from bitdrift.errors import ConfigError
from bitdrift.inputs.examples import onnx_cnn
from bitdrift.plan import Plan

DEVICES = {"ort": {"accelerator": "cpu", "backend": "onnxruntime"},
           "tf": {"accelerator": "cpu", "backend": "tensorflow"}}
CONFIG = {"samples": [0, 1], "devices": DEVICES,
          "models": {"net": {"file": "net.onnx", "inputs": "net.npy"},
                     "net_int8": {"quantize": {"model": "net", "weight_type": "QUInt8"}}}}


def validated(change=None):
    config = copy.deepcopy(CONFIG)
    if change:
        change(config["models"])
    return validate_config(config)


def test_the_settings_are_completed_and_the_model_runs_where_onnx_runs():
    config = validated()
    # ONNX Runtime's defaults, written out here: dynamic, no per-channel, 8-bit range
    assert config["models"]["net_int8"]["quantize"] == {
        "model": "net", "tool": "onnxruntime", "method": "dynamic", "weight_type": "QUInt8",
        "per_channel": False, "reduce_range": False}
    assert paths.model_file(config, "net_int8") == "results/quantized/net_int8.onnx"
    assert paths.model_inputs_file(config, "net_int8") == "net.npy"
    plan = Plan(config)
    assert plan.model_devices("net_int8") == ["ort"]
    assert plan.quantization("net_int8") == {**config["models"]["net_int8"]["quantize"],
                                             "model_file": "net.onnx"}
    assert plan.quantization("net") is None
    assert "results/quantized/net_int8.onnx" in plan.rule_made_files()
    # the distance to the float model: a target, on the devices that run both
    assert plan.quantization_error_pairs() == [
        ("net", "results/inference/net/ort.h5", "results/inference/net_int8/ort.h5",
         "results/quantized/net_int8.onnx")]
    assert plan.core_targets()[-3:] == ["results/tables/quantization_error.csv",
                                        "results/figures/quantization_error.pdf",
                                        "results/tables/quantized_parting.csv"]
    # the findings quote the table where the config quantizes a model, and only there
    assert plan.findings_quantization_tables() == {
        "quantization_error": "results/tables/quantization_error.csv",
        "quantized_parting": "results/tables/quantized_parting.csv"}
    unquantized = copy.deepcopy(config)
    del unquantized["models"]["net_int8"]
    assert Plan(unquantized).findings_quantization_tables() == {}
    assert not any("quantization_error" in target
                   for target in Plan(unquantized).core_targets())
    assert plan.quantized_parting_models() == [
        ("net_int8", "results/quantized/net_int8.onnx", ["results/inference/net_int8/ort.h5"])]


@pytest.mark.parametrize("change,key", [
    (lambda m: m["net_int8"]["quantize"].update(fromat="QDQ"),
     "models.net_int8.quantize.fromat"),
    (lambda m: m["net_int8"]["quantize"].update(format="QOperator"),  # static alone
     "models.net_int8.quantize.format"),
    (lambda m: m["net_int8"]["quantize"].update(per_channel="yes"),
     "models.net_int8.quantize.per_channel"),
    (lambda m: m["net_int8"]["quantize"].update(method="dynamical"),
     "models.net_int8.quantize.method"),
    (lambda m: m["net_int8"]["quantize"].update(model="nett"),
     "models.net_int8.quantize.model"),
    (lambda m: m.update(net={"file": "net.pt2", "inputs": "net.npy"}),
     "models.net_int8.quantize.model"),
    (lambda m: m["net_int8"].update(inputs="other.npy"), "models.net_int8.inputs"),
    (lambda m: m["net_int8"].update(file="net.onnx"), "models.net_int8"),
])
def test_a_wrong_quantization_is_one_line_naming_the_key(change, key):
    with pytest.raises(ConfigError) as raised:
        validated(change)
    message = str(raised.value)
    assert message.startswith(f"config key {key}:") and "\n" not in message, message


def test_a_model_quantized_already_is_a_file_that_onnx_runtime_runs(tmp_path):
    onnx_cnn.write(tmp_path / "cnn.onnx", tmp_path / "cnn.npy", samples=4)
    quantized = tmp_path / "mine_int8.onnx"
    quantize_model(tmp_path / "cnn.onnx", quantized, {"method": "dynamic"})
    config = validate_config({"samples": [0, 1], "devices": copy.deepcopy(DEVICES),
                              "models": {"mine": {"file": str(quantized),
                                                  "inputs": str(tmp_path / "cnn.npy")}}})
    plan = Plan(config)
    assert plan.model_format("mine") == "onnx" and plan.model_devices("mine") == ["ort"]
    assert plan.quantization("mine") is None  # used as it is, quantized by its user


def test_a_quantized_model_runs_on_its_quantizers_runtimes_alone_and_the_plan_says_so():
    """The float ONNX model runs wherever ONNX runs (here also converted for torch and
    LiteRT); the model ONNX Runtime quantized runs on ONNX Runtime and OpenVINO alone
    (converting it has no quantized ops), and the plan names the devices left out and why."""
    devices = {**DEVICES, "ov": {"accelerator": "cpu", "backend": "openvino"},
               "eager": {"accelerator": "cpu", "backend": "torch_export"},
               "lite": {"accelerator": "cpu", "backend": "litert"}}
    plan = Plan(validate_config({**copy.deepcopy(CONFIG), "devices": devices}))
    assert {"eager", "lite", "ort", "ov"} <= set(plan.model_devices("net"))
    assert plan.model_devices("net_int8") == ["ort", "ov"]
    note = plan.device_plan()["net_int8"]
    assert note["format"].endswith("quantized by the onnxruntime quantizer")
    assert sorted(d for group in note["skipped"].values() for d in group) == \
        ["eager", "lite", "tf"]


def test_a_models_devices_list_keeps_it_to_those_devices_and_its_quantized_model_too():
    """models.NAME.devices: the float model runs on the devices it names alone; the model
    quantized from it, without a list of its own, on those of them its quantizer's
    runtimes run; a device the list leaves out is no 'skipped' note (the user chose it);
    a name that is no device is refused, naming the key."""
    devices = {**DEVICES, "ov": {"accelerator": "cpu", "backend": "openvino"},
               "eager": {"accelerator": "cpu", "backend": "torch_export"}}
    config = copy.deepcopy(CONFIG)
    config["devices"] = devices
    config["models"]["net"]["devices"] = ["ort", "eager"]
    plan = Plan(validate_config(config))
    assert plan.model_devices("net") == ["ort", "eager"]
    assert plan.model_devices("net_int8") == ["ort"]
    assert "net" not in plan.device_plan()
    assert plan.device_plan()["net_int8"]["skipped"] == {"torch_export": ["eager"]}
    config["models"]["net"]["devices"] = ["ort", "gpu0"]
    with pytest.raises(ConfigError, match=r"models\.net\.devices: 'gpu0' is not a key"):
        validate_config(config)
