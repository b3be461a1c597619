"""Kernel provenance: which kernel ran in every layer, from the libraries' own logs.

A device's traced repeat (see bitdrift.run.traced_repeat) runs once more in a fresh process with
the libraries' logging on and a marker line printed (through C's ``printf``, the stream the
libraries write to, so the order holds however stdout is buffered) before and after each
Keras layer's call. Its stdout, captured at the file-descriptor level, is parsed here:

- oneDNN verbose (``ONEDNN_VERBOSE=1``; TensorFlow's CPU kernels, PyTorch's convolutions):
  one line per primitive execution. Fields are read by the names of the log's own template
  line (``...,info,template:operation,engine,primitive,implementation,...``) where there is
  one, else by the documented default order; the ``v1`` marker of newer builds and a
  leading timestamp are skipped. The header gives ``isa:`` and ``nthr:``.
- MKL verbose (``MKL_VERBOSE=1``; PyTorch's Linear/addmm on x86): ``MKL_VERBOSE SGEMM(...)
  time CNR:mode ... NThr:n``.
- cuDNN (``CUDNN_LOGLEVEL_DBG=3``, ``CUDNN_LOGDEST_DBG=stdout``): a block per API call,
  ``function cudnnX() called:`` then ``i!`` lines. A kernel ran where a legacy call names
  its algorithm (``cudnnConvolutionForward``: ``algo: ... val=NAME``) or where the backend
  API executes a plan (``cudnnBackendExecute``): its engine (``engine_id``) and the
  engine's knobs (tile sizes and the like) name the kernel, and the internal call that
  follows says whether TensorFloat-32 was allowed (``enable_tf32``; whether the engine used
  it, bitdrift.analysis.effective_precision measures: on an NVIDIA H200 engine 28 computed a
  float32 conv at 23 effective bits and engine 67 at 11, both allowed). The many blocks that
  build and query plans (``cudnnBackendFinalize``, ``...GetAttribute``) name candidate
  engines, not what ran. Read from real logs: cuDNN 9.19 under torch 2.11 on an NVIDIA
  H100 (``tests/data/kernels``).
- cuBLASLt (``CUBLASLT_LOG_LEVEL=5``, to stdout): the ``[Trace]`` line of a matmul call
  (``cublasLtMatmul``, and ``cublasLtSSSMatmul`` and its kin, which cuBLAS's own GEMMs
  call) has ``algo=[algoId=... tile=... stages=... numSplitsK=... reductionScheme=...]``;
  each of these can change the order of the sums. The ``[Api]`` line of the same call
  carries pointers only; heuristic queries choose nothing.

The exported runtimes describe their compiled graph instead (each backend's ``describe``):
ONNX Runtime its optimised model (fused, NCHWc and Gemm nodes), OpenVINO its runtime model
(each executed node's primitive, such as ``brgconv_avx512_bf16``), LiteRT its execution
plan (the nodes XNNPACK took, the built-in or reference kernels of the rest); the nodes
are given to the Keras layers by the exported outputs (``graph_layer_calls``). Nodes that
only move data (transposes, reshapes, layout reorders) are left out.

TensorFlow's Eigen kernels and torch's own ATen kernels log nothing: on a CPU, a Conv or
Dense layer with no library line ran them (``eigen``, ``aten``). Anything else with no line
is ``unknown`` (and a warning in the job log); a line the parser does not understand is kept
raw. A layer's *kernel signature* is its sorted distinct implementation names.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from bitdrift.runtimes import SILENT_CPU_KERNELS

MARKER = "bitdrift-layer"  # marker lines: "bitdrift-layer,begin,<layer>" and ",end,"
# The markers' name for a traced job's run of the model as deployed (bitdrift.analysis.observer):
# no Keras layer name has parentheses
DEPLOYED_LAYER = "(deployed)"
ONEDNN_PREFIXES = ("onednn_verbose", "dnnl_verbose")
# oneDNN v2/v3's default field order after "exec" (the documented verbose format).
ONEDNN_DEFAULT_FIELDS = ["engine", "primitive", "implementation", "prop_kind",
                         "memory_descriptors", "attributes", "auxiliary", "problem_desc",
                         "exec_time"]
# Layers whose kernels the study must name (the compute layers).
COMPUTE_CLASSES = ("Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2D", "SeparableConv2D",
                   "Conv2DTranspose", "Dense", "EinsumDense", "MultiHeadAttention")
MKL_LINE = re.compile(r"MKL_VERBOSE\s+(?P<call>[A-Z0-9_]+)\((?P<args>[^)]*)\)\s+"
                      r"(?P<time>[0-9.]+)(?P<unit>[mun]?s)\s+(?P<rest>.*)")
CUBLASLT_LINE = re.compile(r"\[cublasLt\]\[[^\]]*\]\[(?P<level>\w+)\]\[(?P<api>cublasLt\w+)\]"
                           r"(?P<rest>.*)")
CUBLASLT_MATMUL = re.compile(r"cublasLt[A-Z]*Matmul")  # cublasLtMatmul, cublasLtSSSMatmul, ...
# TensorFloat-32 allowed: whether the engine used it, the effective-precision check measures
CUDNN_TF32 = " tf32-allowed"
# The legacy API's calls that run a kernel with the algorithm they name
CUDNN_LEGACY_EXECUTIONS = ("cudnnConvolutionForward", "cudnnConvolutionBackwardData",
                           "cudnnConvolutionBackwardFilter",
                           "cudnnConvolutionBiasActivationForward")


@dataclass
class KernelCall:
    library: str  # onednn, mkl, cudnn, cublaslt
    primitive: str  # convolution, inner_product, gemm_api, sgemm, ...
    implementation: str  # brg_conv_fwd:avx2, jit:uni, gemm_api@avx2, mkl sgemm CNR:OFF, ...
    isa: str = ""
    shape: str = ""
    time_ms: float | None = None


@dataclass
class Trace:
    """What one traced repeat logged: per layer its kernel calls, and the header."""

    layers: dict[str, list[KernelCall]] = field(default_factory=dict)
    header: dict[str, str] = field(default_factory=dict)
    raw: list[str] = field(default_factory=list)  # library lines not understood
    outside: int = 0  # library calls outside any layer (weight reorders at load, ...)

    def as_json(self) -> dict:
        return {"layers": {layer: [asdict(call) for call in calls]
                           for layer, calls in self.layers.items()},
                "header": self.header, "raw": self.raw, "outside": self.outside}


def _time_ms(value: str, unit: str = "ms") -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number * {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}.get(unit, 1.0)


class OneDNNParser:
    """oneDNN verbose lines, by the field names of the log's own template."""

    def __init__(self):
        self.fields = list(ONEDNN_DEFAULT_FIELDS)
        self.isa = ""

    @staticmethod
    def _tokens(line: str) -> list[str]:
        tokens = line.split(",")
        rest = tokens[1:]
        if rest and re.fullmatch(r"[0-9.]+", rest[0]):  # ONEDNN_VERBOSE_TIMESTAMP
            rest = rest[1:]
        if rest and rest[0] == "v1":
            rest = rest[1:]
        return rest

    def parse(self, line: str, header: dict, raw: list) -> KernelCall | None:
        tokens = self._tokens(line)
        if not tokens:
            return None
        component = tokens[0] if tokens[0] in ("primitive", "graph", "common") else ""
        body = tokens[1:] if component else tokens
        if not body:
            return None
        if body[0] == "info":
            text = ",".join(body[1:])
            if text.startswith("template:operation") and component in ("primitive", ""):
                self.fields = text[len("template:operation,"):].split(",")
            elif body[1:2] == ["cpu"] and len(body) > 2:
                for item in body[2:]:
                    if ":" in item:
                        key, value = item.split(":", 1)
                        header[f"onednn.{key}"] = value
                        if key == "isa":
                            self.isa = value
            elif text.startswith("oneDNN") or text.startswith("DNNL"):
                header["onednn.version"] = text
            return None
        if body[0] != "exec" or component == "graph":
            if body[0] not in ("create", "create:cache_hit", "create:cache_miss"):
                raw.append(line)
            return None
        values = dict(zip(self.fields, body[1:], strict=False))
        if len(values) < len(self.fields) - 1:  # exec_time may be cut off; nothing else
            raw.append(line)
            return None
        implementation = values.get("implementation", "")
        primitive = values["primitive"]
        isa = _isa_name(self.isa)
        if not implementation:
            # gemm_api names no implementation: its code path is the ISA oneDNN dispatched to.
            implementation = f"{primitive}@{isa}" if isa else primitive
        return KernelCall(library="onednn", primitive=primitive, implementation=implementation,
                          isa=isa, shape=values.get("problem_desc", ""),
                          time_ms=_time_ms(values.get("exec_time", "")))


