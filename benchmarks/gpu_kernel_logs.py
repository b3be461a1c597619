"""Check on demand, on a machine with an NVIDIA GPU: what cuDNN and cuBLAS log for a torch
layer, under which logging variables, and what bitdrift.analysis.kernels reads from it.

    python benchmarks/gpu_kernel_logs.py ASSETS OUT

A traced repeat of a torch GPU device logged no cuDNN or cuBLASLt call on an NVIDIA H200
(docs/benchmarks.md). This runs the same layer calls in fresh processes under several sets
of logging variables and two ways of ending the process (a normal exit, and bitdrift's
flush-then-``os._exit``), keeps each one's raw stdout and stderr in OUT, and writes
``result.json``: per variant, the lines each library wrote and the kernel calls per layer
that ``bitdrift.analysis.kernels.parse_trace`` finds. The layers: a Conv2D, a Dense with bias and a
bare matmul in plain torch, and, where Keras is importable, every layer of ASSETS'
``small.keras`` marked by ``keras_common.mark_layers`` (the traced repeat's own markers).
With ``--infer`` or ``--infer-only`` (ASSETS also holding ``digits.h5``) it then runs
the whole inference job of a torch GPU device with its traced repeat, as the workflow
does, and adds the record's kernel signatures per layer (``infer``) or the job's error.

Run on an NVIDIA H100 (2026-11-26; torch 2.11, CUDA 13.0, cuDNN 9.19): every variable set
logged (15,131 cuDNN and 50 cuBLASLt lines on stdout with bitdrift's own), with either
ending; the parser was what read nothing (it knew neither ``engine_id`` nor cuBLAS's
``cublasLtSSSMatmul``). The captured log is ``tests/data/kernels/h100_torch_traced.log.xz``.
Then on an NVIDIA H200, ``--infer-only`` with the parser mended: the job wrote its record
with a kernel signature for every compute layer (docs/benchmarks.md).
"""

import ctypes
import json
import os
import re
import subprocess
import sys
from pathlib import Path

VARIANTS = {
    # bitdrift.backends.gpu.KERNEL_LOG_ENVIRONMENT as it stands
    "project": {"CUDNN_LOGLEVEL_DBG": "3", "CUDNN_LOGDEST_DBG": "stdout",
                "CUBLASLT_LOG_LEVEL": "5"},
    # and cuBLAS's own API log (torch's plain GEMMs go to cuBLAS, not cuBLASLt)
    "with_cublas": {"CUDNN_LOGLEVEL_DBG": "3", "CUDNN_LOGDEST_DBG": "stdout",
                    "CUBLASLT_LOG_LEVEL": "5", "CUBLAS_LOGINFO_DBG": "1",
                    "CUBLAS_LOGDEST_DBG": "stdout"},
    # cuDNN 8's variable names
    "cudnn8_names": {"CUDNN_LOGINFO_DBG": "1", "CUDNN_LOGDEST_DBG": "stdout",
                     "CUBLASLT_LOG_LEVEL": "5", "CUBLAS_LOGINFO_DBG": "1",
                     "CUBLAS_LOGDEST_DBG": "stdout"},
    # every library to stderr (is it the stream, or nothing logged at all?); the markers
    # stay on stdout, so only its line counts say something, not its layers
    "stderr": {"CUDNN_LOGLEVEL_DBG": "3", "CUDNN_LOGDEST_DBG": "stderr",
               "CUBLASLT_LOG_LEVEL": "5", "CUBLASLT_LOG_FILE": "/dev/stderr",
               "CUBLAS_LOGINFO_DBG": "1", "CUBLAS_LOGDEST_DBG": "stderr"},
}
LIBRARY_LINES = {"cudnn": re.compile(r"cudnn", re.I), "cublasLt": re.compile(r"\[cublasLt\]"),
                 "cublas": re.compile(r"cublas(?!Lt)", re.I),
                 "markers": re.compile(r"^bitdrift-layer,")}


