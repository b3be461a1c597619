"""The runtimes bitdrift runs, as data every stage reads: their names (the one list, which
the config schema's ``backend`` enum is checked against), the device keys that change a
runtime's numerics (its knobs), and the frameworks each one's records name. Their code is in
``bitdrift.backends``, one module each, and nothing outside it branches on these names.
"""

# The one list of runtimes: each name has its module in bitdrift.backends; the config schema's
# `backend` enum and explain's frameworks are checked against it (test_backends.py).
KERAS_RUNTIMES = ("tensorflow", "torch", "jax")
EXPORTED_RUNTIMES = ("onnxruntime", "openvino", "litert")
# The runtimes of a torch.export program (.pt2) alone: torch eager, torch.compile's
# Inductor, ExecuTorch (bitdrift.backends.torch_program)
PROGRAM_RUNTIMES = ("torch_export", "torch_inductor", "executorch")
RUNTIMES = KERAS_RUNTIMES + EXPORTED_RUNTIMES + PROGRAM_RUNTIMES
# The device keys that change a runtime's numerics (its knobs), as the schema names them;
# `explain` takes each as an attribute.
KNOBS = {"jax": ("xla_flags", "matmul_precision"),
         "onnxruntime": ("graph_optimization_level", "session_config"),
         "openvino": ("execution_mode", "inference_precision_hint"),
         "litert": ("op_resolver",),
         "torch_inductor": ("inductor_options",)}
# Version keys of a framework (fingerprint `versions`): on a record of another backend they
# say only what the process happened to load, never what computed the result.
FRAMEWORKS = {"tensorflow": "tensorflow", "torch": "torch", "jax": "jax", "jaxlib": "jax",
              "onnxruntime": "onnxruntime", "openvino": "openvino", "litert": "litert",
              "executorch": "executorch", "torch_export": "torch_export",
              "torch_inductor": "torch_inductor"}
# The frameworks whose versions a runtime's own records name besides its own: the
# runtimes of a .pt2 program run torch (its `torch*` keys)
USES = {"torch_export": ("torch",), "torch_inductor": ("torch",), "executorch": ("torch",)}

# The format x runtime matrix, by format (bitdrift.formats names each): the runtimes that
# run a model file of the format, in the order a refusal lists them. Each runtime module
# opens what it runs here by its SESSIONS (bitdrift.backends; test_backends.py checks both
# against each other). A Keras model runs on Keras' own runtimes and, exported, on the
# exported ones; an ONNX model on torch_export converted by onnx2torch, and on litert
# converted twice (onnx2torch, then litert-torch); a .pt2 program natively on its own
# runtimes and converted on the exported ones.
FORMAT_RUNTIMES = {
    "keras": ("tensorflow", "torch", "jax", "onnxruntime", "openvino", "litert"),
    "onnx": ("onnxruntime", "openvino", "torch_export", "litert"),
    "pt2": ("torch_export", "torch_inductor", "executorch", "onnxruntime", "openvino",
            "litert"),
    "tflite": ("litert",),
}
# The runtimes that feed each input of a model of several by its name (a .npz of one array
# per input), by format; the others refuse such a model (a Keras model's inputs come from a
# dataset)
SEVERAL_INPUTS = {"onnx": ("onnxruntime", "openvino", "torch_export"),
                  "pt2": ("torch_export",)}

# The least x86 instruction set each runtime's wheels need (measured under QEMU 7.2:
# without AVX TensorFlow dies of an illegal instruction and jaxlib refuses to start; below
# SSE4.2, on Conroe, numpy 2 itself (x86-64-v2) and so every runtime dies the same way;
# bitdrift.emulation.cpus)
X86_BASELINE = "sse4_2"
X86_NEEDS = {"tensorflow": "avx", "jax": "avx", "torch": X86_BASELINE,
             "onnxruntime": X86_BASELINE, "openvino": X86_BASELINE, "litert": X86_BASELINE,
             "torch_export": X86_BASELINE, "torch_inductor": X86_BASELINE,
             "executorch": X86_BASELINE}
