"""Kernel provenance: parsing the libraries' own logs (real oneDNN and MKL lines from this
machine, oneDNN 2.x lines, a real cuDNN 9 and cuBLASLt log from an NVIDIA H100, and a
legacy cuDNN call written from NVIDIA's documented format) and attributing them to
layers."""

import lzma
from pathlib import Path

import pytest

from bitdrift.analysis.kernels import (
    GraphNode,
    KernelCall,
    graph_layer_calls,
    layer_kernels,
    parse_trace,
    signature,
)

DATA = Path(__file__).parents[1] / "data" / "kernels"
LAYERS = [("conv2d", "Conv2D"), ("activation", "Activation"), ("pooling2d", "MaxPooling2D"),
          ("conv2d_1", "Conv2D"), ("flatten_1", "Flatten"), ("dense_1", "Dense"),
          ("dense_3", "Dense")]


def test_tensorflow_onednn_v1_lines_by_their_template():
    """TensorFlow 2.21's oneDNN 3.7 (lines with the `v1` marker): the convolutions are
    oneDNN's sgemm API, whose code path is the header's ISA; Dense logs nothing: Eigen."""
    trace = parse_trace((DATA / "tensorflow_onednn_v1.log").read_text())
    assert trace.header["onednn.isa"] == "Intel AVX2"
    assert trace.header["onednn.nthr"] == "2"
    conv = trace.layers["conv2d"]
    assert [call.implementation for call in conv] == ["gemm_api@avx2", "gemm_api@avx2"]
    assert conv[0].shape == "528x27:27x3" and conv[0].time_ms == pytest.approx(13.6892)
    assert len(trace.layers["conv2d_1"]) == 3
    assert trace.layers["dense_1"] == [] and trace.raw == []
    kernels = layer_kernels(trace, LAYERS, "tensorflow")
    assert kernels["conv2d"]["signature"] == "gemm_api@avx2"
    assert kernels["dense_1"]["signature"] == "eigen"  # a TensorFlow kernel that logs nothing
    assert kernels["activation"]["signature"] == "none"  # computes no sum: nothing expected


def test_torch_onednn_and_mkl_lines():
    """torch 2.13: the 3-channel first convolution runs MKL's sgemm, the second oneDNN's
    BRGEMM convolution (with a weight reorder); Linear runs MKL's sgemm."""
    trace = parse_trace((DATA / "torch_onednn_mkl.log").read_text())
    assert trace.header["onednn.isa"] == "Intel AVX2"
    assert trace.header["mkl.version"].startswith("oneMKL 2024.0")
    kernels = layer_kernels(trace, LAYERS, "torch")
    assert kernels["conv2d"]["signature"] == "mkl sgemm CNR:OFF"
    assert kernels["conv2d_1"]["signature"] == "brg_conv_fwd:avx2+jit:uni"
    assert kernels["dense_1"]["signature"] == "mkl sgemm CNR:OFF"
    mkl = kernels["dense_1"]["calls"][0]
    assert mkl["shape"] == "128x1x320" and mkl["time_ms"] == pytest.approx(0.03636)
    conv = next(c for c in kernels["conv2d_1"]["calls"] if c["primitive"] == "convolution")
    assert conv["shape"].startswith("mb1_ic3oc5_ih16oh16kh5")


def test_onednn_v2_lines_without_template_or_marker():
    trace = parse_trace((DATA / "onednn_v2.log").read_text())
    assert trace.header["onednn.isa"].startswith("Intel AVX-512")
    assert [c.implementation for c in trace.layers["conv2d"]] == ["jit:uni", "jit:avx512_core"]
    assert trace.layers["conv2d"][1].shape.startswith("mb1_ic3oc32")
    assert [c.implementation for c in trace.layers["dense"]] == ["gemm:jit"]
    # A line the parser does not understand is kept raw, never dropped or guessed.
    assert trace.raw == ["dnnl_verbose,exec,cpu,something_new"]


def test_the_issues_v3_line_without_the_v1_marker():
    line = ("onednn_verbose,primitive,exec,cpu,convolution,brgconv:avx2,forward_inference,"
            "src_f32::blocked:acdb::f0 wei_f32::blocked:Acdb8a::f0,,alg:convolution_direct,"
            "mb1_ic3oc32_ih32oh30kh3sh1dh0ph0_iw32ow30kw3sw1dw0pw0,0.13")
    trace = parse_trace(f"bitdrift-layer,begin,c\n{line}\nbitdrift-layer,end,c\n")
    (call,) = trace.layers["c"]
    assert (call.primitive, call.implementation, call.time_ms) == \
        ("convolution", "brgconv:avx2", 0.13)


