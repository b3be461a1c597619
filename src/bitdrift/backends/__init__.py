"""Runtimes behind one interface, one module each (as Keras keeps
``keras/src/backend/<name>/``): a device's ``backend`` names its module, and nothing else in
bitdrift branches on that name, so an unknown name is an error here and never "the other
framework" by accident.

Every module has:

- ``NAME`` and ``environment(device) -> dict``: variables its process needs set before the
  framework is imported (e.g. ``KERAS_BACKEND``);
- ``preimport()``: what a worker process imports before its job, and ``PREFORK``: whether
  a CPU device's repeats are children forked after that import (bitdrift.run.workers) instead
  of fresh processes (a GPU or TPU device's never are: ``prefork.forkable``);
- ``import_keras()``: Keras on this backend (refusing a process already on another);
- ``configure_threads(threads)``, ``configure_determinism(deterministic)``: the framework's
  own switches;
- ``check_accelerator(name, device) -> dict``: the accelerator the device asks for, seen by
  the framework, described for the fingerprint; a missing one raises AcceleratorMissing,
  never falls back to the CPU;
- ``strategy_scope(accelerator)``: where models are built (a TPU strategy, or nothing);
- ``versions() -> dict``: the framework's versions and build switches for the fingerprint.

and ``open_session(job, name) -> Session``: the model loaded (cast, placed on the
accelerator) and callable on a batch, returning the recorded layers' outputs, with the
model as deployed beside it (final output only: the observer check, bitdrift.analysis.observer):
a Keras model on a Keras runtime or an exported one, a .pt2 program on its own runtimes.

Each module also answers what the rest of bitdrift asks of a runtime, so that nothing
outside this package branches on its name:

- ``SESSIONS``: {format: open(job, name) -> Session}, the session of a model file of each
  format the runtime runs (bitdrift.runtimes.FORMAT_RUNTIMES lists the same pairs), each
  written as Polygraphy's ``SessionFromOnnx(ModifyOutputs(OnnxFromPath(p)))``: loader
  steps (a conversion of another format, every layer's output marked) composed with the
  runtime's runner, a conversion named in the record's fingerprint. :func:`open_session`
  picks it for a job;
- ``script_code(device, layer)``, ``script_refusal(device, layer)`` and ``SCRIPT_LAYER``:
  what bitdrift.run.repro writes for a device (the code running one layer alone, why it
  cannot, and the file of the layer it reads: ``onnx``, ``tflite`` or None for the
  weights as .npy); ``script_code`` is None for a runtime with no such script.

The Keras backends (``tensorflow``, ``torch``, ``jax``) share theirs (``keras.common``);
the exported runtimes (``onnxruntime``, ``openvino``, ``litert``) run the file
``bitdrift.backends.keras.export`` wrote from the same ``.keras`` model
(``exported.common``), and cannot train; a user's own ONNX file as it is
(``exported.onnx_file``), a user's own .tflite on litert (``exported.tflite_file``). A
torch.export program (``.pt2``) runs on ``torch_export`` (eager, per module),
``torch_inductor`` (torch.compile) and ``executorch``, and converted on onnxruntime,
openvino and litert (``torch_program.converted``); an ONNX model on ``torch_export`` too,
converted by onnx2torch, and on litert converted twice.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from bitdrift.errors import ConfigError
from bitdrift.runtimes import (  # noqa: F401  (the list, as backends.RUNTIMES)
    EXPORTED_RUNTIMES,
    KERAS_RUNTIMES,
    KNOBS,
    PROGRAM_RUNTIMES,
    RUNTIMES,
)

# Each runtime's module, by family: Keras on its backends, the runtimes of an exported
# file, and those of a torch.export program
MODULES = {"tensorflow": "keras.tensorflow", "torch": "keras.torch", "jax": "keras.jax",
           "onnxruntime": "exported.onnxruntime", "openvino": "exported.openvino",
           "litert": "exported.litert", "torch_export": "torch_program.eager",
           "torch_inductor": "torch_program.inductor",
           "executorch": "torch_program.executorch"}


@runtime_checkable
class Backend(Protocol):
    """The interface every runtime module has (the module docstring says what each does);
    tests/unit/test_backends.py checks each module against it."""

    NAME: str
    TRAINS: bool
    PREFORK: bool
    SESSIONS: dict
    SCRIPT_LAYER: str | None
    script_code: Callable | None

    def environment(self, device: dict) -> dict: ...
    def preimport(self) -> None: ...
    def import_keras(self): ...
    def configure_threads(self, threads: int | None) -> None: ...
    def configure_determinism(self, deterministic: bool) -> None: ...
    def check_accelerator(self, name: str, device: dict) -> dict: ...
    def strategy_scope(self, accelerator: dict): ...
    def versions(self) -> dict: ...
    def open_session(self, job: dict, name: str): ...
    def trace_environment(self, device: dict) -> dict | None: ...
    def script_refusal(self, device: dict, layer) -> str | None: ...


@dataclass
class Session:
    """One model loaded by a runtime in this process.

    ``run(batch)`` returns the recorded layers' outputs in the order of ``layers`` (the
    final output last), or the final output alone when no layers are recorded;
    ``final(batch)`` the final output. ``checked`` holds what the effective-precision
    check needs ({layer: (spec, weights)}); ``unmapped`` the layers an exported runtime
    could not expose, left out of ``layers``; ``kernels`` what an exported runtime says it
    runs in each layer (a traced job only)."""

    layers: list[tuple[str, str]]
    run: Callable[[np.ndarray], list[np.ndarray]]
    final: Callable[[np.ndarray], np.ndarray]
    accelerator: dict
    checked: dict = field(default_factory=dict)
    unmapped: list[str] = field(default_factory=list)
    # An exported runtime's kernels per recorded layer, from its own description of the
    # compiled graph, when the job traces ({layer: [KernelCall as dict]}); None otherwise
    kernels: dict | None = None
    # The Dense and Conv2D layers whose summation order can be revealed ({layer:
    # bitdrift.analysis.accumulation.probes.probe_spec}) and how: order_probe(spec, batch) returns
    # a function
    # of (kernel as (terms, units), bias) giving the (batch, units) sums of a batch of ones
    # through such a layer alone, in the runtime's own format (bitdrift.analysis.accumulation)
    order_layers: dict = field(default_factory=dict)
    order_probe: Callable | None = None
    # The summing layers whose order is not revealed, and why ({layer: reason}): a model
    # of another format whose nodes bitdrift does not probe yet; recorded as not revealed
    unrevealed: dict = field(default_factory=dict)
    # The model as deployed (the observer check, bitdrift.analysis.observer): ``deployed(batch)``
    # gives the final output of the program a user runs, the final output alone with the
    # runtime's own graph optimisations, and ``deployed_program`` says which program that
    # is; None where the session has none (a traced job, an exported runtime without its
    # deployed file)
    deployed: Callable[[np.ndarray], np.ndarray] | None = None
    deployed_program: str = ""
    # A traced job of an exported runtime: the kernels of the deployed graph and of the
    # instrumented one, in graph order ({"deployed": [KernelCall as dict], "instrumented":
    # [...]}), so the traced repeat names the deployed graph's kernels where they differ
    deployed_kernels: dict | None = None
    # A quantized model's integer layers: their scale and zero point where the graph gives
    # them ({layer: {"scale": [numbers] or {"layer": name}, ...}}, onnx_file.
    # quantization_params); the record keeps them as the layers' attributes
    quantization: dict = field(default_factory=dict)


def get(name: str):
    """The module of runtime ``name``; ConfigError for a name bitdrift has no module for."""
    if name not in RUNTIMES:
        raise ConfigError(f"unknown backend {name!r} (bitdrift has {', '.join(RUNTIMES)})")
    return importlib.import_module(f"bitdrift.backends.{MODULES[name]}")


def open_session(job: dict, name: str):
    """The Session of the job's device on the job's model (Session): the device's runtime
    opens a model of the job's format (``model_format``, Keras unless given) by its
    SESSIONS; a runtime that does not run that format is refused in one line naming both,
    and a model of another format than Keras is checked first against what the runtime
    feeds (several inputs) and the device's batch size."""
    from bitdrift import formats
    from bitdrift.errors import InferenceError, ModelFormatError

    backend = job["device"]["backend"]
    loader = formats.get(job.get("model_format") or "keras")
    runtimes = formats.runtimes(loader.NAME)
    if backend not in runtimes:
        raise InferenceError(f"device {name!r}: backend {backend!r} cannot run "
                             f"{job['model_path']} ({loader.WHAT}; runtimes that can: "
                             f"{', '.join(runtimes) or 'none yet'})")
    runtime = get(backend)
    if not getattr(loader, "INPUTS_CHECKED_BEFORE_SESSION", True):
        return runtime.SESSIONS[loader.NAME](job, name)
    batch, inputs = job["device"]["batch_size"], loader.signature(job["model_path"])
    try:
        formats.check_runtime_inputs(loader.NAME, backend, inputs, job["model_path"])
    except ModelFormatError as error:
        raise InferenceError(f"device {name!r}: {error}") from error
    fixed = [wanted for wanted in inputs if wanted.shape and wanted.shape[0] not in (None, batch)]
    if fixed:
        raise InferenceError(f"device {name!r}: batch_size {batch}, but model "
                             f"{job['model_path']} takes batches of exactly "
                             f"{fixed[0].shape[0]} (input {fixed[0].describe()})")
    return runtime.SESSIONS[loader.NAME](job, name)
