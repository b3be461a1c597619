"""PyTorch ``torch.export`` programs (``.pt2``, written by ``torch.export.save``): the file
loaded, its input signature read, and the program run eagerly with every module's output
recorded under the model's own name, its module path (``features.0``,
``encoder.layers.1.self_attn``), taken from ``torch.export``'s module stack
(``node.meta["nn_module_stack"]``).

A module's output is what the nodes it called hand on to the rest of the program: the
tensors made inside the module's call and used outside it. A module called twice is two
calls, the second named ``path@1`` (the stack's own key). A container whose output is its
last child's tensor (``nn.Sequential``) is recorded once, under the child, and listed in
``aliases``; a module that adds no node to the graph (``nn.Identity``, dropout in eval
mode) has no output to record. A module handing on several tensors records each as
``path:0``, ``path:1``.

The eager run is the program's own graph (``program.module()``) run node by node by
``torch.fx.Interpreter``: the same ATen calls, in the same order, as calling the program,
so its final output is that of ``program.module()(x)`` bit for bit. Each recorded output is
copied when its node has run, before any in-place node (``ReLU(inplace=True)`` exports as
``aten.relu_``) can change it.

The knobs a user switches: ``threads`` (``torch.set_num_threads``), ``precision`` (every
floating parameter, buffer and input cast to float16, bfloat16, float32 or float64),
``deterministic`` (``torch.use_deterministic_algorithms``). ISA caps and MKL's conditional
numerical reproducibility are read by the libraries from the environment when they first
start, so they are process-level: :func:`process_environment` gives the variables a runner
process must have set before it imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

# Reading a .pt2 file (its program, its module calls, its tensors as numpy) is the format's
# (bitdrift.formats.pt2); the runners here take them from there, under these names
from bitdrift.formats.pt2 import (  # noqa: F401
    ProgramError,
    _first_line,
    load_program,
    module_outputs,
    to_numpy,
)

PRECISIONS = ("float16", "bfloat16", "float32", "float64")
# The values each library accepts (oneDNN's, MKL's and ATen's documentation); anything
# else is ignored by the library without a word, so it is refused here.
ONEDNN_ISAS = ("ALL", "AVX512_CORE_AMX_FP16", "AVX512_CORE_AMX", "AVX512_CORE_FP16",
               "AVX512_CORE_BF16", "AVX512_CORE_VNNI", "AVX512_CORE", "AVX2_VNNI_2",
               "AVX2_VNNI", "AVX2", "AVX", "SSE41", "DEFAULT")
MKL_CBWR_BRANCHES = ("AUTO", "COMPATIBLE", "SSE2", "SSE3", "SSSE3", "SSE4_1", "SSE4_2", "AVX",
                     "AVX2", "AVX512_MIC", "AVX512", "AVX512_MIC_E1", "AVX512_E1")
ATEN_CAPABILITIES = ("default", "avx2", "avx512")


@dataclass(frozen=True)
class InputSpec:
    """One input the program takes: its placeholder's name, shape (None for a dynamic
    dimension), dtype (numpy's name; ``bfloat16`` as ml_dtypes names it) and the range
    of each dynamic dimension ({axis: (least, most)}, most None when unbounded)."""

    name: str
    shape: tuple
    dtype: str
    dynamic: dict = field(default_factory=dict)

    def describe(self) -> str:
        dims = ", ".join("?" if size is None else str(size) for size in self.shape)
        return f"({dims}{',' if len(self.shape) == 1 else ''}) {self.dtype}"


def dtype_name(dtype) -> str:
    """numpy's name of a torch dtype (``torch.float32`` -> ``float32``)."""
    return str(dtype).removeprefix("torch.")


def input_signature(program) -> list[InputSpec]:
    """The program's user inputs in call order (parameters and buffers left out)."""
    from torch.export.graph_signature import InputKind

    user = [spec.arg.name for spec in program.graph_signature.input_specs
            if spec.kind == InputKind.USER_INPUT]
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    signature = []
    for name in user:
        value = placeholders[name].meta.get("val")
        if not hasattr(value, "shape"):
            raise ProgramError(f"input {name!r} of the program is not a tensor ({value!r}): "
                               "bitdrift feeds arrays only")
        shape, dynamic = [], {}
        for axis, size in enumerate(value.shape):
            if isinstance(size, int):
                shape.append(size)
                continue
            shape.append(None)
            bounds = program.range_constraints.get(size.node.expr)
            dynamic[axis] = (0, None) if bounds is None else (
                _bound(bounds.lower) or 0, _bound(bounds.upper))
        signature.append(InputSpec(name, tuple(shape), dtype_name(value.dtype), dynamic))
    return signature


def _bound(value) -> int | None:
    """A range's end as an int; None for an unbounded one (torch's int_oo says it is a
    finite integer: it is compared, not asked)."""
    import sympy
    from torch.utils._sympy.numbers import int_oo

    return None if value in (int_oo, -int_oo, sympy.oo, -sympy.oo) else int(value)


def check_inputs(signature: list[InputSpec], arrays: list[np.ndarray], source: str) -> None:
    """ProgramError in one line naming ``source`` and both shapes/dtypes where the arrays
    are not what the signature takes (number, rank, fixed sizes, dynamic ranges, dtype)."""
    if len(arrays) != len(signature):
        raise ProgramError(f"{source}: {len(arrays)} input array(s) but the model takes "
                           f"{len(signature)}: {', '.join(s.describe() for s in signature)}")
    for spec, array in zip(signature, arrays, strict=True):
        given = f"{tuple(array.shape)} {array.dtype}"
        fits = (array.ndim == len(spec.shape) and str(array.dtype) == spec.dtype
                and all(size in (None, got)
                        for size, got in zip(spec.shape, array.shape, strict=False)))
        if not fits:
            raise ProgramError(f"{source}: input {spec.name!r} is {given} but the model takes "
                               f"{spec.describe()}")
        for axis, (least, most) in spec.dynamic.items():
            if array.shape[axis] < least or (most is not None and array.shape[axis] > most):
                raise ProgramError(f"{source}: input {spec.name!r} is {given} but the model's "
                                   f"dimension {axis} takes {least} to {most or 'any'}")


def node_layers(graph) -> dict[str, str]:
    """{node name: the recorded module call it runs in} (the innermost module of its
    stack, as module_outputs names it; a container's node under the call recorded for
    it): where a traced run's kernel lines belong (bitdrift.analysis.kernels). Nodes outside every
    recorded call (functions of the root module) are left out."""
    recorded, aliases = module_outputs(graph)
    names = {call.name for call in recorded}
    found = {}
    for node in graph.nodes:
        stack = list((node.meta.get("nn_module_stack") or {}).items()) \
            if node.op == "call_function" else []
        for key, (path, _) in reversed(stack):
            call = key.rsplit("@", 1)[1] if "@" in key else ""
            label = f"{path}@{call}" if call.isdigit() else path
            label = aliases.get(label, label)
            if label in names:
                found[node.name] = label
                break
    return found


def torch_dtype(precision: str):
    import torch

    if precision not in PRECISIONS:
        raise ProgramError(f"precision {precision!r}: torch programs run in "
                           f"{', '.join(PRECISIONS)}")
    return getattr(torch, precision)


def to_tensor(array: np.ndarray, precision: str | None = None):
    """An input array as a tensor; a floating one cast to ``precision`` when given."""
    import torch

    array = np.asarray(array)
    if array.dtype.name == "bfloat16":
        tensor = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(np.ascontiguousarray(array).copy())
    if precision is not None and tensor.is_floating_point():
        tensor = tensor.to(torch_dtype(precision))
    return tensor


def process_environment(onednn_max_cpu_isa: str | None = None, mkl_cbwr: str | None = None,
                        aten_cpu_capability: str | None = None) -> dict[str, str]:
    """The variables a torch runner's process needs set before it imports torch: oneDNN's
    ISA cap (convolutions, linear layers through oneDNN), MKL's conditional numerical
    reproducibility branch (``COMPATIBLE``, ``AVX2``, optionally ``,STRICT``) and ATen's
    own vectorised kernels' capability (element-wise ops, softmax, normalisation). Each
    library reads its variable once, at its first use, so a process whose torch already
    ran (a forked child) cannot change them: run such a device in a fresh process."""
    environment = {}
    if onednn_max_cpu_isa is not None:
        if onednn_max_cpu_isa.upper() not in ONEDNN_ISAS:
            raise ProgramError(f"ONEDNN_MAX_CPU_ISA {onednn_max_cpu_isa!r} is not one of "
                               f"oneDNN's: {', '.join(ONEDNN_ISAS)}")
        environment["ONEDNN_MAX_CPU_ISA"] = onednn_max_cpu_isa.upper()
    if mkl_cbwr is not None:
        branch, _, strict = mkl_cbwr.upper().partition(",")
        if branch not in MKL_CBWR_BRANCHES or strict not in ("", "STRICT"):
            raise ProgramError(f"MKL_CBWR {mkl_cbwr!r} is not one of MKL's branches "
                               f"({', '.join(MKL_CBWR_BRANCHES)}), optionally with ',STRICT'")
        environment["MKL_CBWR"] = mkl_cbwr.upper()
    if aten_cpu_capability is not None:
        if aten_cpu_capability.lower() not in ATEN_CAPABILITIES:
            raise ProgramError(f"ATEN_CPU_CAPABILITY {aten_cpu_capability!r} is not one of "
                               f"{', '.join(ATEN_CAPABILITIES)}")
        environment["ATEN_CPU_CAPABILITY"] = aten_cpu_capability.lower()
    return environment


def configure(threads: int | None = None, deterministic: bool | None = None) -> None:
    """torch's process-wide switches: intra-op threads and deterministic algorithms; None
    leaves the process's own setting."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    if deterministic is not None:
        torch.use_deterministic_algorithms(deterministic, warn_only=False)


def settings() -> dict:
    """What this process runs with, as torch sees it, for the record's fingerprint."""
    import torch

    return {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkldnn": torch.backends.mkldnn.is_available(),
            "mkl": torch.backends.mkl.is_available(),
            **{name.lower(): os.environ[name] for name in
               ("ONEDNN_MAX_CPU_ISA", "MKL_CBWR", "ATEN_CPU_CAPABILITY") if name in os.environ}}


@dataclass
class ProgramRun:
    """One run of a program on a batch: its outputs (flattened, in the program's order),
    and {module call: output} in topological order when the runner exposes per-layer
    outputs; ``per_layer`` False (with the reason in ``note``) when it does not, as a
    compiled graph does not. ``kernels``: the compiled code's kernel names, when known."""

    outputs: list[np.ndarray]
    layers: dict[str, np.ndarray]
    per_layer: bool
    note: str = ""
    kernels: list[str] | None = None


def cast_module(module, precision: str, source: str = "the program"):
    """``module`` with every floating parameter, buffer and constant in ``precision``.
    ``Module.to`` casts parameters and buffers only: the program's lifted constants (a
    tensor the model kept as a plain attribute) are attributes of the unlifted module, and
    one left in float32 would silently promote a float16 run back to float32."""
    import torch

    dtype = torch_dtype(precision)
    try:
        module = module.to(dtype)
        for submodule in module.modules():
            for name, value in list(vars(submodule).items()):
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    setattr(submodule, name, value.to(dtype))
    except RuntimeError as error:
        raise ProgramError(f"{source}: cannot cast to {precision}: {_first_line(error)}") from error
    return module


class EagerRunner:
    """A program run eagerly in this process, every module call's output recorded.

    ``layers``: the recorded names in topological order; ``aliases``: containers recorded
    under their last child; ``types``: {name: module class}. Calling it on the input arrays
    (the signature's order) gives a :class:`ProgramRun`; with ``record_layers`` False only
    the outputs (the program run as a user runs it, ``program.module()``)."""

    def __init__(self, program, *, precision: str = "float32", threads: int | None = None,
                 deterministic: bool | None = None, source: str = "the program",
                 mark=None):
        configure(threads, deterministic)
        # mark(event, layer): called around each node of a recorded call (a traced run)
        self.mark = mark
        self.source, self.precision = source, precision
        self.signature = input_signature(program)
        self.module = cast_module(program.module(), precision, source)
        recorded, self.aliases = module_outputs(self.module.graph)
        self.layers = [call.name for call in recorded]
        self.types = {call.name: call.module_type for call in recorded}
        self._names = {}
        for call in recorded:
            self._names.setdefault(call.node, []).append(call.name)
        self._marked = node_layers(self.module.graph) if mark is not None else {}

    def __call__(self, inputs: list[np.ndarray], record_layers: bool = True) -> ProgramRun:
        check_inputs(self.signature, inputs, self.source)
        return run_graph(self.module, [to_tensor(array, self.precision) for array in inputs],
                         self._names, self.layers, record_layers, self.source,
                         self.precision, marked=self._marked, mark=self.mark)


def run_graph(module, tensors: list, names: dict[str, list[str]], layers: list[str],
              record_layers: bool, source: str, precision: str, marked: dict | None = None,
              mark=None) -> ProgramRun:
    """An fx GraphModule called on ``tensors`` (its own forward), or, with
    ``record_layers``, run node by node by ``torch.fx.Interpreter`` (the same calls in the
    same order) with the value of each node named in ``names`` ({fx node: [recorded
    names]}) copied as it is made; ``layers`` in topological order. ``mark(edge, layer)``
    is called around each node ``marked`` maps to a layer ({fx node: layer}: the traced
    repeat's markers)."""
    import torch
    import torch.utils._pytree as pytree

    captured: dict[str, np.ndarray] = {}

    marked = marked or {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node):
            layer = marked.get(node.name)
            if layer is not None:
                mark("begin", layer)
            try:
                value = super().run_node(node)
            finally:
                if layer is not None:
                    mark("end", layer)
            for name in names.get(node.name, ()):
                captured[name] = to_numpy(value)  # a copy, before any in-place node
            return value

    try:
        with torch.no_grad():
            if record_layers:
                result = Recorder(module).run(*tensors)
            else:
                result = module(*tensors)
    except (RuntimeError, TypeError, ValueError) as error:
        raise ProgramError(f"{source}: the program fails in {precision}: "
                           f"{_first_line(error)}") from error
    outputs = [to_numpy(leaf) for leaf in pytree.tree_leaves(result)]
    found = {name: captured[name] for name in layers if name in captured}
    return ProgramRun(outputs, found, per_layer=record_layers)
