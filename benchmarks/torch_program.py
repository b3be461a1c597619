"""Benchmark: what each way of running a torch.export program costs (run on demand).

    python benchmarks/torch_program.py

The small CNN of tests/unit/test_torch_program.py (batch norm, a depthwise convolution),
exported with a dynamic batch; and a 64 -> 128 -> 64 MLP (GELU), batch 32, where Inductor's
CPU GEMM templates can compete. Each row is a fresh process with an empty Inductor cache
(TORCHINDUCTOR_CACHE_DIR in a new folder), so a compile is a cold one: the seconds the
first call or the conversion takes, the largest difference from the eager output, and the
kernels Inductor's generated code names. Printed as a Markdown table with the CPU named;
docs/pytorch-models.md quotes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

CODE = """
import json, sys, time, numpy as np, torch
from torch import nn
from bitdrift.backends.torch_program import program as tp
from tests.unit.test_torch_program import small_cnn
model_name, how = sys.argv[1], sys.argv[2]
if model_name == "cnn":
    model, x = small_cnn(), torch.randn(4, 3, 8, 8)
    program = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("b")},))
else:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).eval()
    x = torch.randn(32, 64)
    program = torch.export.export(model, (x,))
eager = tp.EagerRunner(program)([x.numpy()]).outputs[0]
start = time.perf_counter()
kernels = None
if how.startswith("inductor"):
    from bitdrift.backends.torch_program.inductor import CompiledRunner
    run = CompiledRunner(program, options=how.split(":")[1].split("+"))([x.numpy()])
    output, kernels = run.outputs[0], run.kernels
elif how == "eager":
    output = tp.EagerRunner(program)([x.numpy()]).outputs[0]
elif how == "onnx":
    import onnxruntime
    from bitdrift.backends.torch_program.conversions import to_onnx
    conversion = to_onnx(program, sys.argv[3] + "/m.onnx")
    session = onnxruntime.InferenceSession(sys.argv[3] + "/m.onnx")
    output = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
elif how == "openvino":
    import openvino
    from bitdrift.backends.torch_program.conversions import to_openvino
    compiled = openvino.compile_model(to_openvino(program).model, "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32"})
    output = compiled(x.numpy())[0]
elif how == "executorch":
    from bitdrift.backends.torch_program.conversions import to_executorch
    from bitdrift.backends.torch_program.executorch_runner import ExecuTorchRunner
    to_executorch(program, sys.argv[3] + "/m.pte")
    runner = ExecuTorchRunner(sys.argv[3] + "/m.pte", tp.input_signature(program))
    output = runner([x.numpy()]).outputs[0]
seconds = time.perf_counter() - start
print("RESULT", json.dumps({"seconds": seconds, "difference": float(np.abs(output - eager).max()),
                            "kernels": kernels}))
"""
RUNS = [("cnn", how) for how in ("eager", "inductor:default", "inductor:freezing",
                                 "inductor:max-autotune", "inductor:max-autotune+freezing",
                                 "onnx", "openvino", "executorch")]
RUNS += [("mlp", how) for how in ("inductor:default", "inductor:freezing",
                                  "inductor:max-autotune", "inductor:max-autotune+freezing")]


def main() -> None:
    import cpuinfo

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cpu = cpuinfo.get_cpu_info()
    print(f"CPU: {cpu.get('brand_raw')} ({cpu.get('count')} CPUs); threads: torch's default\n")
    print("| model | run | seconds (first call or conversion) | largest difference from eager "
          "| Inductor's kernels |")
    print("|---|---|---|---|---|")
    for model, how in RUNS:
        with tempfile.TemporaryDirectory() as folder:
            environment = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": folder,
                           "PYTHONPATH": f"{root}/src:{root}"}
            done = subprocess.run([sys.executable, "-c", CODE, model, how, folder], cwd=root,
                                  env=environment, capture_output=True, text=True)
        if done.returncode:
            print(f"| {model} | {how} | failed: {done.stderr.strip().splitlines()[-1]} | | |")
            continue
        result = json.loads(done.stdout.split("RESULT ", 1)[1])
        kernels = ", ".join(result["kernels"] or [])
        print(f"| {model} | {how} | {result['seconds']:.1f} | {result['difference']:.2g} "
              f"| {kernels} |")


if __name__ == "__main__":
    main()