def _isa_name(header_isa: str) -> str:
    """``Intel AVX2`` -> ``avx2``; ``Intel AVX-512 with AVX512BW, ...`` -> ``avx512...``."""
    text = header_isa.lower().replace("intel ", "").replace("-", "")
    return text.split(" ")[0] if text else ""


def parse_mkl(line: str) -> KernelCall | None:
    match = MKL_LINE.search(line)
    if not match:
        return None
    rest = dict(item.split(":", 1) for item in match["rest"].split() if ":" in item)
    args = match["args"].split(",")
    call = match["call"].lower()
    shape = "x".join(args[2:5]) if call.endswith("gemm") and len(args) >= 5 else ""
    path = f"CNR:{rest['CNR']}" if "CNR" in rest else ""
    return KernelCall(library="mkl", primitive=call,
                      implementation=" ".join(part for part in ("mkl", call, path) if part),
                      isa=rest.get("CNR", ""), shape=shape,
                      time_ms=_time_ms(match["time"], match["unit"]))


def parse_cudnn_block(lines: list[str]) -> KernelCall | None:
    """One cuDNN API-call block (``function cudnnX() called:`` and its ``i!`` lines): the
    kernel it ran, or None for a call that runs none (descriptors, plans, queries)."""
    function = re.search(r"function (cudnn\w+)\(\)", lines[0])
    if not function:
        return None
    name = function.group(1)
    text = "\n".join(lines)
    dims = re.search(r"dimA: type=int; val=\[([\d,]+)\]", text)
    shape = dims.group(1) if dims else ""
    if name == "cudnnBackendExecute":
        engine = re.search(r"(?:engine_id|CUDNN_ATTR_ENGINE_GLOBAL_INDEX): type=\w+; val=(\d+)",
                           text)
        if not engine:
            return None  # the call's return block: its status only
        knobs = re.findall(r"CUDNN_KNOB_TYPE_(\w+): type=\w+; val=(-?\d+)", text)
        operation = re.search(r"CUDNN_BACKEND_OPERATION_(\w+)_DESCRIPTOR", text)
        implementation = " ".join([f"cudnn engine {engine.group(1)}",
                                   *(f"{knob.lower()}={value}" for knob, value in knobs)])
        return KernelCall(library="cudnn",
                          primitive=operation.group(1).lower() if operation else name,
                          implementation=implementation, shape=shape)
    algo = re.search(r"algo: type=\w+; val=(\w+)", text)
    if algo and name in CUDNN_LEGACY_EXECUTIONS:
        return KernelCall(library="cudnn", primitive=name,
                          implementation=f"cudnn {algo.group(1)}", shape=shape)
    return None  # workspace sizes and algorithm searches name algorithms too; none ran


