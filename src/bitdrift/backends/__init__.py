"""Runtimes behind one interface, one module each (as Keras keeps
``keras/src/backend/<name>/``): a device's ``backend`` names its module, and nothing else in
bitdrift branches on that name, so an unknown name is an error here and never "the other
framework" by accident.

Every module has:

- ``NAME`` and ``environment(device) -> dict``: variables its process needs set before the
  framework is imported (e.g. ``KERAS_BACKEND``);
- ``import_keras()``: Keras on this backend (refusing a process already on another);
- ``configure_threads(threads)``, ``configure_determinism(deterministic)``: the framework's
  own switches;
- ``check_accelerator(name, device) -> dict``: the accelerator the device asks for, seen by
  the framework, described for the fingerprint; a missing one raises AcceleratorMissing,
  never falls back to the CPU;
- ``strategy_scope(accelerator)``: where models are built (a TPU strategy, or nothing);
- ``versions() -> dict``: the framework's versions and build switches for the fingerprint.

Load, cast, run a batch and the per-layer outputs are Keras' own for these backends
(``bitdrift.models``); a runtime that is not Keras brings its own.
"""

from __future__ import annotations

import importlib

from bitdrift.errors import ConfigError

# Each name is a module of this package and an entry of the config schema's `backend`.
RUNTIMES = ("tensorflow", "torch", "jax")


def get(name: str):
    """The module of runtime ``name``; ConfigError for a name bitdrift has no module for."""
    if name not in RUNTIMES:
        raise ConfigError(f"unknown backend {name!r} (bitdrift has {', '.join(RUNTIMES)})")
    return importlib.import_module(f"bitdrift.backends.{name}")
