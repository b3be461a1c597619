"""The quantizers a config names (models.NAME.quantize.tool, bitdrift.runtimes.QUANTIZERS):
each runtime's own tool, in the module of that runtime, reached by name here so that the
config check, the rule quantize_model and `bitdrift quantize` share one dispatch."""

from __future__ import annotations

import importlib

from bitdrift.errors import ConfigError
from bitdrift.runtimes import DEFAULT_QUANTIZER, QUANTIZERS


def tool_of(settings: dict) -> str:
    return settings.get("tool", DEFAULT_QUANTIZER)


def module(tool: str, named=lambda key: key):
    """The module of quantizer ``tool``; ConfigError naming ``named('tool')`` if unknown."""
    if tool not in QUANTIZERS:
        raise ConfigError(f"{named('tool')}: {tool!r} is none of {', '.join(QUANTIZERS)}")
    return importlib.import_module(QUANTIZERS[tool][0])


def source_formats(tool: str) -> tuple[str, ...]:
    return QUANTIZERS[tool][1]


def runtimes(tool: str) -> tuple[str, ...]:
    """The runtimes that run what ``tool`` writes."""
    return QUANTIZERS[tool][2]


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
