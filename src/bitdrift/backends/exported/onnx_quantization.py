"""ONNX Runtime's own quantizer as a step: a float ONNX model to a quantized one
(``onnxruntime.quantization``), written atomically, for ONNX Runtime to run as a user's
ONNX file. Dynamic quantization (``quantize_dynamic``: weights quantized ahead,
activations by DynamicQuantizeLinear at run time, MatMulInteger and ConvInteger nodes) or
static (``quantize_static``: activations' scales calibrated on the model's inputs, as QDQ
pairs around float ops or as QOperator nodes such as QLinearMatMul), with the settings
users switch. Each setting's default is ONNX Runtime's own."""

from __future__ import annotations

from pathlib import Path

from bitdrift.backends.quantizers import calibration_batches, checked_choices
from bitdrift.errors import ConfigError, ModelFormatError
from bitdrift.runtimes import QUANTIZATION_METHODS, QUANTIZATION_SETTINGS

# {setting: (its values, ONNX Runtime's default)}; the settings each method takes
SETTINGS, METHODS = QUANTIZATION_SETTINGS, QUANTIZATION_METHODS
# each setting's help, for `bitdrift quantize --tool onnxruntime`
HELP = {
    "method": "dynamic: activations quantized at run time; static: calibrated on --inputs",
    "weight_type": "the weights' 8-bit type",
    "activation_type": "static: the activations' 8-bit type (dynamic's are uint8)",
    "per_channel": "a weight scale per output channel",
    "reduce_range": "7-bit weights",
    "format": "static: QDQ pairs around the float ops, or QOperator nodes (QLinearMatMul)",
    "calibrate_method": "static: how the activations' ranges are calibrated",
}
CALIBRATION_BATCH = 16  # samples a calibration step feeds, where the batch axis is free


def config_key(key: str) -> str:
    return f"quantization.{key}"


def checked_settings(settings: dict, named=config_key) -> dict:
    """``settings`` with ONNX Runtime's defaults filled in; ConfigError in one line naming
    the setting (``named(key)``: a config key, a command's option) for an unknown key, a
    value not allowed, or a static-only setting given to dynamic quantization."""
    return checked_choices(settings, SETTINGS, named, "ONNX Runtime's quantizer",
                           scope=("method", METHODS))


def calibration_reader(model_path, inputs_path):
    """An onnxruntime CalibrationDataReader over the model's inputs file: batches of
    CALIBRATION_BATCH samples (calibration_batches; the inputs checked first)."""
    from onnxruntime.quantization import CalibrationDataReader

    first = list(calibration_batches(model_path, inputs_path, "onnx",
                                     CALIBRATION_BATCH))  # checked here, not lazily

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._batches = iter(first)

        def get_next(self):
            return next(self._batches, None)

        def rewind(self):
            self._batches = iter(first)

    return Reader()


def quantize_model(model_path, out, settings: dict | None = None, inputs_path=None,
                   named=config_key) -> dict:
    """Quantize the float ONNX model at ``model_path`` with ONNX Runtime's quantizer into
    ``out`` (written atomically): ``settings`` (SETTINGS; ORT's defaults where left out;
    a wrong one named by ``named``), static quantization calibrated on ``inputs_path``,
    the model's inputs. Returns the settings used, defaults filled in."""
    from bitdrift.atomic import atomic_output
    from bitdrift.backends.exported import common as exported
    from bitdrift.backends.exported.onnxruntime import NAME, PIN
    from bitdrift.formats import detect

    settings = checked_settings(settings, named)
    if detect(model_path) != "onnx":
        raise ModelFormatError(f"{model_path}: ONNX Runtime's quantizer takes an ONNX model")
    exported.require("onnxruntime", NAME, PIN)
    from onnxruntime import quantization

    common = {"per_channel": settings["per_channel"],
              "reduce_range": settings["reduce_range"],
              "weight_type": getattr(quantization.QuantType, settings["weight_type"])}
    if settings["method"] == "static" and inputs_path is None:
        raise ConfigError(f"static quantization of {model_path} needs its inputs to "
                          "calibrate on")
    reader = calibration_reader(model_path, inputs_path) \
        if settings["method"] == "static" else None
    with atomic_output(out) as tmp:
        try:
            if reader is None:
                quantization.quantize_dynamic(str(model_path), str(tmp), **common)
            else:
                quantization.quantize_static(
                    str(model_path), str(tmp), reader,
                    quant_format=getattr(quantization.QuantFormat, settings["format"]),
                    activation_type=getattr(quantization.QuantType,
                                            settings["activation_type"]),
                    calibrate_method=getattr(quantization.CalibrationMethod,
                                             settings["calibrate_method"]),
                    **common)
        except (ValueError, RuntimeError, KeyError, TypeError) as error:
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ModelFormatError(f"{model_path}: ONNX Runtime's quantizer cannot quantize "
                                   f"it ({settings['method']}: {first})") from error
        if not Path(tmp).is_file():
            raise ModelFormatError(f"{model_path}: ONNX Runtime's quantizer wrote no model")
    return settings
