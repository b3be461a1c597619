"""A PyTorch ``torch.export`` program (``.pt2``) run eagerly by torch
(bitdrift.backends.torch_program.program.EagerRunner): every module call's output recorded under
its module path (``features.0``, ``classifier``), the program's own forward
(``program.module()``) as deployed (the observer check).

Device keys: ``threads`` (torch.set_num_threads), ``precision`` (parameters, buffers and
inputs cast), ``deterministic`` (torch.use_deterministic_algorithms) and ``env`` for the
libraries' process-level switches (ONEDNN_MAX_CPU_ISA, MKL_CBWR, ATEN_CPU_CAPABILITY),
which each library reads once at its first use: every repeat is a fresh process
(PREFORK False), so the variables are set before torch is imported. The fingerprint holds
torch's own view of these settings (torch_program.settings).

An ONNX model runs here too, converted by onnx2torch, each node's output recorded under
its ONNX name (bitdrift.formats.onnx.torch_session), with the same knobs.

What the three runtimes of a .pt2 program (this one, torch_inductor, executorch) share
is here: ``program_layers`` and ``session_from_runner``.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from bitdrift.errors import AcceleratorMissing, ConfigError, InferenceError

NAME = "torch_export"
TRAINS = False
# Fresh processes: the libraries' ISA caps and MKL's CBWR are read once per process, and a
# device's repeats must each decide them afresh (bitdrift.run.workers)
PREFORK = False


def environment(device: dict) -> dict:
    """The device's ``env`` is set by bitdrift.run.devices; its torch variables are checked
    here (a value the library would ignore without a word is refused)."""
    from bitdrift.backends.torch_program.program import ProgramError, process_environment

    env = device.get("env") or {}
    try:
        process_environment(env.get("ONEDNN_MAX_CPU_ISA"), env.get("MKL_CBWR"),
                            env.get("ATEN_CPU_CAPABILITY"))
    except ProgramError as error:
        raise ConfigError(f"config key devices.*.env: {error}") from error
    return {}


def preimport() -> None:
    import torch  # noqa: F401


def import_keras():
    raise ConfigError(f"backend {NAME!r} runs a torch.export program (.pt2): it cannot train "
                      "or load a .keras file (use tensorflow, torch or jax)")


def configure_threads(threads: int | None) -> None:
    from bitdrift.backends.torch_program.program import configure

    configure(threads=threads)


def configure_determinism(deterministic: bool) -> None:
    from bitdrift.backends.torch_program.program import configure

    configure(deterministic=deterministic)


def check_accelerator(name: str, device: dict) -> dict:
    if device["accelerator"] != "cpu":
        raise AcceleratorMissing(f"device {name!r}: backend {device['backend']!r} runs a .pt2 "
                                 f"program on the CPU here, not a {device['accelerator'].upper()}"
                                 "; refusing to fall back to the CPU")
    return {"accelerator": "cpu", "model_format": "pt2"}


def strategy_scope(accelerator: dict):
    return contextlib.nullcontext()


def versions() -> dict:
    """torch's version and its view of the process's settings (threads, deterministic
    algorithms, ATen's CPU capability, the oneDNN/MKL variables set)."""
    if "torch" not in sys.modules:
        return {}
    from bitdrift.backends.torch_program.program import settings

    return {f"torch_{key}" if key != "torch" else key: value
            for key, value in settings().items()}


def trace_environment(device: dict) -> dict:
    """oneDNN's and MKL's verbose logging, as a Keras-on-torch device's traced repeat
    (bitdrift.backends.keras.torch); the eager runner marks each module call's nodes."""
    from bitdrift.backends.keras.torch import trace_environment as torch_trace_environment

    return torch_trace_environment(device)


def program_layers(program) -> tuple[list[tuple[str, str]], str | None]:
    """[(module path, module class)] of the program's recorded module calls in
    topological order, with the final output last: when the program's output is not the
    last call's (a function after the last module), it is added under the output node's
    own name (returned second, None otherwise)."""
    from bitdrift.backends.torch_program.program import module_outputs

    graph = program.module().graph
    recorded, _ = module_outputs(graph)
    layers = [(call.name, call.module_type.rsplit(".", 1)[-1]) for call in recorded]
    output = next(node for node in graph.nodes if node.op == "output")
    results = [arg for arg in _leaves(output.args)]
    if len(results) != 1:
        raise InferenceError(f"the program has {len(results)} outputs: bitdrift records "
                             "programs of one output")
    final = results[0].name
    if recorded and recorded[-1].node == final:
        return layers, None
    return layers + [(final, "output")], final


def _leaves(args):
    import torch.utils._pytree as pytree

    return [leaf for leaf in pytree.tree_leaves(args) if hasattr(leaf, "op")]


def load(job: dict):
    """The job's program (torch_program.load_program: one line for a damaged file)."""
    from bitdrift.backends.torch_program.program import load_program

    return load_program(job["model_path"])


def compiled_unrevealed(program, compiler: str) -> dict:
    """{layer: why its order is not revealed} of the program's Linear and Conv2d calls
    (formats.pt2.file_layers) on a runtime that compiles the program whole: the order of
    the compiled node alone is not probed (it may be fused, or lowered otherwise than the
    node alone would be)."""
    from bitdrift.formats import pt2

    return {layer["name"]: f"{compiler} compiles the program whole; its {layer['op_type']} "
                           "call is not probed alone"
            for layer in pt2.program_file_layers(program) if "op_type" in layer}


def session_from_runner(runner, name: str, accelerator: dict, *, note: str,
                        deployed=None, deployed_program: str = "", unrevealed=None):
    """A Session recording ``runner``'s final output only (a compiled runtime), saying why
    in the fingerprint (``per_layer``); the compiled code's kernel names, once known,
    join the fingerprint too. ``unrevealed``: compiled_unrevealed's."""
    from bitdrift.backends import Session

    accelerator["per_layer"] = note

    def final(batch):
        run = runner([batch])
        if run.kernels is not None:
            accelerator["compiled_kernels"] = run.kernels
        return run.outputs[-1]

    return Session(layers=[], run=lambda batch: [final(batch)], final=final,
                   accelerator=accelerator, deployed=deployed, unrevealed=unrevealed or {},
                   deployed_program=deployed_program)


def open_session(job: dict, name: str):
    """The program run eagerly, every module call recorded (none when the job records no
    layers), and the program's own forward as deployed."""
    from bitdrift.backends import Session
    from bitdrift.backends.torch_program.program import EagerRunner, ProgramError
    from bitdrift.formats import pt2

    device = job["device"]
    accelerator = check_accelerator(name, device)
    program = load(job)
    trace = bool(job.get("trace"))
    if trace:  # the kernel lines fall between a call's markers (bitdrift.analysis.kernels)
        from bitdrift.backends.keras.common import marked_deployed, print_marker
    try:
        runner = EagerRunner(program, precision=device["precision"],
                             threads=device.get("threads"),
                             deterministic=device.get("deterministic"),
                             source=job["model_path"], mark=print_marker if trace else None)
    except ProgramError as error:
        raise InferenceError(f"device {name!r}: {error}") from error
    layers, final_name = program_layers(program)
    accelerator["per_layer"] = "every module call's output, by module path (torch eager)"
    checked, order_layers, unrevealed = {}, {}, {}
    if job["layers"]:  # the Linear and Conv2d calls, read from the program (formats.pt2)
        checked, order_layers, unrevealed = pt2.checked_layers(
            pt2.program_file_layers(program), [layer for layer, _ in layers], device["precision"])

    def arrays(batch) -> list:
        """The program's inputs in call order: several by name (datasets.NamedInputs)."""
        if isinstance(batch, dict):
            return [batch[spec.name] for spec in runner.signature]
        return [batch]

    def run(batch):
        result = runner(arrays(batch), record_layers=bool(job["layers"]))
        if not job["layers"]:
            return [result.outputs[-1]]
        return [result.outputs[-1] if layer == final_name else result.layers[layer]
                for layer, _ in layers]

    def final(batch):
        return runner(arrays(batch), record_layers=False).outputs[-1]

    # a traced job's deployed run is logged between its own markers (observer check)
    deployed = marked_deployed(final, lambda: None) if trace else final
    return Session(layers=layers if job["layers"] else [], run=run, final=final,
                   accelerator=accelerator, deployed=deployed, checked=checked,
                   order_layers=order_layers, unrevealed=unrevealed,
                   order_probe=pt2.node_order_probe(device["precision"]) if order_layers
                   else None,
                   deployed_program=f"{Path(job['model_path']).name}'s program.module() "
                                    "called, torch eager")
