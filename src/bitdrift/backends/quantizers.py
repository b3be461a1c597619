"""The quantizers a config names (models.NAME.quantize.tool, bitdrift.runtimes.QUANTIZERS):
each runtime's own tool, in the module of that runtime, reached by name here so that the
config check, the rule quantize_model and `bitdrift quantize` share one dispatch."""

from __future__ import annotations

import importlib

from bitdrift.errors import ConfigError, ModelFormatError
from bitdrift.runtimes import DEFAULT_QUANTIZER, QUANTIZERS


def module(tool: str, named=lambda key: key):
    """The module of quantizer ``tool``; ConfigError naming ``named('tool')`` if unknown."""
    if tool not in QUANTIZERS:
        raise ConfigError(f"{named('tool')}: {tool!r} is none of {', '.join(QUANTIZERS)}")
    return importlib.import_module(QUANTIZERS[tool][0])


def source_formats(tool: str) -> tuple[str, ...]:
    return QUANTIZERS[tool][1]



def checked_settings(settings: dict, named=lambda key: key) -> dict:
    """``settings`` (tool and the tool's own keys, the float model's name left out) with
    the tool's defaults filled in, the tool first; each error names its key."""
    settings = dict(settings or {})
    tool = settings.pop("tool", DEFAULT_QUANTIZER)
    return {"tool": tool, **module(tool, named).checked_settings(settings, named)}


def quantize_model(model_path, out, settings: dict, inputs_path=None,
                   named=lambda key: key) -> dict:
    """Quantize ``model_path`` into ``out`` with the tool ``settings`` names; returns the
    settings used, the tool first."""
    settings = dict(settings or {})
    tool = settings.pop("tool", DEFAULT_QUANTIZER)
    used = module(tool, named).quantize_model(model_path, out, settings, inputs_path,
                                              named=named)
    return {"tool": tool, **used}


def checked_choices(settings: dict, table: dict, named, whose: str,
                    scope: tuple[str, dict] | None = None) -> dict:
    """``settings`` of a quantizer whose every setting is one of a few values (``table``:
    {setting: (its values, its default)}), the defaults filled in; ConfigError in one
    line naming the setting (``named(key)``) for an unknown key or a value not allowed.
    ``scope``: (the setting that decides which others apply, {its value: those}), e.g.
    ONNX Runtime's method; a setting given outside its scope is refused too."""
    settings = dict(settings or {})
    if scope is not None:
        key, scopes = scope
        chosen = settings.get(key, table[key][1])
        if chosen not in table[key][0]:
            raise ConfigError(f"{named(key)}: {chosen!r} is none of "
                              f"{', '.join(table[key][0])}")
        applies = scopes[chosen]
    else:
        applies = tuple(table)
    for key, value in settings.items():
        if key not in table:
            raise ConfigError(f"{named(key)}: unknown setting of {whose} (known: "
                              f"{', '.join(table)})")
        if key not in applies:
            owners = [value for value, keys in scope[1].items() if key in keys]
            raise ConfigError(f"{named(key)}: a setting of {' or '.join(owners)} "
                              f"{scope[0]} only, not of {chosen}")
        allowed = table[key][0]
        if value not in allowed or type(value) is not type(allowed[0]):
            raise ConfigError(f"{named(key)}: {value!r} is none of "
                              f"{', '.join(map(repr, allowed))}")
    return {key: settings.get(key, table[key][1]) for key in applies}


def calibration_batches(model_path, inputs_path, format: str, batch: int,
                        step: str = "static quantization"):
    """The model's inputs file (a .npy, or a .npz of one array per input) as feeds
    {input name: array} of ``batch`` samples each (the model's own batch size where it
    fixes one), for a quantizer's calibration of a model of ``format`` (``step`` names it in
    errors). The inputs
    are checked against the model first: a mismatch is one line naming the model, the
    file and why."""
    import numpy as np

    from bitdrift.formats import check_inputs
    from bitdrift.inputs.datasets import NamedInputs, read_inputs, sample_count

    try:
        signature = check_inputs(inputs_path, model_path, format)
    except ModelFormatError as error:
        raise ModelFormatError(f"{step} of {model_path}: its calibration set does not fit "
                               f"({error})") from error
    inputs = read_inputs(inputs_path)
    fixed = signature[0].shape[0] if signature and signature[0].shape else None
    batch = fixed or batch
    count = sample_count(inputs) // batch * batch if fixed else sample_count(inputs)
    if count == 0:
        raise ModelFormatError(f"{step} of {model_path}: {inputs_path} holds "
                               f"{sample_count(inputs)} samples, fewer than the model's fixed "
                               f"batch of {fixed}")
    for start in range(0, count, batch):
        rows = inputs[start:start + batch]
        if isinstance(rows, NamedInputs):
            yield {name: np.ascontiguousarray(array) for name, array in rows.items()}
        else:
            yield {signature[0].name: np.ascontiguousarray(rows)}
