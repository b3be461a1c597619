"""Can a GPU's Dense layer be reproduced bit for bit on a CPU? (run on demand, one call).

    python benchmarks/gpu_gemm_order.py --prepare CARRIED        # here, with Keras
    python benchmarks/gpu_gemm_order.py CARRIED/dense_layers.npz OUT [--device cuda|cpu]

``--prepare`` writes CARRIED/dense_layers.npz: the reference model's Dense layers (name,
kernel, bias) and each layer's real input for the reference samples, computed by running
the model with Keras (the GPU machine has no Keras or TensorFlow).

The main run, per Dense layer, per precision (float16; float32 with TF32 off) and per op
(``linear``: torch.nn.functional.linear with its bias, nn.Linear's kernel layout;
``matmul``: torch.matmul of the input and the (n, units) kernel, no bias, Keras' torch
Dense before its bias add), on ``--device`` at the layer's own shapes (batch = the samples):

1. reveals the summation order with bitdrift.analysis.accumulation.reveal.reveal_places through the
op
   itself (FPRev's method: probes of +-M and ones, M swamping the ones);
2. runs the op on the layer's real inputs (twice: the GPU's run-to-run repeatability);
3. replays the revealed tree on the CPU with numpy (bitdrift.analysis.accumulation.replay, each
   addition rounded to float32, with and without FMA) and, for float16, with mmasim's model
   of the GPU's matrix unit (every node of the tree that adds products is one fused
   dot-product-accumulate of mmasim.arithmetic.fdpa.t_fdpa with the architecture's
   parameters; nodes adding partial sums only, or the bias after them, add in float32);
   the float32 sum is rounded to float16 where the op's output is float16;
4. counts the values whose bits the replays reproduce.

OUT gets ``gemm_orders.json`` (the device that ran, the settings, per layer/op/precision:
the order's name, its trees, the node widths, the replays' bit-identical counts) and the
same as a table on stdout. ``--device cpu`` runs everything with torch on this CPU (one
thread) to test the script end to end; mmasim's model (of ``--mma-arch``, default Hopper) is
then replayed against the CPU's bits too (where it matches, the CPU's sums merely agree
with it: its fused nodes there hold one or two products).

mmasim (Peichen Xie, Microsoft; PyPI, pure Python, needs torch): its ``mmasim.nv_ptx``
module compiles a C++ FMA with torch.utils.cpp_extension when imported, so this script
takes the fused dot product from ``mmasim.arithmetic.fdpa`` (no compiler needed) and the
per-architecture parameters from the table FP16_F32_MMA below, copied from
mmasim.nv_ptx.sim; ``--check-mmasim`` compares the table with mmasim.nv_ptx.sim (which
compiles; needs g++ and ninja) and replays a chain of blocks both ways.

Wheels for the GPU machine (Python 3.12, numpy, torch, h5py, scipy there, no network),
in /work/main/.whl (carried):

    pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        --implementation cp -d .whl mmasim==2.1.1 ninja==1.13.2

    mmasim-2.1.1-py3-none-any.whl              (what this script imports)
    ninja-1.13.2-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
                                               (only for --check-mmasim's compile)

On the GPU machine (.carry/gemm/dense_layers.npz carried from --prepare):

    pip install --no-deps --target /tmp/site .whl/mmasim-2.1.1-py3-none-any.whl
    # or, without pip: python -m zipfile -e .whl/mmasim-2.1.1-py3-none-any.whl /tmp/site
    PYTHONPATH=$PWD/src:/tmp/site python benchmarks/gpu_gemm_order.py \\
        .carry/gemm/dense_layers.npz $OUT --device cuda
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

from bitdrift.analysis.accumulation.names import order_name
from bitdrift.analysis.accumulation.replay import replay
from bitdrift.analysis.accumulation.reveal import reveal_places
from bitdrift.analysis.accumulation.trees import OrderError, from_flat, to_flat
from bitdrift.atomic import atomic_output

LAYERS_FILE = "dense_layers.npz"
RESULT_FILE = "gemm_orders.json"
PRECISIONS = ("float16", "float32")
OPS = ("linear", "matmul")
# mmasim.nv_ptx.sim's parameters of an f16 x f16 -> f32 MMA per architecture: F (the bits
# kept below the largest term's exponent, the rest truncated), L_max (products fused per
# step: the architecture's bytes per step over float16's 2) and e_zero (the exponent a zero
# term takes); the sum is truncated to float32 (RZ-FP32). Hopper's WGMMA has the same.
FP16_F32_MMA = {"Volta": (23, 4, -131), "Turing": (24, 8, -132), "Ampere": (24, 8, -132),
                "Ada Lovelace": (24, 8, -132), "Hopper": (25, 16, -133),
                "Blackwell": (25, 16, -133), "RTX Blackwell": (25, 16, -133)}


def mma_arch(capability: tuple[int, int]) -> str:
    """mmasim's name of an NVIDIA compute capability's architecture."""
    major, minor = capability
    names = {7: "Turing" if minor >= 5 else "Volta", 8: "Ada Lovelace" if minor == 9
             else "Ampere", 9: "Hopper", 10: "Blackwell", 11: "Blackwell",
             12: "RTX Blackwell"}
    if major not in names:
        raise SystemExit(f"compute capability {major}.{minor}: no mmasim architecture known")
    return names[major]


# -- --prepare (here, with Keras) ----------------------------------------------------------
def prepare(folder: Path) -> Path:
    """Write ``folder``/dense_layers.npz from the reference model run by Keras."""
    import keras

    from bitdrift.inputs import reference_set
    from bitdrift.inputs.datasets import read_test_images

    samples = reference_set.samples()
    images = read_test_images(reference_set.inputs_file(), samples)
    model = keras.saving.load_model(reference_set.model_file(), compile=False)
    arrays: dict = {"samples": np.array(samples)}
    names = []
    for layer in model.layers:
        if type(layer).__name__ != "Dense":
            continue
        feeds = keras.Model(model.inputs, layer.input)
        kernel, bias = (np.asarray(w, dtype=np.float32) for w in layer.get_weights())
        arrays[f"{layer.name}/kernel"] = kernel
        arrays[f"{layer.name}/bias"] = bias
        arrays[f"{layer.name}/inputs"] = np.asarray(feeds.predict(images, verbose=0),
                                                    dtype=np.float32)
        names.append(layer.name)
    arrays["layers"] = np.array(names)
    arrays["meta"] = np.array(json.dumps({
        "model": reference_set.manifest()["model"]["model_sha256"],
        "keras": keras.__version__, "keras_backend": keras.backend.backend(),
        "inputs": "the layer inputs of the reference samples, computed by Keras in float32"}))
    path = folder / LAYERS_FILE
    with atomic_output(path) as tmp:
        with open(tmp, "wb") as handle:
            np.savez(handle, **arrays)
    return path


def read_layers(path: Path) -> tuple[dict, dict]:
    """{name: (kernel, bias, inputs)} and the meta of a --prepare file."""
    if not path.is_file():
        raise SystemExit(f"{path}: no such file (write it with --prepare)")
    with np.load(path) as data:
        keys = set(data.files)
        missing = {"layers", "meta"} - keys
        if missing:
            raise SystemExit(f"{path}: not a --prepare file (no {', '.join(sorted(missing))})")
        layers = {}
        for name in data["layers"].tolist():
            parts = [f"{name}/{part}" for part in ("kernel", "bias", "inputs")]
            if not set(parts) <= keys:
                raise SystemExit(f"{path}: layer {name} lacks {sorted(set(parts) - keys)}")
            layers[name] = tuple(np.asarray(data[part]) for part in parts)
        return layers, json.loads(str(data["meta"]))


# -- the op on torch --------------------------------------------------------------------------
def run_op(torch, op: str, x, kernel, bias):
    """The op's output (rows, units): ``linear`` with nn.Linear's (units, n) weight and the
    bias, ``matmul`` the GEMM of x and the (n, units) kernel alone."""
    if op == "linear":
        return torch.nn.functional.linear(x, kernel.T.contiguous(), bias)
    return torch.matmul(x, kernel)


def torch_probe(torch, op: str, device: str, dtype, rows: int):
    """reveal_places' ``dense(weights, bias)``: the op on a batch of ``rows`` rows of ones."""
    def dense(weights: np.ndarray, shift: np.ndarray) -> np.ndarray:
        kernel = torch.from_numpy(np.ascontiguousarray(weights)).to(device)
        ones = torch.ones(rows, kernel.shape[0], dtype=dtype, device=device)
        bias = torch.from_numpy(np.ascontiguousarray(shift)).to(device)
        return run_op(torch, op, ones, kernel, bias).float().cpu().numpy()
    return dense