def test_cudnn_legacy_call_names_its_algorithm():
    trace = parse_trace((DATA / "cudnn_legacy_api.log").read_text())
    (legacy,) = trace.layers["conv2d"]
    assert legacy.implementation == "cudnn CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM"
    assert legacy.shape == "1,3,32,32"


def test_a_real_h100_trace_names_each_layers_engine_and_matmul_algorithm():
    """A traced repeat captured on an NVIDIA H100 (torch 2.11, cuDNN 9.19): a plain torch
    conv, linear and matmul, then a small Keras CNN on torch with bitdrift's markers. The
    expected kernels were read from the log by hand (awk over the ``cudnnBackendExecute``
    blocks and the cuBLASLt ``[Trace]`` lines). Each conv layer's log holds thousands of
    lines and candidate engines from building plans; only the executed plan counts."""
    text = lzma.open(DATA / "h100_torch_traced.log.xz", "rt").read()
    assert text.count("engine_id: type=int; val=") > 400  # the candidates are there
    trace = parse_trace(text)
    names = {layer: [call.implementation for call in calls]
             for layer, calls in trace.layers.items()}
    assert names["conv2d"] == ["cudnn engine 28 tile_size=4 use_tex=0 tf32-allowed"]
    assert names["conv2d_1"] == ["cudnn engine 67 tile_size=9 tilek=0 idx_mode=0 "
                                 "workspace=0 tile_cga_m=4 tile_cga_n=1 tf32-allowed"]
    assert names["torch_conv2d"] == ["cudnn engine 70 tile_size=12 idx_mode=0 tf32-allowed"]
    # Keras' Dense on torch: a cuBLAS SGEMM, which runs cuBLASLt's SSS matmul (one [Api]
    # and one [Trace] line: one call), split over K
    assert names["dense_1"] == ["cublasLt algo 20 tile 64x64 stages 8x5 splitK 33 "
                                "reduction COMPUTE_TYPE"]
    assert names["dense_3"][0].endswith("splitK 36 reduction COMPUTE_TYPE")
    # torch's linear with a bias fuses the bias into the matmul's epilogue
    assert names["torch_dense"] == ["cublasLt algo 11 splitK -1 epilogue bias"]
    assert names["torch_matmul"] == ["cublasLt algo 11"]
    assert [call.shape for call in trace.layers["dense_1"]] == ["128x320"]
    assert trace.layers["conv2d"][0].primitive == "convolution_forward"
    assert trace.layers["conv2d"][0].shape == "3,3,32,32"
    for layer in ("activation", "pooling2d", "flatten_1", "activation_3"):
        assert names[layer] == []
    assert trace.outside == 0 and trace.raw == []
    assert trace.header["cudnn.version"] == "91900"


def test_tf32_is_named_only_when_the_execution_allowed_it():
    def block(function, *lines):
        return [f"I! CuDNN (v91900 56) function {function}() called:",
                *(f"i!     {line}" for line in lines), ""]

    def executed(tf32):
        return [*block("cudnnBackendExecute", "operation: type="
                       "CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:",
                       "engine_id: type=int; val=5;"),
                *block("cudnnBackendExecuteInternal",
                       f"enable_tf32: type=bool; val={tf32};", "engine_id: type=int; val=5;"),
                *block("cudnnBackendExecute",
                       "status: type=cudnnStatus_t; val=CUDNN_STATUS_SUCCESS (0);")]

    text = "\n".join(["bitdrift-layer,begin,a", *executed("false"), "bitdrift-layer,end,a",
                      "bitdrift-layer,begin,b", *executed("true"), "bitdrift-layer,end,b"])
    trace = parse_trace(text)
    assert [c.implementation for c in trace.layers["a"]] == ["cudnn engine 5"]
    assert [c.implementation for c in trace.layers["b"]] == ["cudnn engine 5 tf32-allowed"]


