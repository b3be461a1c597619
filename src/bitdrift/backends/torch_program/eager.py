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
its ONNX name (:func:`open_onnx`), with the same knobs.

What the three runtimes of a .pt2 program (this one, torch_inductor, executorch) and its
conversions (bitdrift.backends.torch_program.converted) share is here: ``program_layers``,
``session_from_runner``, ``checked_layers``.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np

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
        checked, order_layers, unrevealed = checked_layers(
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
                   order_probe=node_order_probe(device["precision"]) if order_layers
                   else None,
                   deployed_program=f"{Path(job['model_path']).name}'s program.module() "
                                    "called, torch eager")


def open_onnx(job: dict, name: str):
    """A Session of torch eager (its knobs: threads, deterministic, precision, the
    libraries' ISA variables) on a user's ONNX model converted by onnx2torch (the loader
    conversions.from_onnx; converter and versions in the fingerprint; an op it lacks fails
    this device alone, named). Each node's output is
    recorded under the ONNX value it computes, the names an ONNX runtime's record has; a
    value no fx node is known to compute is unmapped, never guessed. The GraphModule's
    own forward is the model as deployed."""
    from bitdrift.backends import Session
    from bitdrift.backends.exported import onnx_file
    from bitdrift.backends.torch_program.conversions import from_onnx
    from bitdrift.backends.torch_program.program import (
        ProgramError,
        cast_module,
        configure,
        run_graph,
        to_tensor,
    )
    from bitdrift.formats import onnx

    device, path = job["device"], job["model_path"]
    accelerator = check_accelerator(name, device)
    accelerator["model_format"] = onnx.NAME
    _, layers, untyped = onnx_file.instrumented(path)
    try:
        conversion = from_onnx(path)
    except InferenceError as error:
        raise InferenceError(f"device {name!r}: {error}") from error
    accelerator.update(conversion.fingerprint())
    precision = device["precision"]
    configure(device.get("threads"), device.get("deterministic"))
    try:
        module = cast_module(conversion.model, precision, Path(path).name)
    except ProgramError as error:
        raise InferenceError(f"device {name!r}: {error}") from error
    computed = set(conversion.layers.values())
    recorded = [(layer, op) for layer, op in layers if layer in computed]
    if not recorded or recorded[-1] != layers[-1]:
        raise InferenceError(f"device {name!r}: {conversion.converter} gives no node "
                             f"computing {Path(path).name}'s output {layers[-1][0]!r}")
    names = {}
    for node, value in conversion.layers.items():
        names.setdefault(node, []).append(value)
    wanted = [layer for layer, _ in recorded]
    accelerator["per_layer"] = (f"every ONNX node output {conversion.converter} computes "
                                "in an fx node of its own, by its ONNX name (torch eager)")

    # onnx2torch's placeholders follow the graph's inputs: several fed by name, in that order
    order = [wanted_input.name for wanted_input in onnx.signature(path)]

    def call(batch, record):
        arrays = [batch[input_name] for input_name in order] if isinstance(batch, dict) \
            else [batch]
        try:
            return run_graph(module, [to_tensor(array, precision) for array in arrays], names,
                             wanted, record, Path(path).name, precision)
        except ProgramError as error:
            raise InferenceError(f"device {name!r}: {error}") from error

    def run(batch):
        if not job["layers"]:
            return [final(batch)]
        found = call(batch, True).layers
        return [found[layer] for layer in wanted]

    def final(batch):
        return call(batch, False).outputs[-1]

    checked, _, _ = onnx_file.checked_layers(path, wanted)
    unrevealed = {layer: f"an ONNX {op} node on torch, whose order bitdrift does not probe "
                         "yet" for layer, op in recorded if op in onnx.SUMMING_OPS}
    return Session(layers=recorded if job["layers"] else [], run=run, final=final,
                   accelerator=accelerator, checked=checked if job["layers"] else {},
                   unmapped=[layer for layer, _ in layers if layer not in computed] + untyped
                   if job["layers"] else [], unrevealed=unrevealed, deployed=final,
                   deployed_program=f"{Path(path).name} converted by "
                                    f"{conversion.converter}, its forward, torch eager")