def cudnn_execution_unread(lines: list[str]) -> bool:
    """Of a block that parse_cudnn_block found no kernel in: whether it is a backend
    execution with a plan, whose engine this parser cannot name (kept raw)."""
    return ("function cudnnBackendExecute()" in lines[0]
            and any("executionPlan" in line for line in lines))


def cudnn_allows_tf32(lines: list[str]) -> bool:
    """Whether a block is cuDNN's internal execution call with TensorFloat-32 allowed
    (float32 inputs rounded to 10 mantissa bits in the tensor cores)."""
    return ("function cudnnBackendExecuteInternal()" in lines[0]
            and any("enable_tf32: type=bool; val=true" in line for line in lines))


def parse_cublaslt(line: str) -> KernelCall | None:
    """A cuBLASLt matmul's ``[Trace]`` line: the algorithm and its configuration."""
    match = CUBLASLT_LINE.search(line)
    if (not match or match["level"] != "Trace"
            or not CUBLASLT_MATMUL.fullmatch(match["api"])):
        return None
    algo = re.search(r"algo=\[([^\]]*)\]", match["rest"])
    settings = dict(item.split("=", 1) for item in (algo.group(1).split() if algo else [])
                    if "=" in item)
    split_k = settings.get("numSplitsK", settings.get("splitK"))
    compute = re.search(r"computeType=(\w+)", match["rest"])
    # a fused epilogue (bias, activation) adds before the one rounding to the output
    epilogue = re.search(r"epilogue=EPILOGUE_(\w+)", match["rest"])
    parts = [f"algo {settings['algoId']}" if "algoId" in settings else "",
             settings.get("tile", "").replace("MATMUL_TILE_", "tile "),
             settings.get("stages", "").replace("MATMUL_STAGES_", "stages "),
             f"splitK {split_k}" if split_k else "",
             settings.get("reductionScheme", "").replace("REDUCTION_SCHEME_", "reduction ")
             if split_k and split_k.lstrip("-").isdigit() and int(split_k) > 1 else "",
             # float32 is the default; TF32 or lower compute types are named
             compute.group(1).lower() if compute and compute.group(1) != "COMPUTE_32F" else "",
             f"epilogue {epilogue.group(1).lower()}"
             if epilogue and epilogue.group(1) != "DEFAULT" else ""]
    implementation = " ".join(["cublasLt", *[part for part in parts if part]])
    shape = re.search(r"Adesc=\[[^\]]*rows=(\d+) cols=(\d+)", match["rest"])
    return KernelCall(library="cublaslt", primitive="matmul", implementation=implementation,
                      shape="x".join(shape.groups()) if shape else "")