def test_cudnn_blocks_that_ran_nothing_or_cannot_be_read():
    """A workspace query names an algorithm but runs nothing; a warning line inside an
    execution's block does not cut it before its engine; an execution whose plan names no
    engine the parser knows is kept raw, never dropped."""
    text = "\n".join([
        "bitdrift-layer,begin,a",
        "I! CuDNN (v90100 17) function cudnnGetConvolutionForwardWorkspaceSize() called:",
        "i!     algo: type=cudnnConvolutionFwdAlgo_t; val=CUDNN_CONVOLUTION_FWD_ALGO_FFT (4);",
        "I! CuDNN (v90100 17) function cudnnBackendExecute() called:",
        "i!     executionPlan: type=CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:",
        "w!         some warning the library wraps",
        "   at: 0 == newResults",
        "i!             engine_id: type=int; val=12;",
        "bitdrift-layer,end,a",
        "bitdrift-layer,begin,b",
        "I! CuDNN (v99900 1) function cudnnBackendExecute() called:",
        "i!     executionPlan: type=CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:",
        "i!             engineIndexFromTheFuture: type=int; val=3;",
        "bitdrift-layer,end,b",
    ])
    trace = parse_trace(text)
    assert [c.implementation for c in trace.layers["a"]] == ["cudnn engine 12"]
    assert trace.layers["b"] == []
    assert trace.raw == ["I! CuDNN (v99900 1) function cudnnBackendExecute() called:"]


def test_attribution_on_a_hand_built_two_layer_model():
    """Calls between a layer's markers are that layer's; calls outside any layer (weights
    reordered at load) are counted, not given to a layer; a marker's end closes only its
    own layer."""
    text = "\n".join([
        "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,a,,,1x2,0.1",
        "bitdrift-layer,begin,first",
        "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:sse41,forward_inference,a,,,p,0.2",
        "bitdrift-layer,end,first",
        "bitdrift-layer,begin,second",
        "MKL_VERBOSE SGEMM(N,N,4,1,8,0x1,0x2,4,0x3,8,0x4,0x5,4) 1.5us CNR:AVX2 Dyn:1 "
        "FastMM:1 TID:0  NThr:1",
        "onednn_verbose,v1,primitive,exec,cpu,inner_product,gemm:jit,forward_inference,a,,,q,0.3",
        "bitdrift-layer,end,second",
    ])
    trace = parse_trace(text)
    assert trace.outside == 1
    assert [c.implementation for c in trace.layers["first"]] == ["jit:sse41"]
    assert [c.implementation for c in trace.layers["second"]] == ["mkl sgemm CNR:AVX2",
                                                                  "gemm:jit"]
    layers = [("first", "Conv2D"), ("second", "Dense"), ("third", "Dense")]
    kernels = layer_kernels(trace, layers, "torch")
    assert kernels["second"]["signature"] == "gemm:jit+mkl sgemm CNR:AVX2"
    assert kernels["third"]["signature"] == "aten"  # torch's own kernels log nothing
    assert layer_kernels(trace, layers, "torch", "gpu")["third"]["signature"] == "unknown"
    assert layer_kernels(trace, layers, "jax")["third"]["signature"] == "unknown"
    assert signature([]) == ""


@pytest.fixture(scope="module")
def small_model(small_model_copy, tmp_path_factory):
    return small_model_copy(tmp_path_factory.mktemp("traced"))


# Tokens of oneDNN's kernel names and the CPU flag each one needs (avx10_1_512 is oneDNN's
# name for AVX-512 on recent CPUs; avx512_core and avx512 contain "avx", which needs avx).
ISA_TOKENS = {"amx": "amx_tile", "avx10_1_512": "avx512f", "avx512": "avx512f",
              "avx2": "avx2", "avx": "avx"}


def cpu_flags() -> set[str]:
    """This machine's CPU flags as the kernel reports them (/proc/cpuinfo)."""
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def isa_tokens(name: str) -> set[str]:
    return {token for token in ISA_TOKENS if token in name.lower()}


def _traced(model, dataset, tmp_path, backend, env, kernels=True, tag=""):
    from bitdrift.record.reader import Record
    from bitdrift.run.inference import infer

    device = {"accelerator": "cpu", "threads": 2, "batch_size": 1, "precision": "float32",
              "env": env, "repeats": 1, "external": False, "backend": backend}
    out = tmp_path / f"{backend}{tag}{kernels}.h5"
    with open(tmp_path / "log", "w") as log:
        infer(model_name="small", device_name="d", device=device, model_path=model,
              dataset_path=dataset, samples=[0, 6], out=out, log=log, kernels=kernels)
    with Record(out) as record:
        outputs = [record.tensor(sample, info).values for sample in (0, 6)
                   for info in record.layers(sample)]
        return outputs, record.kernels