# -- what the torch_export device checks and probes ---------------------------------------------
def checked_layers(layers: list[dict], recorded: list[str], precision: str) -> tuple[dict,
                                                                                    dict, dict]:
    """({layer: (effective-precision spec, [kernel, bias] as the device had them)},
    {layer: order probe spec (bitdrift.analysis.accumulation.probes.probe_spec)}, {layer:
    why its order is not revealed}) of the recorded Linear and Conv2d calls among
    ``layers`` (bitdrift.formats.pt2.program_file_layers); the effective-precision check
    takes those fed by the program input or a recorded call. A Linear's order is probed
    at its input's own shape ((batch, terms), or a transformer's (batch, tokens, terms):
    every leading position a place of its own, probes.dense_grid), a Conv2d's (grouped
    and depthwise too) at its input's own shape, channels-last in the spec (its terms in
    Keras' order: position, then channel) and channels-first where the probe runs it
    (node_order_probe)."""
    from bitdrift.analysis.accumulation.probes import probe_spec
    from bitdrift.analysis.effective_precision import spec_from_config
    from bitdrift.formats.pt2 import CONV2D, LINEAR
    from bitdrift.inputs.models import numpy_dtype

    inputs = {layer["name"] for layer in layers if layer["class_name"] == "InputLayer"}
    checked, orders, unrevealed = {}, {}, {}
    for layer in layers:
        name = layer["name"]
        if name not in recorded:
            continue
        if layer["class_name"] in (LINEAR, CONV2D) and len(inputs) > 1 and \
                set(layer["inbound"]) & inputs:  # file_layers reads it by its op alone
            unrevealed[name] = "fed by one of the program's several inputs: not probed"
            continue
        if layer["class_name"] == CONV2D:  # file_layers could not name its padding
            unrevealed[name] = ("a Conv2d whose padding is neither none nor the same on "
                                "both sides at stride 1: not read")
            continue
        if layer["class_name"] not in ("Dense", "Conv2D"):
            continue
        source = layer["inbound"][0] if layer["inbound"] else None
        spec = spec_from_config(layer["class_name"], layer["config"],
                                None if source in inputs else source)
        if spec is not None and (source in inputs or source in recorded):
            checked[name] = (spec, [np.asarray(value).astype(numpy_dtype(precision))
                                    for value in layer["weights"]])
        kernel, shape = layer["weights"][0], layer["input_shape"]
        found, why = None, None
        if not shape or None in shape:
            why = "its input has a dynamic size besides the batch"
        elif layer["class_name"] == "Dense":
            found = probe_spec("Dense", layer["config"], shape, kernel.shape) \
                if shape[-1] == kernel.shape[0] else None
            why = f"a Linear over an input of shape {shape} per sample: not probed"
        elif len(shape) == 3:
            channels, height, width = shape
            found = probe_spec("Conv2D", {**layer["config"], "data_format": "channels_last"},
                               (height, width, channels), kernel.shape)
            why = "a Conv2d whose groups do not split its channels: not probed"
        else:
            why = f"a Conv2d over an input of shape {shape} per sample: not probed"
        if found is not None:
            orders[name] = found
        else:
            unrevealed[name] = why
    return checked, orders, unrevealed