def child(assets: Path) -> None:
    """The layer calls, in this fresh process, ending as the variant says."""
    import torch
    import torch.nn.functional as F

    printf = ctypes.CDLL(None).printf

    def marked(name, call):
        printf(b"%s\n", f"bitdrift-layer,begin,{name}".encode())
        try:
            return call()
        finally:
            torch.cuda.synchronize()
            printf(b"%s\n", f"bitdrift-layer,end,{name}".encode())

    torch.manual_seed(0)
    cuda = torch.device("cuda")
    images = torch.randn(4, 3, 16, 16, device=cuda)
    kernel = torch.randn(8, 3, 3, 3, device=cuda)
    features = torch.randn(4, 64, device=cuda)
    weight, bias = torch.randn(10, 64, device=cuda), torch.randn(10, device=cuda)
    marked("torch_conv2d", lambda: F.conv2d(images, kernel, padding=1))
    marked("torch_dense", lambda: F.linear(features, weight, bias))
    marked("torch_matmul", lambda: features @ weight.T)
    try:
        os.environ["KERAS_BACKEND"] = "torch"
        import keras

        from bitdrift.backends.keras.common import mark_layers
    except ImportError as error:
        print(f"no keras model: {error}", file=sys.stderr)
    else:
        model = keras.saving.load_model(assets / "small.keras", compile=False)
        mark_layers(model)
        shape = (3, *model.input_shape[1:])
        model(torch.zeros(shape, device=cuda), training=False)
        torch.cuda.synchronize()
    print(f"torch {torch.__version__} cuda {torch.version.cuda} "
          f"cudnn {torch.backends.cudnn.version()} {torch.cuda.get_device_name()}",
          file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    if os.environ["GPU_KERNEL_LOGS_END"] == "_exit":  # as bitdrift's workers end
        ctypes.CDLL(None).fflush(None)
        os._exit(0)


def main(assets: Path, out: Path) -> None:
    from bitdrift.analysis.kernels import parse_trace

    out.mkdir(parents=True, exist_ok=True)
    result = {}
    runs = [(name, end) for name in VARIANTS for end in ("_exit",)] + [("project", "exit")]
    if "--infer-only" in sys.argv:
        runs = []
    for name, end in runs:
        label = f"{name}.{end}"
        env = {**os.environ, **VARIANTS[name], "GPU_KERNEL_LOGS_END": end}
        try:
            done = subprocess.run([sys.executable, __file__, "--child", str(assets)],
                                  env=env, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired as expired:
            done = subprocess.CompletedProcess(expired.cmd, "timed out",
                                               _text(expired.stdout), _text(expired.stderr))
        (out / f"{label}.stdout").write_text(done.stdout)
        (out / f"{label}.stderr").write_text(done.stderr)
        trace = parse_trace(done.stdout + "\n" + done.stderr)
        result[label] = {
            "returncode": done.returncode,
            "lines": {stream: {library: sum(bool(pattern.search(line))
                                            for line in text.splitlines())
                               for library, pattern in LIBRARY_LINES.items()}
                      for stream, text in (("stdout", done.stdout),
                                           ("stderr", done.stderr))},
            "parsed": {layer: sorted({call.implementation for call in calls})
                       for layer, calls in trace.layers.items()},
            "raw": len(trace.raw), "outside": trace.outside,
            "versions": done.stderr.strip().splitlines()[-1:] if done.stderr else []}
        print(label, json.dumps(result[label]["lines"]), flush=True)
    if "--infer" in sys.argv or "--infer-only" in sys.argv:
        result["infer"] = inference_job(assets, out)
        print("infer", json.dumps(result["infer"]), flush=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def inference_job(assets: Path, out: Path) -> dict:
    """The default torch device on the GPU, its inference job with the traced repeat."""
    from bitdrift.config import load_config
    from bitdrift.record.reader import open_records
    from bitdrift.run.inference import infer

    device = load_config(Path(__file__).parents[1] / "config.yaml")["devices"][
        "torch_1thread"] | {"accelerator": "gpu"}
    try:
        with open(out / "infer.log", "w") as log:
            infer(model_name="small", device_name="torch_gpu", device=device,
                  model_path=assets / "small.keras", dataset_path=assets / "digits.h5",
                  samples=[0, 3, 5], out=out / "record.h5", layers=True, reference=None,
                  export=None, kernels=True, log=log)
        (record,) = open_records([out / "record.h5"])
        return {layer: entry["signature"] for layer, entry in record.kernels["layers"].items()}
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"[:1500]}


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(Path(sys.argv[2]))
    else:
        main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