# -- replays ---------------------------------------------------------------------------------
def replay_mma(tree, count: int, terms: int, x16: np.ndarray, kernel16: np.ndarray,
               bias16: np.ndarray | None, params: tuple[int, int, int]) -> tuple:
    """float32 (rows, units) of the tree replayed with mmasim's fused dot product: a node
    with products is t_fdpa(its products, c) where c is its one other operand (a partial
    sum or the bias), or the float32 sum of its other operands in index order, or 0; a
    node without products adds its operands in float32. Also {"fused widths": sorted
    distinct numbers of products per node, "float32 additions": nodes adding partial sums}."""
    import torch
    from mmasim.arithmetic.fdpa import t_fdpa

    width_f, _, e_zero = params
    x = torch.from_numpy(x16)
    k = torch.from_numpy(kernel16)
    rows, units = x16.shape[0], kernel16.shape[1]
    values: list = []
    widths, additions = set(), 0

    def operand(child):
        if bias16 is not None and child == terms:
            return torch.from_numpy(bias16.astype(np.float32)).expand(rows, units).clone()
        return values[child - count]

    for children in to_flat(tree, count):
        products = [child for child in children if child < terms]
        others = [operand(child) for child in children if child >= terms]
        if len(others) > 1 or (others and not products):
            additions += 1
        c = torch.zeros(rows, units, dtype=torch.float32)
        if others:
            c = others[0]
            for other in others[1:]:
                c = c + other  # float32, rounded to nearest
        if products:
            widths.add(len(products))
            a = x[:, products][:, None, :].expand(rows, units, len(products))
            b = k[products].T[None].expand(rows, units, len(products))
            c = t_fdpa(a, b, c, width_f, "RZ-FP32", e_zero)
        values.append(c)
    return values[-1].numpy(), {"fused widths": sorted(widths), "float32 additions": additions}


