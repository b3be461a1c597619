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
    "mkl_torch_sgemm": ("MKL (torch)", """
import numpy as np, torch
rng = np.random.default_rng(0)
a = torch.from_numpy(rng.standard_normal((64, 320)).astype(np.float32))
b = torch.from_numpy(rng.standard_normal((320, 128)).astype(np.float32))
out = (a @ b).numpy()
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
    from bitdrift.emulation import python_command  # only when a kernel runs

    code = KERNELS[kernel][1] + DIGEST
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
            verdict = ("faithful" if equal else "MISMATCH") if native is not None else \
                ("equals the host's kernel" if equal else "differs from the host's kernel")
            if verdict == "MISMATCH" and kernel.startswith("mkl") and \
                    native == host[kernel] and host_vendor() != "GenuineIntel":
                # Seen on an AMD EPYC: MKL ignores MKL_ENABLE_INSTRUCTIONS there, so the
                # host cannot be forced and nothing native says what the class computes
                verdict = "no native reference: MKL's instruction caps act on Intel CPUs only"
            elif verdict == "MISMATCH" and kernel.startswith(VENDOR_DEPENDENT) and \
                    model_vendor(model) != host_vendor():
                # Seen on two AMD EPYCs (Zen 3, Zen 4): TensorFlow's oneDNN capped at AVX2
                # gives other bits than under an emulated (Intel) Haswell, which gives a
                # real Intel's bits; an emulated AMD Zen 2 gives the AMD host's bits
                verdict = (f"no native reference: the kernel follows the vendor, and this "
                           f"{host_vendor()} host is not {model}'s {model_vendor(model)}")
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