CUDNN_HEADER = re.compile(r"[IiWwEe]! CuDNN|.*function cudnn\w+\(\) called")


def _starts_a_line_of_its_own(line: str) -> bool:
    return (line.startswith((MARKER + ",", *ONEDNN_PREFIXES, "MKL_VERBOSE"))
            or "[cublasLt]" in line or bool(CUDNN_HEADER.match(line)))


def parse_trace(text: str) -> Trace:
    """Kernel calls per layer from a traced repeat's captured stdout."""
    trace = Trace()
    onednn = OneDNNParser()
    current: str | None = None
    cudnn_block: list[str] = []
    last_cudnn: KernelCall | None = None

    def add(call: KernelCall | None) -> None:
        if call is None:
            return
        if current is None:
            trace.outside += 1
        else:
            trace.layers[current].append(call)

    def close_cudnn() -> None:
        nonlocal last_cudnn
        if not cudnn_block:
            return
        call = parse_cudnn_block(cudnn_block)
        if call is not None:
            add(call)
        elif cudnn_allows_tf32(cudnn_block) and last_cudnn is not None:
            # the internal call comes straight after the execution it belongs to
            last_cudnn.implementation += CUDNN_TF32
        elif cudnn_execution_unread(cudnn_block):
            trace.raw.append(cudnn_block[0])
        last_cudnn = call
        cudnn_block.clear()

    for line in text.splitlines():
        stripped = line.strip()
        # a cuDNN block runs on to the next header, marker or other library's line (its
        # lines are mostly "i!", but warnings and wrapped reasons come in between)
        if cudnn_block and not _starts_a_line_of_its_own(stripped):
            cudnn_block.append(stripped)
            continue
        close_cudnn()
        if stripped.startswith(MARKER + ","):
            _, event, layer = stripped.split(",", 2)
            if event == "begin":
                current = layer
                trace.layers.setdefault(layer, [])
            elif event == "end" and current == layer:
                current = None
        elif stripped.startswith(ONEDNN_PREFIXES):
            add(onednn.parse(stripped, trace.header, trace.raw))
        elif stripped.startswith("MKL_VERBOSE"):
            call = parse_mkl(stripped)
            if call is None and " oneMKL" not in stripped and "Intel(R) MKL" not in stripped:
                trace.raw.append(stripped)
            elif call is None:
                trace.header["mkl.version"] = stripped[len("MKL_VERBOSE "):]
            add(call)
        elif CUDNN_HEADER.match(stripped):
            if "cudnn.version" not in trace.header:
                version = re.search(r"CuDNN \(v(\d+)", stripped)
                if version:
                    trace.header["cudnn.version"] = version.group(1)
            cudnn_block.append(stripped)
        elif "[cublasLt]" in stripped:
            add(parse_cublaslt(stripped))
    close_cudnn()
    return trace


