"""``torch.compile`` of a torch.export program: Inductor's CPU C++ code generation, as a
device family whose options are the device's knobs.

A compiled graph fuses the program's nodes into generated kernels, so it has no per-module
outputs: a run records the program's final outputs only, and says so (``per_layer``
False, the reason in ``note``). What it does record instead is the compiled code's kernel
signature: the names of Inductor's generated C++ kernels (``cpp_fused_<ops>_<n>``) and of
the library kernels its code calls (``extern_kernels.addmm``, ``torch.ops.mkldnn...``), in
the order the code defines or first calls them; a traced repeat compares those.

Options (each a device): ``default``; ``max-autotune`` (Inductor benchmarks the
candidate kernels of each matmul and convolution and keeps the fastest, so which kernel
runs may change between processes; on a CPU there are no CUDA graphs, so it is the
``max-autotune-no-cudagraphs`` mode's options); ``freezing`` (parameters folded into the
graph as constants, which lets Inductor pre-pack weights for oneDNN and fold batch norm
into convolutions). The options combine.
"""

from __future__ import annotations

import re

import numpy as np

from bitdrift.backends.torch_program.program import (
    ProgramError,
    ProgramRun,
    _first_line,
    cast_module,
    check_inputs,
    configure,
    input_signature,
    to_numpy,
    to_tensor,
)

OPTIONS = {"default": {}, "max-autotune": {"max_autotune": True}, "freezing": {"freezing": True}}
NO_LAYERS = ("torch.compile (Inductor) fuses the program into generated kernels: it "
             "exposes no per-layer outputs, the final output alone is recorded")
# What names a kernel in Inductor's generated Python wrapper: its own C++ kernels and the
# library calls it makes (aten fallbacks, extern_kernels' BLAS/oneDNN calls, mkldnn ops)
KERNEL = re.compile(r"\b(cpp_fused_\w+|extern_kernels\.\w+|torch\.ops\.\w+\.\w+(?:\.\w+)?)"
                    r"(?=\s*\()")


def inductor_options(options: list[str] | tuple[str, ...] = ("default",)) -> dict:
    """Inductor's config patches for a device's options (names from OPTIONS)."""
    patches = {}
    for option in options:
        if option not in OPTIONS:
            raise ProgramError(f"torch.compile option {option!r}: bitdrift has "
                               f"{', '.join(OPTIONS)}")
        patches.update(OPTIONS[option])
    return patches


def kernel_names(code: str) -> list[str]:
    """The kernels Inductor's generated wrapper code defines or calls, first use first,
    each once."""
    return list(dict.fromkeys(KERNEL.findall(code)))


class CompiledRunner:
    """A program compiled by ``torch.compile`` (backend ``inductor``) with ``options``;
    compiled at the first call, whose generated code gives ``kernels``. Calling it on the
    input arrays gives a :class:`ProgramRun` with the final outputs only."""

    def __init__(self, program, *, options=("default",), precision: str = "float32",
                 threads: int | None = None, deterministic: bool | None = None,
                 source: str = "the program", march: str | None = None):
        import torch

        configure(threads, deterministic)
        self.source, self.precision = source, precision
        self.options = tuple(options)
        self.signature = input_signature(program)
        torch._dynamo.reset()  # a new compile, not one another runner in this process made
        module = cast_module(program.module(), precision, source)
        # Set as Inductor's config around every call, not torch.compile's options=: those
        # are applied after the decision to freeze, so freezing through them does nothing
        # (measured: the same kernels as default, parameters still inputs of the code)
        self.patches = inductor_options(self.options)
        if march:  # an emulated CPU's: gcc's -march=native would be the host's
            self.patches["cpp.march"] = march
        self.compiled = torch.compile(module, backend="inductor")
        self.kernels: list[str] | None = None

    def __call__(self, inputs: list[np.ndarray]) -> ProgramRun:
        import torch
        import torch.utils._pytree as pytree
        from torch._inductor.utils import run_and_get_code

        check_inputs(self.signature, inputs, self.source)
        tensors = [to_tensor(array, self.precision) for array in inputs]
        try:
            # freezing folds parameters only in inference
            with torch.no_grad(), torch._inductor.config.patch(self.patches):
                if self.kernels is None:
                    result, codes = run_and_get_code(self.compiled, *tensors)
                    self.kernels = [name for code in codes for name in kernel_names(code)]
                else:
                    result = self.compiled(*tensors)
        except Exception as error:  # Dynamo, Inductor and the C++ compiler raise their own
            raise ProgramError(f"{self.source}: torch.compile (Inductor, options "
                               f"{', '.join(self.options)}) fails: {_first_line(error)}"
                               ) from error
        outputs = [to_numpy(leaf) for leaf in pytree.tree_leaves(result)]
        return ProgramRun(outputs, {}, per_layer=False, note=NO_LAYERS,
                          kernels=list(self.kernels))


# The runtime `torch_inductor` (bitdrift.backends): a .pt2 program compiled per repeat
# process with the device's `inductor_options`; everything but the session is
# torch_export's.
NAME = "torch_inductor"
TRAINS = False
PREFORK = False  # a compile per fresh process, as a user's process compiles


def _shared():
    from bitdrift.backends.torch_program import eager as torch_export

    return torch_export


def environment(device: dict) -> dict:
    return _shared().environment(device)


def preimport() -> None:
    _shared().preimport()


def import_keras():
    return _shared().import_keras()


def configure_threads(threads: int | None) -> None:
    _shared().configure_threads(threads)


def configure_determinism(deterministic: bool) -> None:
    _shared().configure_determinism(deterministic)


def check_accelerator(name: str, device: dict) -> dict:
    from bitdrift.emulation.cpus import gcc_march

    accelerator = {**_shared().check_accelerator(name, device),
                   "inductor_options": list(device.get("inductor_options") or ["default"])}
    march = gcc_march(device.get("emulate"))
    return {**accelerator, "cpp_march": march} if march else accelerator


def strategy_scope(accelerator: dict):
    return _shared().strategy_scope(accelerator)


def versions() -> dict:
    return _shared().versions()


def trace_environment(device: dict) -> None:
    """None: the generated kernels' names are in the fingerprint (``compiled_kernels``),
    since a compiled graph has no per-layer calls to map them to."""
    return None


def open_session(job: dict, name: str):
    """The program compiled by Inductor with the device's options; its final output only."""
    from bitdrift.errors import InferenceError

    device = job["device"]
    accelerator = check_accelerator(name, device)
    try:
        program = _shared().load(job)
        runner = CompiledRunner(program, options=accelerator["inductor_options"],
                                precision=device["precision"], threads=device.get("threads"),
                                deterministic=device.get("deterministic"),
                                source=job["model_path"], march=accelerator.get("cpp_march"))
    except ProgramError as error:
        raise InferenceError(f"device {name!r}: {error}") from error

    def call(inputs):
        try:
            return runner(inputs)
        except ProgramError as error:
            raise InferenceError(f"device {name!r}: {error}") from error

    return _shared().session_from_runner(
        call, name, accelerator, note=NO_LAYERS,
        unrevealed=_shared().compiled_unrevealed(program, "torch.compile (Inductor)"))


# The session of a model file of each format this runtime runs (bitdrift.runtimes)
SESSIONS = {"pt2": open_session}
# No repro script (bitdrift.run.repro): the compiled program's node alone is not what ran
script_code = None
SCRIPT_LAYER = None


def script_refusal(device: dict, layer) -> str | None:
    return None
