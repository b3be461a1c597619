"""Benchmark (run on demand; needs Debian's qemu-user): a dynamically quantized attention
encoder on this CPU and on emulated CPUs without VNNI, and the first MatMulInteger's
integers replayed in numpy (issue 65's table).

    python benchmarks/quantized_cpus.py [--cpus Haswell-v4 Skylake-Client-v4] [--batch 1]

The encoder of bitdrift.inputs.examples.onnx_transformer (seed 0, six inputs) is quantized
by ONNX Runtime's quantize_dynamic with QUInt8, QInt8 and 7-bit QInt8 (reduce_range)
weights (bitdrift.backends.exported.onnx_quantization). Each CPU runs it in a fresh process
(``qemu-x86_64 -cpu MODEL`` for an emulated one, bitdrift.emulation.cpus), one thread,
the inputs in batches of ``--batch``: the outputs' digest (SHA-256 of the float32 bytes,
8 hex digits) and first values with every graph optimisation (as deployed), and, with
none, the first MatMulInteger's uint8 input and int32 output. In numpy
(bitdrift.analysis.integer) that output is recomputed from its input and the file's
int8 weights exactly (int32: VNNI, AMX) and as AVX2's vpmaddubsw does (u8 x s8 pairs
into saturated int16); each CPU's is said to equal one, and how_they_part names how an
emulated CPU's parts from this one's. Prints a Markdown table naming the host's CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


# the rows: quantize_dynamic's settings; reduce_range's 7-bit weights (|w| <= 64) keep
# every u8 x s8 pair within int16 (255 x 64 x 2 = 32640), as ONNX Runtime advises for
# CPUs without VNNI
WEIGHTS = {"QUInt8": {"weight_type": "QUInt8"}, "QInt8": {"weight_type": "QInt8"},
           "QInt8 reduce_range": {"weight_type": "QInt8", "reduce_range": True}}


def first_matmul_integer(model):
    """The graph's first MatMulInteger node."""
    return next(node for node in model.graph.node if node.op_type == "MatMulInteger")