def same_bits(values: np.ndarray, actual: np.ndarray) -> int:
    """How many values have the same bits."""
    kind = {2: np.uint16, 4: np.uint32}[actual.dtype.itemsize]
    return int(np.sum(values.astype(actual.dtype).view(kind) == actual.view(kind)))


def check_mmasim(arch: str) -> dict:
    """The parameter table against mmasim.nv_ptx.sim, and a chain of L_max-blocks (mmasim's
    own MMA) against replay_mma's walk of that chain as a tree; compiles mmasim's FMA."""
    import torch
    from mmasim.nv_ptx import sim

    table = {name: (sim._mma_F_bits[name], sim._mma_L_max_bytes[name] // 2,
                    sim._mma_e_zero_for_fp32[name]) for name in FP16_F32_MMA}
    rng = np.random.default_rng(0)
    terms, rows, units = 64, 3, 5
    x16 = rng.standard_normal((rows, terms)).astype(np.float16)
    kernel16 = rng.standard_normal((terms, units)).astype(np.float16)
    mma = sim.MMA(arch, "m16n8k16.f32.f16.f16.f32")
    theirs = mma(torch.from_numpy(x16), torch.from_numpy(kernel16),
                 torch.zeros(rows, units)).numpy()
    block = FP16_F32_MMA[arch][1]
    chain: list[list[int]] = []
    for start in range(0, terms, block):
        chain.append(([terms + len(chain) - 1] if chain else []) +
                     list(range(start, start + block)))
    ours, _ = replay_mma(from_flat(chain, terms), terms, terms, x16, kernel16, None,
                         FP16_F32_MMA[arch])
    return {"table equals mmasim.nv_ptx.sim": table == FP16_F32_MMA,
            "chain replay equals mmasim's MMA": same_bits(ours, theirs) == theirs.size}