@pytest.mark.parametrize("backend", ["tensorflow", "torch"])
def test_a_traced_repeat_names_kernels_this_cpu_can_run_and_the_isa_cap_changes_them(
        small_model, tmp_path, backend):
    """Real traced repeats (fresh processes, the libraries' logs at the file-descriptor
    level), as properties that hold on any x86-64 CPU with AVX2 or more:
    - every Conv and Dense layer has a named kernel (no `unknown`);
    - every ISA a oneDNN kernel name carries is one this CPU's flags have;
    - capping oneDNN at SSE4.1 changes the second convolution's kernel, and no oneDNN
      kernel of the capped run names an ISA above SSE4.1 (its header says SSE4.1);
    - logging changes no output bit: the traced outputs equal the measured ones, and the
      record equals one written without tracing."""
    import numpy as np

    dataset, model = small_model
    flags = cpu_flags()
    assert "avx2" in flags, "this test needs an AVX2 CPU (the cap must have room to act)"
    outputs, traced = _traced(model, dataset, tmp_path, backend, {})
    untraced, none = _traced(model, dataset, tmp_path, backend, {}, kernels=False)
    assert none is None
    assert all(np.array_equal(a, b) for a, b in zip(outputs, untraced, strict=True))
    _, capped = _traced(model, dataset, tmp_path, backend, {"ONEDNN_MAX_CPU_ISA": "SSE41"},
                        tag="sse41")
    for kernels in (traced, capped):
        assert kernels["traced"] and kernels["outputs_match"]
        assert kernels["order"][:3] == ["conv2d", "activation", "pooling2d"]
        compute = [layer for layer, layer_class in kernels["layer_classes"].items()
                   if layer_class in ("Conv2D", "Dense")]
        assert len(compute) == 5
        signatures = {layer: kernels["layers"][layer]["signature"] for layer in compute}
        assert not any(name in ("unknown", "none", "") for name in signatures.values())
    onednn = [call["implementation"] for entry in traced["layers"].values()
              for call in entry["calls"] if call["library"] == "onednn"]
    assert onednn, "oneDNN ran no layer"
    for name in onednn:
        assert {ISA_TOKENS[token] for token in isa_tokens(name)} <= flags, (name, flags)
    capped_names = [call["implementation"] for entry in capped["layers"].values()
                    for call in entry["calls"] if call["library"] == "onednn"]
    assert capped_names and not any(isa_tokens(name) for name in capped_names), capped_names
    assert capped["header"]["onednn.isa"].startswith("Intel SSE4.1")
    assert traced["layers"]["conv2d_1"]["signature"] != capped["layers"]["conv2d_1"][
        "signature"]


