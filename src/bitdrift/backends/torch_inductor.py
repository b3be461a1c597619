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

from bitdrift.backends.torch_program import (
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
                 source: str = "the program"):
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