def node_order_probe(precision: str):
    """order_probe (bitdrift.backends.Session) of a program's Linear or Conv2d call: its
    ATen op alone (aten.linear, aten.conv2d, as the eager program calls it), in this
    process (the device's threads and environment) and the device's precision, on a
    batch of ones, the probe's weights in torch's layout (a Conv2d's kernel OIHW, its
    input and output channels-first, the sums read back channels-last)."""
    import torch

    from bitdrift.analysis.accumulation.probes import probe_output
    from bitdrift.backends.torch_program.program import to_numpy, to_tensor, torch_dtype

    dtype = torch_dtype(precision)

    def make(spec: dict, batch: int):
        conv = spec["class_name"] == "Conv2D"
        if conv:
            height, width, channels = spec["input_shape"]
            ones = torch.ones((batch, channels, height, width), dtype=dtype)
            config = spec["config"]
            pads = [0, 0] if config["padding"] == "valid" else [
                (size - 1) * dilation // 2 for size, dilation in zip(
                    spec["kernel_shape"][:2], config["dilation_rate"], strict=True)]
        else:  # at the Linear's own input shape: (batch, terms) or (batch, ..., terms)
            ones = torch.ones((batch, *spec["input_shape"]), dtype=dtype)

        def call(kernel, bias):
            kernel = np.asarray(kernel).reshape(spec["kernel_shape"])
            weight = to_tensor(np.ascontiguousarray(
                kernel.transpose(3, 2, 0, 1) if conv else kernel.T))
            shift = to_tensor(np.asarray(bias)) if spec["use_bias"] else None
            with torch.no_grad():
                if conv:
                    out = torch.ops.aten.conv2d.default(
                        ones, weight, shift, config["strides"], pads, config["dilation_rate"],
                        int(config.get("groups", 1))).permute(0, 2, 3, 1)
                else:
                    out = torch.ops.aten.linear.default(ones, weight, shift)
            return probe_output(spec, to_numpy(out.contiguous()))

        return call

    return make


# The session of a model file of each format torch eager runs (bitdrift.runtimes)
SESSIONS = {"pt2": open_session, "onnx": open_onnx}

# -- a repro script's code (bitdrift.run.repro) ---------------------------------------------
SCRIPT_LAYER = None  # the script reads the weights as .npy
# A .pt2 program's Linear or Conv2d call alone, after the script's header (x, weights,
# BATCH): its ATen op, as the eager program calls it, the weights back in torch's layout
# (bitdrift.formats.pt2 gives a Linear's kernel transposed, a Conv2d's HWIO)
SCRIPT = '''import torch

{threads}


def tensor(array):
    if array.dtype.name == "bfloat16":  # numpy has no bfloat16: its raw bits
        return torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(array))


def array(value):
    return value.view(torch.int16).numpy() if value.dtype == torch.bfloat16 else value.numpy()


kernel = {kernel}
bias = tensor(weights[1]) if len(weights) > 1 else None
with torch.no_grad():
    out = np.concatenate([array(torch.ops.aten.{op}.default(
        tensor(x[start:start + BATCH]), kernel, bias{arguments}))
        for start in range(0, len(x), BATCH)])
'''
SCRIPT_OPS = {"Dense": "linear", "Conv2D": "conv2d"}  # the layers a script runs, as ATen ops


def script_code(device: dict, layer) -> str:
    threads = device.get("threads")
    config = layer.config
    if layer.class_name == "Dense":
        kernel, arguments = "tensor(weights[0].T)", ""
    else:
        kernel = "tensor(weights[0].transpose(3, 2, 0, 1))"
        pads = [0, 0] if config["padding"] == "valid" else [
            (size - 1) * rate // 2 for size, rate in zip(layer.weights[0].shape[:2],
                                                         config["dilation_rate"], strict=True)]
        arguments = (f", {list(config['strides'])}, {pads}, {list(config['dilation_rate'])}, "
                     f"{int(config['groups'])}")
    return SCRIPT.format(threads=f"torch.set_num_threads({threads})" if threads else "",
                         kernel=kernel, op=SCRIPT_OPS[layer.class_name], arguments=arguments)


def script_refusal(device: dict, layer) -> str | None:
    if layer.class_name not in SCRIPT_OPS:
        return (f"torch_export: the script runs a program's Linear and Conv2d calls; "
                f"{layer.layer!r} is {layer.class_name}")
    return None