# -- the run -----------------------------------------------------------------------------------
def host_cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe_device(torch, device: str, arch: str) -> dict:
    if device == "cuda":
        capability = torch.cuda.get_device_capability()
        return {"ran on": "cuda", "name": torch.cuda.get_device_name(),
                "capability": ".".join(map(str, capability)), "mmasim arch": arch,
                "cuda": torch.version.cuda, "host cpu": host_cpu()}
    return {"ran on": "cpu", "name": host_cpu(), "threads": torch.get_num_threads(),
            "mmasim arch": f"{arch} (a GPU's model replayed against this CPU's bits)"}


def one_case(torch, device, op, precision, kernel, bias, inputs, params) -> dict:
    """Reveal, run and replay one layer's op in one precision (params: mmasim's F, L_max,
    e_zero; None: no mmasim replay)."""
    dtype = {"float16": torch.float16, "float32": torch.float32}[precision]
    ntype = np.dtype(precision).type
    terms, units = kernel.shape
    rows = inputs.shape[0]
    use_bias = op == "linear"
    count = terms + (1 if use_bias else 0)
    x, k, b = (np.ascontiguousarray(a.astype(ntype)) for a in (inputs, kernel, bias))
    calls = [0]
    probe = torch_probe(torch, op, device, dtype, rows)

    def counted(weights, shift):
        calls[0] += 1
        return probe(weights, shift)

    case = {"op": op, "precision": precision, "terms": terms, "units": units, "rows": rows}
    start = time.perf_counter()
    try:
        places = reveal_places(counted, terms, units, precision, use_bias, batch=rows)
    except OrderError as error:
        case.update(order=f"not revealed: {error}", probe_calls=calls[0])
        return case
    case["reveal_seconds"] = round(time.perf_counter() - start, 3)
    case["probe_calls"] = calls[0]
    entry = places.entry(count, use_bias)
    case["order"] = order_name(places.trees, entry["places"], use_bias)
    if places.errors:
        case["reveal errors"] = places.errors
    case["trees"] = entry["trees"]
    which = places.tree_of[:, 0]
    on = {name: torch.from_numpy(a).to(device) for name, a in
          (("x", x), ("k", k), ("b", b))}
    outputs = [run_op(torch, op, on["x"], on["k"], on["b"]).cpu().numpy() for _ in range(2)]
    actual = outputs[0]
    case["repeatable"] = same_bits(outputs[1], actual) == actual.size
    known = which >= 0
    total = int(actual[known].size)
    case["values"] = total
    if total < actual.size:
        case["rows with unknown order"] = int(np.sum(~known))
    replays = {}
    for fma in (False, True):
        values = np.empty(actual.shape, np.float32)
        for index, tree in enumerate(places.trees):
            mask = which == index
            if mask.any():
                values[mask] = replay(tree, x[mask], k, b if use_bias else None, fma)
        replays["numpy, FMA" if fma else "numpy"] = same_bits(values[known],
                                                              actual[known])
    if precision == "float16" and params:
        values = np.empty(actual.shape, np.float32)
        shapes = []
        for index, tree in enumerate(places.trees):
            mask = which == index
            if mask.any():
                values[mask], shape = replay_mma(tree, count, terms, x[mask], k,
                                                 b if use_bias else None, params)
                shapes.append(shape)
        replays["mmasim"] = same_bits(values[known], actual[known])
        case["mmasim tree"] = shapes
    case["bit-identical values"] = replays
    case["mismatches"] = {name: total - same for name, same in replays.items()}
    case["reproduced by"] = [name for name, same in replays.items() if same == total] or \
        ["none"]
    return case


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="?", type=Path, help="dense_layers.npz (--prepare)")
    parser.add_argument("out", nargs="?", type=Path, help="folder for gemm_orders.json")
    parser.add_argument("--prepare", type=Path, metavar="FOLDER",
                        help="write FOLDER/dense_layers.npz here (needs Keras)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--mma-arch", choices=sorted(FP16_F32_MMA),
                        help="mmasim's architecture (default: the GPU's; Hopper on cpu)")
    parser.add_argument("--check-mmasim", action="store_true",
                        help="check the parameter table and the tree walk against "
                        "mmasim.nv_ptx (compiles its C++ FMA: needs g++ and ninja)")
    args = parser.parse_args(argv)
    if args.prepare:
        print(f"wrote {prepare(args.prepare)}")
        return 0
    if args.layers is None or args.out is None:
        parser.error("give LAYERS and OUT (or --prepare FOLDER)")
    started = time.perf_counter()
    layers, meta = read_layers(args.layers)
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device (use --device cpu)")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        arch = args.mma_arch or mma_arch(torch.cuda.get_device_capability())
    else:
        torch.set_num_threads(1)
        arch = args.mma_arch or "Hopper"
    torch.set_float32_matmul_precision("highest")
    from importlib.metadata import PackageNotFoundError, version

    try:
        mmasim_version = version("mmasim")
    except PackageNotFoundError:
        mmasim_version = None
        print("mmasim is not installed: no matrix-unit replay (pip install --no-deps "
              "--target /tmp/site .whl/mmasim-2.1.1-py3-none-any.whl; PYTHONPATH+=:/tmp/site)")
    params = FP16_F32_MMA[arch] if mmasim_version else None
    result = {"device": describe_device(torch, args.device, arch),
              "torch": torch.__version__, "numpy": np.__version__,
              "mmasim": {"version": mmasim_version or "not installed", "arch": arch,
                         "F, L_max, e_zero": FP16_F32_MMA[arch], "rounding": "RZ-FP32"},
              "settings": {
                  "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                  "float32_matmul_precision": torch.get_float32_matmul_precision(),
                  "allow_fp16_reduced_precision_reduction":
                      torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
                  "blas library": str(torch.backends.cuda.preferred_blas_library())
                  if args.device == "cuda" else "the CPU's"},
              "prepared": meta, "cases": {}}
    if args.check_mmasim and mmasim_version:
        result["mmasim"]["check"] = check_mmasim(arch)
    print(f"ran on {args.device}: {result['device']['name']}; mmasim model: {arch}")
    print(f"{'layer':8} {'op':7} {'prec':8} {'order':42} reproduced by")
    for name, (kernel, bias, inputs) in layers.items():
        for precision in PRECISIONS:
            for op in OPS:
                case = one_case(torch, args.device, op, precision, kernel, bias, inputs,
                                params)
                result["cases"][f"{name}/{op}/{precision}"] = case
                counts = ", ".join(f"{key} {value}/{case.get('values')}"
                                   for key, value in case.get("bit-identical values",
                                                              {}).items())
                print(f"{name:8} {op:7} {precision:8} {case['order'][:42]:42} "
                      f"{', '.join(case.get('reproduced by', ['-']))} ({counts})",
                      flush=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    path = args.out / RESULT_FILE
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