# Runtimes with an aarch64 CPU wheel on PyPI that the emulated Arm CPU's userland can hold,
# and the wheels each needs (bitdrift.emulation.aarch64). torch's aarch64 wheel on PyPI
# (2.13.0) is its CUDA build.
AARCH64_WHEELS = {"litert": ("ai-edge-litert",), "onnxruntime": ("onnxruntime", "onnx"),
                  "openvino": ("openvino",), "tensorflow": ("tensorflow", "keras"),
                  "jax": ("jax", "jaxlib", "keras")}
# What the userland holds unless more is asked for (TensorFlow's aarch64 wheels take 1.6
# GB, JAX's 0.6 GB)
AARCH64_DEFAULT = ("litert", "onnxruntime")
# The host's distribution that pins an aarch64 wheel of another name (the x86 host runs
# TensorFlow's CPU-only build, tensorflow-cpu; on aarch64 `tensorflow` is the CPU build)
HOST_DISTRIBUTIONS = {"tensorflow": ("tensorflow", "tensorflow-cpu")}

# On the CPU, what a framework runs when no logging library is called: TensorFlow's Eigen
# kernels, torch's own ATen kernels (its float16/bfloat16 convolutions and matmuls on CPUs
# without native support); neither logs. On a GPU, a silent layer stays unknown
# (bitdrift.analysis.kernels).
SILENT_CPU_KERNELS = {"tensorflow": "eigen", "torch": "aten"}

# The settings of ONNX Runtime's own quantizer (onnxruntime.quantization, run by
# bitdrift.backends.exported.onnx_quantization): {setting: (its values, ORT's default)},
# and the settings each method takes (dynamic quantization's activations are uint8)
QUANTIZATION_SETTINGS = {
    "method": (("dynamic", "static"), "dynamic"),
    "weight_type": (("QInt8", "QUInt8"), "QInt8"),
    "activation_type": (("QInt8", "QUInt8"), "QInt8"),
    "per_channel": ((False, True), False),
    "reduce_range": ((False, True), False),  # 7-bit weights: AVX2's vpmaddubsw cannot clip
    "format": (("QDQ", "QOperator"), "QDQ"),
    "calibrate_method": (("MinMax", "Entropy", "Percentile"), "MinMax"),
}
QUANTIZATION_METHODS = {
    "dynamic": ("method", "weight_type", "per_channel", "reduce_range"),
    "static": tuple(QUANTIZATION_SETTINGS),
}

# The quantizers (config key models.NAME.quantize.tool; bitdrift.backends.quantizers):
# {tool: (its module, the float model formats it takes, the runtimes that run what it
# writes)}; the suffix of the file each writes is in bitdrift.paths.QUANTIZED_SUFFIXES.
# A quantized model runs on its file's own runtimes alone: converting it (onnx2torch, the
# ONNX-to-LiteRT path) has no quantized ops; a user's quantized `file` is tried on every
# runtime of its format, and one that cannot run it fails that device in one line.
# Each module has checked_settings(settings, named) and quantize_model(model_path, out,
# settings, inputs_path, named), SETTINGS and HELP (the command's options), and imports
# its runtime only inside them.
QUANTIZERS = {
    "onnxruntime": ("bitdrift.backends.exported.onnx_quantization", ("onnx",),
                    ("onnxruntime", "openvino")),
    "openvino": ("bitdrift.backends.exported.openvino_quantization", ("onnx",),  # NNCF
                 ("onnxruntime", "openvino")),
    # the TFLite converter's post-training quantization of a Keras model, Keras' LiteRT
    # export's own conversion (a .pt2's litert-torch conversion has no calibrated int8 path)
    "litert": ("bitdrift.backends.exported.litert_quantization", ("keras",), ("litert",)),
    "torch": ("bitdrift.backends.torch_program.pt2e_quantization", ("pt2",),
              ("torch_export", "torch_inductor", "executorch")),
}
DEFAULT_QUANTIZER = "onnxruntime"
