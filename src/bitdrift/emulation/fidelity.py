"""Is QEMU's emulation of a CPU faithful? Small kernels run natively with the library forced
to the kernels of that CPU class (OpenBLAS's OPENBLAS_CORETYPE, oneDNN's
ONEDNN_MAX_CPU_ISA, MKL's MKL_ENABLE_INSTRUCTIONS) and under emulation of a CPU of that
class, and their output bits are compared. A mismatch is an error naming the kernel and
the models: an emulated device would not compute what the real CPU computes.

ONNX Runtime's MLAS has no switch to force an instruction set: its kernel is compared with
the host's own, as information (equal or not), never as a verdict.

Each kernel runs in a process of its own (the libraries pick their kernels once per
process) and prints the SHA-256 of its output's bytes; its inputs are drawn from a fixed
seed, so every process computes on the same numbers.
"""

from __future__ import annotations

import os
import subprocess
import sys

from bitdrift.errors import StudyError

# cifar10_small's layers that torch computes with MKL's sgemm on a CPU (its first
# convolution, 3 input channels, as im2col and sgemm; its Dense layers), at batch 1:
# (kind, input shape, weight shape as torch holds it)
MODEL_MKL_LAYERS = (("conv2d", (1, 3, 32, 32), (3, 3, 3, 3)),
                    ("linear", (1, 320), (128, 320)),
                    ("linear", (1, 128), (128, 128)),
                    ("linear", (1, 128), (10, 128)))
# kernel -> (library, Python code printing the digest of its output)
KERNELS = {
    "openblas_sgemm": ("OpenBLAS (numpy)", """
import numpy as np
rng = np.random.default_rng(0)
a = rng.standard_normal((64, 320)).astype(np.float32)
b = rng.standard_normal((320, 128)).astype(np.float32)
out = a @ b
"""),
    # torch sends this convolution to oneDNN (cifar10_small's second one); a 16->32 channel
    # 3x3 one it computes as im2col and MKL's sgemm instead
    "onednn_torch_conv": ("oneDNN (torch)", """
import numpy as np, torch
rng = np.random.default_rng(0)
x = torch.from_numpy(rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
w = torch.from_numpy(rng.standard_normal((5, 3, 5, 5)).astype(np.float32))
out = torch.nn.functional.conv2d(x, w, padding=2).numpy()
"""),
    # MKL at the default model's shapes (cifar10_small, batch 1: MODEL_MKL_LAYERS), where
    # torch's device runs it: a 64x320 @ 320x128 sgemm gave an AMD host's bits under an
    # emulated Haswell while the model's layers did not (a Zen 4 EPYC, 2026-11-26)
    "mkl_torch_sgemm": ("MKL (torch)", """
import numpy as np, torch
rng = np.random.default_rng(0)
def draw(*shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))
outs = []
for kind, x, w in LAYERS:
    if kind == "conv2d":
        outs.append(torch.nn.functional.conv2d(draw(*x), draw(*w), draw(w[0]),
                                               padding=w[-1] // 2))
    else:
        outs.append(torch.nn.functional.linear(draw(*x), draw(*w), draw(w[0])))
out = np.concatenate([o.numpy().ravel() for o in outs])
"""),
    # TensorFlow decides from CPUID whether to use oneDNN at all (under an emulated Haswell
    # it does not, and runs Eigen): switched on here, so the check compares oneDNN's kernel
    "onednn_tensorflow_conv": ("oneDNN (TensorFlow)", """
import os
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
import numpy as np, tensorflow as tf
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 32, 32, 16)).astype(np.float32)
w = rng.standard_normal((3, 3, 16, 32)).astype(np.float32)
out = tf.nn.conv2d(x, w, strides=1, padding="SAME").numpy()
"""),
    "mlas_onnxruntime_conv": ("MLAS (ONNX Runtime)", """
import numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 16, 32, 32)).astype(np.float32)
w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
graph = helper.make_graph(
    [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.flatten())])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(model.SerializeToString(), options,
                               providers=["CPUExecutionProvider"])
out = session.run(None, {"x": x})[0]
"""),
}
DIGEST = "\nimport hashlib\nprint('digest', hashlib.sha256(out.tobytes()).hexdigest())\n"
# Emulated model -> how the host forces each library to that CPU class's kernels
# (None: the library has no such switch).
CLASSES = {
    "Haswell-v4": {"openblas": "Haswell", "onednn": "AVX2", "mkl": "AVX2"},
    "SandyBridge-v2": {"openblas": "Sandybridge", "onednn": "AVX", "mkl": "AVX"},
    "Nehalem-v2": {"openblas": "Nehalem", "onednn": "SSE41", "mkl": "SSE4_2"},
    # AMD's AVX2 class (Zen 2): OpenBLAS runs its Haswell kernel there, as on a real Zen 2
    "EPYC-Rome-v2": {"openblas": "Haswell", "onednn": "AVX2", "mkl": "AVX2"},
}
# Libraries whose kernel also follows the CPU's vendor (its vendor string, or the cache
# sizes read through vendor-specific CPUID leaves), not only the instruction sets: a host
# forced to a class is a reference only for an emulated model of the host's own vendor.
VENDOR_DEPENDENT = ("onednn_tensorflow", "mkl")


def model_vendor(model: str) -> str:
    """The vendor QEMU's CPUID reports for ``model``."""
    return "AuthenticAMD" if model.startswith(("EPYC", "Opteron")) else \
        "HygonGenuine" if model.startswith("Dhyana") else "GenuineIntel"
COLUMNS = ["kernel", "library", "emulated", "forced", "native_forced", "emulated_digest",
           "host_digest", "equal", "verdict"]


