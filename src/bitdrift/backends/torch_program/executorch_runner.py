"""ExecuTorch (``.pte``, lowered by ``torch_conversions.to_executorch``) run in this
process by ExecuTorch's own runtime (its Python bindings), XNNPACK doing the delegated
partitions.

A delegated partition is one opaque call into XNNPACK, so a run has no per-layer outputs:
it records the program's final outputs and says so (``per_layer`` False). ``threads`` sets
ExecuTorch's thread pool, which XNNPACK's kernels share; the partition each kernel runs in
is XNNPACK's choice for this CPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bitdrift.backends.torch_program.program import (
    InputSpec,
    ProgramError,
    ProgramRun,
    _first_line,
    check_inputs,
    to_numpy,
    to_tensor,
)

NO_LAYERS = ("ExecuTorch runs each XNNPACK partition as one delegated call: it exposes no "
             "per-layer outputs, the final output alone is recorded")


class ExecuTorchRunner:
    """The ``.pte`` at ``path``, loaded by ExecuTorch's runtime; calling it on the input
    arrays (``signature``: the program's, torch_program.input_signature) gives a
    :class:`ProgramRun` with the final outputs only."""

    def __init__(self, path: str | Path, signature: list[InputSpec], *,
                 threads: int | None = None, source: str | None = None):
        self.source = source or str(path)
        self.signature = signature
        try:
            from executorch.extension.pybindings import portable_lib
            from executorch.runtime import Runtime

            if threads:
                portable_lib._unsafe_reset_threadpool(threads)
            self.threads = portable_lib._threadpool_get_thread_count()
            runtime = Runtime.get()
            self.backends = list(runtime.backend_registry.registered_backend_names)
            self.method = runtime.load_program(Path(path)).load_method("forward")
        except ImportError as error:
            raise ProgramError(f"{self.source}: ExecuTorch is not installed (pip install "
                               "executorch; it is in requirements.txt)") from error
        except Exception as error:  # the runtime's loader: a damaged or foreign .pte
            raise ProgramError(f"{self.source}: ExecuTorch cannot load the program: "
                               f"{_first_line(error)}") from error

    def __call__(self, inputs: list[np.ndarray]) -> ProgramRun:
        check_inputs(self.signature, inputs, self.source)
        try:
            results = self.method.execute([to_tensor(array) for array in inputs])
        except Exception as error:  # the runtime reports a failed kernel as RuntimeError
            raise ProgramError(f"{self.source}: ExecuTorch fails: {_first_line(error)}"
                               ) from error
        return ProgramRun([to_numpy(result) for result in results], {}, per_layer=False,
                          note=NO_LAYERS)