def _records(tmp_path):
    """Hand-built float32 devices over two layers (conv, then dense = the output): b
    equals a everywhere; c differs from a at conv and ran another conv kernel; d differs
    from a at dense with a's kernels but 2 threads; e differs from a at dense with the same
    kernels and the same settings (nothing recorded explains it); f is untraced (an
    exported runtime) and differs at conv; g is d's class with a's settings (a against g
    meets the classes of a and d a second time); h records a's layers and kernels, but its
    deployed model's final output differs (the observer check's finding)."""
    import json

    import numpy as np

    from bitdrift.record.hdf5 import DEPLOYED
    from bitdrift.record.reader import open_records
    from bitdrift.record.writer import write_record
    from tests.utils import BASE_ATTRS

    conv = np.arange(8, dtype=np.float32).reshape(1, 1, 8)
    dense = np.linspace(0, 1, 4, dtype=np.float32).reshape(1, 1, 4)
    bump = np.float32(1e-6)
    devices = {  # device: (conv change, dense change, conv kernel, threads, traced)
        "a": (0, 0, "brg_conv_fwd:avx2", 1, True), "b": (0, 0, "brg_conv_fwd:avx2", 1, True),
        "c": (1, 4, "jit:sse41", 1, True), "d": (0, 1, "brg_conv_fwd:avx2", 2, True),
        "e": (0, 2, "brg_conv_fwd:avx2", 1, True), "f": (3, 3, "", 1, False),
        "g": (0, 1, "brg_conv_fwd:avx2", 1, True), "h": (0, 0, "brg_conv_fwd:avx2", 1, True)}
    paths = []
    for device, (conv_change, dense_change, kernel, threads, traced) in devices.items():
        layers = [("conv", conv + conv_change * bump), ("dense", dense + dense_change * bump)]
        calls = {"conv": [{"library": "onednn", "primitive": "convolution",
                           "implementation": kernel}],
                 "dense": [{"library": "mkl", "primitive": "sgemm",
                            "implementation": "mkl sgemm CNR:OFF"}]}
        kernels = {"traced": traced, "order": ["conv", "dense"],
                   "layer_classes": {"conv": "Conv2D", "dense": "Dense"},
                   "layers": {layer: {"signature": calls[layer][0]["implementation"] if traced
                                      else "untraced", "calls": calls[layer] if traced else []}
                              for layer in calls}}
        path = tmp_path / f"{device}.h5"
        attrs = {**BASE_ATTRS, "model": "m", "device": device,
                 "backend": "torch" if traced else "onnxruntime",
                 "device_config": json.dumps({"threads": threads})}
        # Every device records its deployed model's final output (a set where some do not
        # is compared by the instrumented outputs alone, record.reader's one rule)
        content = {"output": layers[-1][1], "layers": layers, "layer_classes": ["Conv2D", "Dense"],
                   DEPLOYED: layers[-1][1] + (5 * bump if device == "h" else 0)}
        write_record(path, attrs, {0: content}, kernels=kernels)
        paths.append(path)
    return open_records(paths)


def test_coverage_against_a_hand_count(tmp_path):
    """divergence.csv's pairs here, each pair of classes once, counted by hand: against
    a, c parts at conv with another kernel (kernels differ), d at dense with the same
    kernels and 2 threads (same kernels, other settings), e at dense with nothing recorded
    apart (unexplained), f is untraced; b never parts; g (d's class) against a is the
    class pair a-d again and not counted. Class pairs add c-d, c-e (kernels differ at
    conv), d-e (same kernels, threads differ), and f's pairs (untraced)."""
    import pandas as pd

    from bitdrift.analysis.divergence import divergence_table
    from bitdrift.analysis.eqc import eqc_tables
    from bitdrift.analysis.explain import coverage

    records = _records(tmp_path)
    divergence = divergence_table(records)
    eqc, _ = eqc_tables(records)
    parted, seen = [], set()
    for row in divergence[(divergence["first_layer"] != "")
                          & (divergence["class_a"] != divergence["class_b"])].itertuples():
        if (row.sample, frozenset((row.class_a, row.class_b))) not in seen:
            seen.add((row.sample, frozenset((row.class_a, row.class_b))))
            parted.append(row)
    assert {(row.device_a, row.device_b) for row in parted} == {
        ("a", "c"), ("a", "d"), ("a", "e"), ("a", "f"), ("c", "d"), ("c", "e"), ("c", "f"),
        ("d", "e"), ("d", "f"), ("e", "f"), ("a", "h"), ("c", "h"), ("d", "h"), ("e", "h"),
        ("f", "h")}  # a-g left out: the classes of a-d
    assert ("a", "g") in set(zip(divergence["device_a"], divergence["device_b"], strict=True))
    expected = {"kernels_differ": 0, "same_kernels_other_settings": 0, "unexplained": 0,
                "untraced": 0, "deployed_only": 0}
    threads = {"a": 1, "b": 1, "c": 1, "d": 2, "e": 1, "g": 1, "h": 1}
    kernel = {"a": "avx2", "b": "avx2", "c": "sse41", "d": "avx2", "e": "avx2", "g": "avx2",
              "h": "avx2"}
    for row in parted:
        a, b = row.device_a, row.device_b
        if {a, b} == {"a", "h"}:  # every recorded layer equal, the deployed outputs not
            assert row.first_layer == "output"
            expected["deployed_only"] += 1
        elif "f" in (a, b):
            expected["untraced"] += 1
        elif row.first_layer == "conv" and kernel[a] != kernel[b]:
            expected["kernels_differ"] += 1
        elif threads[a] != threads[b]:
            expected["same_kernels_other_settings"] += 1
        else:
            expected["unexplained"] += 1
    assert expected["kernels_differ"] and expected["same_kernels_other_settings"] \
        and expected["unexplained"] and expected["untraced"] and expected["deployed_only"]
    (row,) = coverage(records, divergence, eqc)
    assert {key: row[key] for key in expected} == expected
    assert row["first_divergences"] == len(parted)
    traced_total = len(parted) - expected["untraced"] - expected["deployed_only"]
    assert row["share_unexplained"] == pytest.approx(expected["unexplained"] / traced_total)
    # Kernel signatures (a,b,d,e,g share one; c another) against the classes {a,b}, c,
    # {d,g}, e: scikit-learn's adjusted Rand index of the same two labelings.
    from sklearn.metrics import adjusted_rand_score

    classes = eqc.set_index("device").loc[["a", "b", "c", "d", "e", "g", "h"], "eqc"].tolist()
    assert row["adjusted_rand_index_mean"] == pytest.approx(
        adjusted_rand_score(classes, [0, 0, 1, 0, 0, 0, 0]))
    assert row["traced_devices"] == 7
    table = pd.DataFrame(divergence)
    assert set(table.loc[table["device_b"] == "c", "kernels_differ"]) == {"yes"}