def _forcing(kernel: str, model: str) -> dict | None:
    """The environment that forces the host to ``model``'s class of kernels, or None."""
    if kernel.startswith("openblas"):
        return {"OPENBLAS_CORETYPE": CLASSES[model]["openblas"]}
    if kernel.startswith("onednn"):
        return {"ONEDNN_MAX_CPU_ISA": CLASSES[model]["onednn"]}
    if kernel.startswith("mkl"):
        return {"MKL_ENABLE_INSTRUCTIONS": CLASSES[model]["mkl"]}
    return None


def digest(kernel: str, environment: dict | None = None, emulate: str | None = None) -> str:
    """The SHA-256 of ``kernel``'s output, computed in a fresh process (under QEMU for
    ``emulate``) with ``environment`` added."""
    from bitdrift.emulation.cpus import python_command  # only when a kernel runs

    code = f"LAYERS = {MODEL_MKL_LAYERS!r}\n" + KERNELS[kernel][1] + DIGEST
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
           **(environment or {})}
    done = subprocess.run([*python_command({"emulate": emulate}), "-c", code], capture_output=True,
                          text=True, env=env, timeout=900)
    found = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("digest ")]
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        where = f"under {emulate}" if emulate else "natively"
        raise StudyError(f"emulation check: kernel {kernel} failed {where} (exit "
                         f"{done.returncode}: {last[:200]})")
    return found[0]


def host_vendor() -> str:
    """The host CPU's vendor (``GenuineIntel``, ``AuthenticAMD``), from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next((line.split(":", 1)[1].strip() for line in cpuinfo
                         if line.startswith("vendor_id")), "")
    except OSError:
        return ""


NO_REFERENCE = "no native reference"


def judge(kernel: str, model: str, forcing: dict | None, native: str | None, emulated: str,
          host: str, vendor: str) -> str:
    """The verdict on one kernel under one emulated model, from its digests: ``native``
    (the host forced to the model's class; None: no switch), ``emulated`` and ``host``
    (the host's own kernel).

    A forced run that gives the host's own bits is no reference: the switch had no effect
    on this host (MKL's caps on an AMD CPU, a cap at or above what the host has), or none
    on this kernel at these shapes, and equal bits at one shape would prove nothing. A
    kernel that follows the vendor is no reference for a model of another vendor, equal
    or not."""
    if native is None:
        return "equals the host's kernel" if emulated == host else \
            "differs from the host's kernel"
    switch = " ".join(f"{key}={value}" for key, value in (forcing or {}).items())
    if native == host:
        why = (f"MKL's instruction caps have no effect on this {vendor} CPU"
               if kernel.startswith("mkl") and vendor != "GenuineIntel" else
               "the switch has no effect on this host, or none on this kernel at these "
               "shapes")
        return f"{NO_REFERENCE}: with {switch} the host gives its own bits ({why})"
    if kernel.startswith(VENDOR_DEPENDENT) and model_vendor(model) != vendor:
        # Seen on two AMD EPYCs (Zen 3, Zen 4): TensorFlow's oneDNN capped at AVX2 gives
        # other bits than under an emulated (Intel) Haswell, which gives a real Intel's
        # bits; an emulated AMD Zen 2 gives the AMD host's bits
        return (f"{NO_REFERENCE}: the kernel follows the vendor, and this {vendor} host is "
                f"not {model}'s {model_vendor(model)}")
    return "faithful" if emulated == native else "MISMATCH"


def check(kernels: list[str], models: list[str], log=None) -> list[dict]:
    """The table of the check (COLUMNS); a forced kernel whose emulated bits differ from the
    host forced to the same class raises StudyError naming the kernel and the model,
    after the table is complete."""
    log = log or sys.stderr  # looked up at the call: a test's captured stream changes
    unknown = [model for model in models if model not in CLASSES]
    if unknown:
        raise StudyError(f"emulation check: no forcing settings for {', '.join(unknown)} "
                         f"(known: {', '.join(CLASSES)})")
    rows, host = [], {}
    for kernel in kernels:
        host[kernel] = digest(kernel)
        for model in models:
            if kernel.startswith("onednn_tensorflow") and model == "Nehalem-v2":
                continue  # TensorFlow's wheel needs AVX: it cannot run there at all
            forcing = _forcing(kernel, model)
            emulated = digest(kernel, emulate=model)
            native = digest(kernel, forcing) if forcing is not None else None
            equal = emulated == (native if native is not None else host[kernel])
            verdict = judge(kernel, model, forcing, native, emulated, host[kernel],
                            host_vendor())
            rows.append({"kernel": kernel, "library": KERNELS[kernel][0], "emulated": model,
                         "forced": " ".join(f"{k}={v}" for k, v in (forcing or {}).items())
                         or "no switch: the host's own kernel",
                         "native_forced": (native or "")[:16],
                         "emulated_digest": emulated[:16], "host_digest": host[kernel][:16],
                         "equal": equal, "verdict": verdict})
            print(f"bitdrift: emulation check: {kernel} on {model}: {verdict}", file=log,
                  flush=True)
    mismatches = [row for row in rows if row["verdict"] == "MISMATCH"]
    if mismatches:
        raise MismatchError(rows, "; ".join(f"{row['kernel']} under {row['emulated']} differs "
                                            f"from the host with {row['forced']}"
                                            for row in mismatches))
    return rows


class MismatchError(StudyError):
    """An emulated kernel that does not compute what the host forced to its class does."""

    def __init__(self, rows: list[dict], what: str):
        super().__init__(f"emulation check: emulation is not faithful: {what}")
        self.rows = rows