@dataclass
class GraphNode:
    """One node of a runtime's own description of its compiled graph (ONNX Runtime's
    optimised model, OpenVINO's runtime model, LiteRT's execution plan): what it computes
    (``call``; None for a node that only moves data), the tensors it reads and writes."""

    call: KernelCall | None
    inputs: tuple
    outputs: tuple


def graph_layer_calls(nodes: list[GraphNode], outputs: list, recorded: dict[int, str]
                      ) -> dict[str, list[KernelCall]]:
    """Kernel calls per recorded layer from a compiled graph. ``outputs``: the graph's
    output tensors in the exported model's order (one per Keras layer,
    bitdrift.backends.keras.export);
    ``recorded``: {position: layer} of the positions the record keeps (the mapped ones).
    A node belongs to the first layer whose output depends on it (the outputs are in model
    order), and also to every later layer whose output it writes itself (one delegate node
    can compute several layers)."""
    producer = {}
    for node in nodes:
        for tensor in node.outputs:
            producer[tensor] = node
    taken: set[int] = set()
    calls: dict[str, list[KernelCall]] = {}
    for position, tensor in enumerate(outputs):
        mine, stack = [], [tensor]
        direct = producer.get(tensor)
        if direct is not None and id(direct) in taken:
            mine.append(direct)
        while stack:
            node = producer.get(stack.pop())
            if node is None or id(node) in taken:
                continue
            taken.add(id(node))
            mine.append(node)
            stack.extend(node.inputs)
        if position in recorded:
            calls[recorded[position]] = [node.call for node in reversed(mine)
                                         if node.call is not None]
    return calls


def signature(calls: list[dict] | list[KernelCall]) -> str:
    """A layer's kernel signature: its distinct implementation names, sorted, joined."""
    names = {call["implementation"] if isinstance(call, dict) else call.implementation
             for call in calls}
    return "+".join(sorted(names))


def layer_kernels(trace: Trace, layers: list[tuple[str, str]], backend: str,
                  accelerator: str = "cpu") -> dict:
    """{layer: {"signature", "calls"}} for the recorded layers. A compute layer (Conv,
    Dense) that logged nothing ran the framework's own kernels on a CPU
    (bitdrift.runtimes.SILENT_CPU_KERNELS), else it is ``unknown``; a layer that computes no sum
    (activations, pooling, reshapes) and logged nothing has the signature ``none``."""
    silent = SILENT_CPU_KERNELS.get(backend, "unknown") if accelerator == "cpu" else "unknown"
    result = {}
    for layer, layer_class in layers:
        calls = [asdict(call) for call in trace.layers.get(layer, [])]
        if calls:
            name = signature(calls)
        elif layer_class not in COMPUTE_CLASSES:
            name = "none"
        else:
            name = silent
        result[layer] = {"signature": name, "calls": calls}
    return result


# -- tables and coverage over records --------------------------------------------------------
TABLE_COLUMNS = ["model", "device", "backend", "layer", "layer_class", "signature", "call",
                 "library", "primitive", "implementation", "isa", "shape", "time_ms"]
UNTRACED = "untraced"


def record_signatures(record) -> dict[str, str] | None:
    """{layer: kernel signature} of a record's traced repeat; None for a record without
    the kernels dataset; a runtime that logs no kernels gives ``untraced (<backend>)``."""
    kernels = record.kernels
    if kernels is None:
        return None
    if not kernels.get("traced"):
        return {layer: f"{UNTRACED} ({record.attr('backend')})"
                for layer in kernels.get("layers", {})} or {}
    return {layer: entry["signature"] for layer, entry in kernels["layers"].items()}


def kernels_table(records) -> tuple[list[dict], list[str]]:
    """``kernels.csv`` rows (one per device x layer x kernel call; a layer without calls
    has one row with its signature) and the files of records without kernels."""
    rows, lacking = [], []
    for record in records:
        kernels = record.kernels
        if kernels is None:
            lacking.append(str(record.path))
            continue
        base = {"model": record.model, "device": record.device,
                "backend": record.attr("backend")}
        classes = dict(kernels.get("layer_classes", {}))
        entries = kernels.get("layers", {})
        for layer in kernels.get("order") or list(entries):  # model order
            entry = entries[layer]
            layer_row = {**base, "layer": layer, "layer_class": classes.get(layer, ""),
                         "signature": entry["signature"] if kernels.get("traced")
                         else f"{UNTRACED} ({record.attr('backend')})"}
            calls = entry.get("calls", [])
            if not calls:
                rows.append({column: layer_row.get(column) for column in TABLE_COLUMNS})
            for index, call in enumerate(calls):
                row = {**layer_row, "call": index, **call}
                rows.append({column: row.get(column) for column in TABLE_COLUMNS})
    return rows, lacking


