"""ExecuTorch with its XNNPACK backend running a .pt2 program lowered by
``torch_conversions.to_executorch``
(bitdrift.backends.torch_program.executorch_runner.ExecuTorchRunner)
in each repeat's process: the final output only (a delegated partition is one opaque
call), float32; the converter and its versions in the fingerprint. A program the lowering
refuses fails this device alone, its reason in the failure record."""

from __future__ import annotations

from bitdrift.backends.torch_program.eager import (  # noqa: F401  (the rest of the interface)
    configure_determinism,
    configure_threads,
    environment,
    import_keras,
    preimport,
    strategy_scope,
)
from bitdrift.errors import AcceleratorMissing, InferenceError

NAME = "executorch"
TRAINS = False
PREFORK = False


def check_accelerator(name: str, device: dict) -> dict:
    if device["accelerator"] != "cpu":
        raise AcceleratorMissing(f"device {name!r}: ExecuTorch runs on the CPU here, not a "
                                 f"{device['accelerator'].upper()}; refusing to fall back")
    return {"accelerator": "cpu", "model_format": "pt2", "delegate": "xnnpack"}


def versions() -> dict:
    from bitdrift.backends.torch_program.conversions import package_versions

    return package_versions("executorch", "torch")


def trace_environment(device: dict) -> None:
    return None


def open_session(job: dict, name: str):
    import os
    import tempfile

    from bitdrift.backends.torch_program.conversions import to_executorch
    from bitdrift.backends.torch_program.eager import compiled_unrevealed, load, session_from_runner
    from bitdrift.backends.torch_program.executorch_runner import NO_LAYERS, ExecuTorchRunner
    from bitdrift.backends.torch_program.program import ProgramError, input_signature

    device = job["device"]
    accelerator = check_accelerator(name, device)
    program = load(job)
    handle, pte = tempfile.mkstemp(suffix=".pte")
    os.close(handle)
    try:
        conversion = to_executorch(program, pte)
        accelerator.update(conversion.fingerprint())
        runner = ExecuTorchRunner(pte, input_signature(program), threads=device.get("threads"),
                                  source=job["model_path"])
    except ProgramError as error:
        raise InferenceError(f"device {name!r}: {error}") from error
    finally:  # loaded (a worker ends by os._exit: no atexit would remove it)
        os.unlink(pte)

    def call(inputs):
        try:
            return runner(inputs)
        except ProgramError as error:
            raise InferenceError(f"device {name!r}: {error}") from error

    return session_from_runner(call, name, accelerator, note=NO_LAYERS,
                               unrevealed=compiled_unrevealed(program, "ExecuTorch (XNNPACK)"))


# The session of a model file of each format this runtime runs (bitdrift.runtimes)
SESSIONS = {"pt2": open_session}
# No repro script (bitdrift.run.repro): the compiled program's node alone is not what ran
script_code = None
SCRIPT_LAYER = None


def script_refusal(device: dict, layer) -> str | None:
    return None