def capture(model_path: str, inputs_path: str, out: str, batch: int) -> None:
    """In this process (native or emulated): the model's outputs with every optimisation,
    and, with none, the first MatMulInteger's inputs' codes and int32 output, to ``out``."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    inputs = np.load(inputs_path)

    def run(model_bytes, level, names):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.graph_optimization_level = level
        session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        runs = [session.run(names, {"tokens": inputs[start:start + batch]})
                for start in range(0, len(inputs), batch)]
        return [np.stack(values) if np.ndim(values[0]) == 0 else np.concatenate(values)
                for values in zip(*runs, strict=True)]

    model = onnx.load(model_path)
    deployed, = run(model.SerializeToString(), ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                    ["logits"])
    node = first_matmul_integer(model)
    codes, zero_point, accumulators = node.input[0], node.input[2], node.output[0]
    model.graph.output.extend([
        helper.make_tensor_value_info(codes, TensorProto.UINT8, None),
        helper.make_tensor_value_info(zero_point, TensorProto.UINT8, None),
        helper.make_tensor_value_info(accumulators, TensorProto.INT32, None)])
    found = run(model.SerializeToString(), ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                ["logits", codes, zero_point, accumulators])
    np.savez(out, deployed=deployed, unoptimised=found[0], codes=found[1],
             zero_point=found[2], accumulators=found[3])


def capture_on(cpu: str | None, model, inputs, out, batch: int = 1) -> dict:
    """capture() in a fresh process on ``cpu`` (QEMU's model name; None: this CPU): its
    arrays."""
    from bitdrift.emulation.cpus import python_command

    subprocess.run([*python_command({"emulate": cpu} if cpu else {}),
                    str(Path(__file__).resolve()), "--batch", str(batch), "--capture",
                    str(model), str(inputs), str(out)], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    with np.load(out) as found:
        return dict(found)


def digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, np.float32).tobytes()).hexdigest()[:8]


def replays(model_path, found: dict):
    """(the layer, its uint8 input rows, per batch: (rows, exact int32, saturated int32));
    each batch has its own activation zero point (DynamicQuantizeLinear's)."""
    import onnx
    from onnx import numpy_helper

    from bitdrift.analysis import integer

    model = onnx.load(str(model_path))
    node = first_matmul_integer(model)
    constants = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = constants[node.input[1]]
    weight_zero_point = constants[node.input[3]] if len(node.input) > 3 and node.input[3] \
        else 0
    codes, accumulators = found["codes"], found["accumulators"]
    batches = []
    per_batch = len(codes) // len(found["zero_point"])
    for index, zero_point in enumerate(found["zero_point"]):
        rows = codes[index * per_batch:(index + 1) * per_batch].reshape(-1, weights.shape[0])
        layer = integer.QuantizedLinear(weights=weights, input_scale=1.0,
                                        input_zero_point=int(zero_point), weight_scale=1.0,
                                        weight_zero_point=weight_zero_point)
        exact = integer.layer_outputs(layer, rows)
        saturated = (integer.layer_outputs(layer, rows, saturated=True)
                     if weights.dtype == np.int8 else exact)
        recorded = accumulators[index * per_batch:(index + 1) * per_batch].reshape(exact.shape)
        batches.append((layer, rows, exact, saturated, recorded))
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", nargs="+", default=["Haswell-v4", "Skylake-Client-v4"],
                        help="QEMU's x86-64 CPU models to emulate besides this CPU")
    parser.add_argument("--batch", type=int, default=1, help="samples per run")
    parser.add_argument("--capture", nargs=3, metavar=("MODEL", "INPUTS", "OUT"),
                        help=argparse.SUPPRESS)  # the child's part
    args = parser.parse_args()
    if args.capture:
        capture(*args.capture, args.batch)
        return
    from bitdrift.analysis import integer
    from bitdrift.backends.exported.onnx_quantization import quantize_model
    from bitdrift.inputs.examples import onnx_transformer
    from bitdrift.run.devices import cpu_info

    flags = cpu_info().get("flags", [])
    host = (f"{cpu_info().get('brand_raw')} (family {cpu_info().get('family')} model "
            f"{cpu_info().get('model')}; {'AVX512_VNNI' if 'avx512_vnni' in flags else 'no VNNI'}"
            f", {'AMX-INT8' if 'amx_int8' in flags else 'no AMX'})")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        onnx_transformer.write(folder / "encoder.onnx", folder / "inputs.npy", samples=6)
        for weights, settings in WEIGHTS.items():
            weight_type = settings["weight_type"]
            model = folder / f"{weights.replace(' ', '_')}.onnx"
            quantize_model(folder / "encoder.onnx", model, {"method": "dynamic", **settings})
            found = {}
            for cpu in [None, *args.cpus]:
                found[cpu] = capture_on(cpu, model, folder / "inputs.npy",
                                        model.with_suffix(f".{cpu or 'native'}.npz"),
                                        args.batch)
            native = replays(model, found[None])
            for cpu, values in found.items():
                batches = replays(model, values)
                equals = []
                for _, _, exact, saturated, recorded in batches:
                    equals.append("exact int32" if np.array_equal(recorded, exact) else
                                  "saturated int16 pairs" if np.array_equal(recorded, saturated)
                                  else "neither")
                same_codes = all(np.array_equal(mine[1], theirs[1])
                                 for mine, theirs in zip(native, batches, strict=True))
                verdicts = sorted({integer.how_they_part(theirs[4], mine[4], mine[0],
                                                         mine[1]).verdict
                                   for mine, theirs in zip(native, batches, strict=True)})
                pairs = sum(integer.saturating_pairs(b[1], b[0].weights) for b in batches) \
                    if weight_type == "QInt8" else "none (u8 x u8: vpmaddwd, exact)"
                apart = np.abs(values["deployed"] - found[None]["deployed"]).max() / \
                    np.abs(found[None]["deployed"]).max()
                rows.append((weights, cpu or "this CPU", digest(values["deployed"]),
                             ", ".join(f"{v:.5f}" for v in values["deployed"][0, :3]),
                             f"{apart:.1%}",
                             ", ".join(sorted(set(equals))), same_codes, pairs,
                             "; ".join(verdicts)))
    print(f"Host: {host}; one thread, 6 inputs in batches of {args.batch}.\n")
    print("| weights | CPU | digest | first output | largest difference from this CPU's "
          "(of its largest output) | first MatMulInteger equals | its uint8 input as this "
          "CPU's | u8 x s8 pairs over int16 | against this CPU |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")


if __name__ == "__main__":
    main()
