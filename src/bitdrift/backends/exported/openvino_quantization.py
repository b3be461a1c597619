"""OpenVINO's post-training quantizer as a step: NNCF (``nncf.quantize``, its ONNX backend)
quantizes a float ONNX model into an ONNX file of QuantizeLinear/DequantizeLinear pairs
(QDQ), activations' ranges calibrated on the model's inputs, written atomically. OpenVINO's
CPU plugin reads the pairs as FakeQuantize and runs int8 kernels where they sit (its
runtime graph says which: bitdrift.backends.exported.openvino); ONNX Runtime runs the same
file. Each setting's default is NNCF's own."""

from __future__ import annotations

from bitdrift.errors import ConfigError, ModelFormatError

# {setting: (its values, NNCF's default)}; subset_size is a count and ignored_scope a
# mapping, checked on their own. preset's default is NNCF's: mixed (asymmetric
# activations) for a transformer, performance (symmetric) otherwise.
SETTINGS = {
    "preset": (("performance", "mixed"), None),
    "subset_size": (int, 300),  # calibration samples (the model's batches, if it fixes one)
    "fast_bias_correction": ((True, False), True),
    "model_type": ((None, "transformer"), None),  # transformer: SmoothQuant, no Softmax int8
    "target_device": (("ANY", "CPU", "GPU", "NPU"), "ANY"),  # CPU_SPR: OpenVINO backend only
    "ignored_scope": (dict, {}),  # {names, patterns, types}: nodes left in float
}
IGNORED_SCOPE_KEYS = ("names", "patterns", "types")
HELP = {
    "preset": "performance: symmetric activations; mixed: asymmetric (NNCF's default: mixed "
              "for a transformer, else performance)",
    "subset_size": "calibration samples",
    "fast_bias_correction": "the fast bias correction (off: the full one)",
    "model_type": "transformer: SmoothQuant and the transformer's ignored ops",
    "target_device": "the hardware NNCF places quantizers for",
}


def config_key(key: str) -> str:
    return f"quantize.{key}"


def checked_settings(settings: dict, named=config_key) -> dict:
    """``settings`` with NNCF's defaults filled in; ConfigError in one line naming the
    setting (``named(key)``) for an unknown key or a value not allowed."""
    settings = dict(settings or {})
    for key, value in settings.items():
        if key not in SETTINGS:
            raise ConfigError(f"{named(key)}: unknown setting of NNCF's quantizer (known: "
                              f"{', '.join(SETTINGS)})")
        allowed = SETTINGS[key][0]
        if allowed is int:
            if type(value) is not int or value < 1:
                raise ConfigError(f"{named(key)}: {value!r} is not a count of at least 1")
        elif allowed is dict:
            _check_ignored_scope(value, named(key))
        elif value not in allowed or type(value) not in {type(item) for item in allowed}:
            raise ConfigError(f"{named(key)}: {value!r} is none of "
                              f"{', '.join(map(repr, allowed))}")
    used = {key: settings.get(key, default) for key, (_, default) in SETTINGS.items()}
    if used["preset"] is None:
        used["preset"] = "mixed" if used["model_type"] == "transformer" else "performance"
    used["ignored_scope"] = {key: list(values) for key, values
                             in sorted(used["ignored_scope"].items())}
    return used


def _check_ignored_scope(value, key: str) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: {value!r} is not a mapping of "
                          f"{', '.join(IGNORED_SCOPE_KEYS)}")
    for part, names in value.items():
        if part not in IGNORED_SCOPE_KEYS:
            raise ConfigError(f"{key}.{part}: none of {', '.join(IGNORED_SCOPE_KEYS)}")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{key}.{part}: {names!r} is not a list of strings")


def calibration_dataset(model_path, inputs_path):
    """An nncf.Dataset over the model's inputs file: one sample per item (NNCF's
    subset_size counts items), or the model's own batch where it fixes one. The inputs
    are checked against the model first (a mismatch is one line naming both)."""
    import nncf

    from bitdrift.backends.quantizers import calibration_batches

    return nncf.Dataset(list(calibration_batches(model_path, inputs_path, "onnx", 1,
                                                 "NNCF's quantization")))


def quantize_model(model_path, out, settings: dict | None = None, inputs_path=None,
                   named=config_key) -> dict:
    """Quantize the float ONNX model at ``model_path`` with NNCF into the QDQ ONNX file
    ``out`` (written atomically), calibrated on ``inputs_path``, the model's inputs;
    ``settings`` as SETTINGS (NNCF's defaults where left out; a wrong one named by
    ``named``). Returns the settings used, defaults filled in."""
    from bitdrift.atomic import atomic_output
    from bitdrift.backends.exported import common as exported
    from bitdrift.backends.exported.openvino import NAME
    from bitdrift.formats import detect

    settings = checked_settings(settings, named)
    if detect(model_path) != "onnx":
        raise ModelFormatError(f"{model_path}: NNCF's quantizer (tool openvino) takes an ONNX "
                               "model here")
    if inputs_path is None:
        raise ConfigError(f"NNCF's quantization of {model_path} needs its inputs to "
                          "calibrate on")
    exported.require("nncf", NAME, "nncf==3.4.0")
    import nncf
    import onnx

    dataset = calibration_dataset(model_path, inputs_path)
    model = onnx.load(str(model_path))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    scope = settings["ignored_scope"]
    arguments = {
        "preset": nncf.QuantizationPreset(settings["preset"]),
        "target_device": nncf.TargetDevice(settings["target_device"]),
        "subset_size": settings["subset_size"],
        "fast_bias_correction": settings["fast_bias_correction"],
        "model_type": nncf.ModelType(settings["model_type"]) if settings["model_type"]
        else None,
        "ignored_scope": nncf.IgnoredScope(**scope, validate=True) if scope else None}
    # NNCF raises its own kinds (nncf.ValidationError, ...), all Exception's
    failures = (ValueError, RuntimeError, KeyError, TypeError, nncf.ValidationError,
                nncf.InternalError, nncf.UnsupportedModelError)
    try:
        quantized = nncf.quantize(model, dataset, **arguments)
    except failures as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ModelFormatError(f"{model_path}: NNCF cannot quantize it (opset {opset}: "
                               f"{first})") from error
    with atomic_output(out) as tmp:
        onnx.save(quantized, str(tmp))
    return settings