def divergence_kernels(records, divergence):
    """``divergence`` with, per pair, both devices' kernel signatures at the first
    divergent layer and whether they differ (empty where a record has no kernels)."""
    signatures = {(record.model, record.device): record_signatures(record) for record in records}
    first, second, differ = [], [], []
    for row in divergence.itertuples(index=False):
        a = (signatures.get((row.model, row.device_a)) or {}).get(row.first_layer, "")
        b = (signatures.get((row.model, row.device_b)) or {}).get(row.first_layer, "")
        first.append(a)
        second.append(b)
        traced = a and b and not a.startswith(UNTRACED) and not b.startswith(UNTRACED)
        differ.append(("yes" if a != b else "no") if traced and row.first_layer else "")
    return divergence.assign(kernels_a=first, kernels_b=second, kernels_differ=differ)


# -- XLA (JAX): the optimised HLO of every module a layer compiled ----------------------------
HLO_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%(?P<name>[\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%[\w.\-]+\s*=\s*(?P<type>.+?)\s+"
                             r"(?P<op>[a-z][a-z0-9\-]*)\((?P<rest>.*)$")
# Instructions that only move, reinterpret or describe data: no arithmetic
HLO_LAYOUT = {"parameter", "constant", "bitcast", "copy", "reshape", "transpose", "tuple",
              "get-tuple-element", "broadcast", "slice", "concatenate", "iota", "pad",
              "dynamic-slice", "dynamic-update-slice", "copy-start", "copy-done"}


def xla_module_calls(text: str) -> list[KernelCall]:
    """The arithmetic of one optimised HLO module (XLA's ``*after_optimizations.txt``
    dump): one call per instruction of its entry computation that computes, named by what
    XLA runs for it: a fusion by its kind (``kLoop``, ``kOutput``, a custom fusion such as
    ``__ynn_fusion``, YNNPACK's) and the operations fused, a custom call by its target
    (``__onednn$matmul``), else the instruction (``convolution``, ``dot``,
    ``reduce-window``)."""
    computations: dict[str, list[tuple[str, str, str]]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = HLO_COMPUTATION.match(line)
        if header:
            current = header["name"]
            computations[current] = []
            if line.startswith("ENTRY"):
                entry = current
            continue
        if line.strip() == "}":
            current = None
            continue
        found = HLO_INSTRUCTION.match(line) if current else None
        if found:
            computations[current].append((found["op"], found["type"], found["rest"]))
    calls = []
    for op, type_, rest in computations.get(entry, []):
        if op in HLO_LAYOUT:
            continue
        shape = type_.split("{")[0]
        if op == "fusion":
            kind = re.search(r"kind=(\w+)", rest)
            config = re.search(r'"fusion_config":\{"kind":"(\w+)"', rest)
            called = re.search(r"calls=%([\w.\-]+)", rest)
            inner = sorted({inner_op for inner_op, _, _ in
                            computations.get(called[1] if called else "", [])
                            if inner_op not in HLO_LAYOUT})
            if not inner:  # a fused broadcast or copy: moves data
                continue
            kind_name = config[1].strip("_") if config else (kind[1] if kind else "fusion")
            primitive = next((name for name in ("dot", "convolution") if name in inner),
                             "+".join(inner) or "fusion")
            calls.append(KernelCall(library="xla", primitive=primitive, shape=shape,
                                    implementation=f"xla {kind_name}({'+'.join(inner)})"))
        elif op == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', rest)
            name = target[1] if target else "custom-call"
            calls.append(KernelCall(library="xla", primitive=name, shape=shape,
                                    implementation=f"xla custom-call {name}"))
        else:
            calls.append(KernelCall(library="xla", primitive=op, shape=shape,
                                    implementation=f"xla {op}"))
    return calls