def test_explain_can_name_a_kernel(tmp_path):
    """At conv, the classes {a,b,d,e} vs c are decided by conv's kernel; explain --layers
    names kernel.conv (confounded with nothing but the untraced device's backend)."""
    from bitdrift.analysis.explain import device_attributes, explain_table

    records = _records(tmp_path)
    attributes, _ = device_attributes(records[2])
    assert attributes["kernel.conv"] == "jit:sse41"
    assert device_attributes(records[5])[0]["kernel.conv"] == "untraced (onnxruntime)"
    explained, _, _ = explain_table([r for r in records if r.device != "f"], layers=True)
    conv = explained[explained["layer"] == "conv"].iloc[0]
    assert conv["attributes"] == "kernel.conv"


def test_a_kernels_table_names_the_records_without_kernels(tmp_path):
    import subprocess
    import sys

    import numpy as np

    from bitdrift.record.writer import write_record
    from tests.utils import BASE_ATTRS

    _records(tmp_path)
    old = tmp_path / "old.h5"
    write_record(old, {**BASE_ATTRS, "model": "m", "device": "old"},
                 {0: {"output": np.zeros((1, 4), np.float32)}})
    done = subprocess.run([sys.executable, "-m", "bitdrift.cli", "kernels", str(old),
                           "--out", str(tmp_path / "k.csv")], capture_output=True, text=True)
    assert done.returncode == 3 and f"no record carries kernels: {old}" in done.stderr
    done = subprocess.run([sys.executable, "-m", "bitdrift.cli", "kernels", str(old),
                           str(tmp_path / "a.h5"), "--out", str(tmp_path / "k.csv")],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "records without kernels" in done.stderr
    assert str(old) in done.stderr
    import pandas as pd

    table = pd.read_csv(tmp_path / "k.csv")
    assert list(table["layer"]) == ["conv", "dense"]
    assert list(table["implementation"]) == ["brg_conv_fwd:avx2", "mkl sgemm CNR:OFF"]


def test_coverage_from_the_csv_files_equals_the_in_memory_count(tmp_path):
    """The workflow hands coverage the CSVs: a class pair bit-identical at every layer has
    an empty first layer, read back as NaN, and must not count as a divergence (it did with
    pandas 3: 213 counted where there were 181)."""
    from bitdrift.analysis.divergence import divergence_table
    from bitdrift.analysis.eqc import EQC_COLUMNS, eqc_tables
    from bitdrift.analysis.explain import coverage
    from bitdrift.atomic import read_table, write_csv

    records = _records(tmp_path)
    divergence = divergence_table(records)
    eqc, _ = eqc_tables(records)
    assert (divergence["first_layer"] == "").any()  # b never parts from a
    write_csv(divergence, tmp_path / "divergence.csv")
    write_csv(eqc, tmp_path / "eqc.csv")
    from_files = coverage(records, read_table(tmp_path / "divergence.csv",
                                              ["model", "first_layer"], "divergence"),
                          read_table(tmp_path / "eqc.csv", EQC_COLUMNS, "eqc"))
    assert from_files == coverage(records, divergence, eqc)
    parted = divergence[(divergence["first_layer"] != "")
                        & (divergence["class_a"] != divergence["class_b"])]
    # each pair of classes once: a-g meets the classes of a-d again
    assert from_files[0]["first_divergences"] == len(parted) - 1


def test_a_compiled_graph_gives_each_layer_its_nodes():
    """A hand-built graph of an exported runtime: input -> conv (a delegate node writes
    both the conv's and the relu's outputs) -> a reshape that only moves data -> two
    dense nodes (MatMul, Add) -> the output. The conv layer gets the delegate, the relu
    layer the delegate too (it writes the relu's output itself), the unrecorded flatten
    position nothing, the dense layer MatMul and Add in order and not the reshape."""
    def call(name):
        return KernelCall(library="x", primitive=name, implementation=f"x {name}")

    delegate = GraphNode(call("DELEGATE"), inputs=("input", "w1"), outputs=("c", "r"))
    reshape = GraphNode(None, inputs=("r",), outputs=("f",))
    matmul = GraphNode(call("MatMul"), inputs=("f", "w2"), outputs=("m",))
    add = GraphNode(call("Add"), inputs=("m", "b2"), outputs=("d",))
    found = graph_layer_calls([add, reshape, delegate, matmul], ["c", "r", "f", "d"],
                              {0: "conv", 1: "relu", 3: "dense"})
    assert {layer: [c.primitive for c in calls] for layer, calls in found.items()} == {
        "conv": ["DELEGATE"], "relu": ["DELEGATE"], "dense": ["MatMul", "Add"]}
    assert signature(found["dense"]) == "x Add+x MatMul"


# An optimised HLO module as XLA dumps it (JAX 0.10's Dense: its dot handed to YNNPACK, as
# dumped here), with a fused broadcast, a oneDNN custom call and a convolution added by hand


def test_an_xla_module_is_read_as_the_calls_its_entry_computes():
    """By hand: parameters, constants and a fused broadcast move data (no call); a custom
    call is named by its target, a fusion by its kind and the operations it fuses, any
    other instruction by itself; shapes are the results'."""
    from bitdrift.analysis.kernels import xla_module_calls

    calls = xla_module_calls((DATA / "xla_module.hlo.txt").read_text())
    assert [(c.primitive, c.implementation, c.shape) for c in calls] == [
        ("__onednn$matmul", "xla custom-call __onednn$matmul", "f32[2,128]"),
        ("convolution", "xla convolution", "f32[2,32,32,8]"),
        ("dot", "xla ynn_fusion(dot)", "f32[2,128]")]
    assert {c.library for c in calls} == {"xla"}


def test_a_jax_traced_repeat_names_what_xla_compiled_for_each_layer(small_model_copy, tmp_path):
    """A real JAX inference with kernel provenance: every Dense and Conv layer has XLA
    calls for its sum (a dot or a convolution), every ReLU an elementwise loop, the
    Flatten none; the traced repeat computed the measured bits; the dump is gone."""
    from bitdrift.record.reader import Record
    from bitdrift.run.inference import infer

    dataset, model = small_model_copy(tmp_path)
    device = {"accelerator": "cpu", "threads": 1, "batch_size": 2, "precision": "float32",
              "env": {}, "repeats": 1, "external": False, "backend": "jax"}
    out = tmp_path / "jax.h5"
    with open(tmp_path / "log", "w") as log:
        infer(model_name="small", device_name="jax", device=device, model_path=model,
              dataset_path=dataset, samples=[0, 3], out=out, log=log, kernels=True)
    with Record(out) as record:
        kernels = record.kernels
        classes = {info.name: info.class_name for info in record.layers(0) if not info.final}
    assert kernels["traced"] and kernels["outputs_match"]
    for layer, class_name in classes.items():
        calls = kernels["layers"][layer]["calls"]
        primitives = {call["primitive"] for call in calls}
        if class_name in ("Dense", "Conv2D"):
            assert primitives & {"dot", "convolution"} or any(
                "onednn" in p or "matmul" in p for p in primitives), (layer, calls)
            assert all(call["library"] == "xla" for call in calls)
        elif class_name == "Flatten":
            assert kernels["layers"][layer]["signature"] == "none"
    assert not list(tmp_path.glob("**/*.xla"))
