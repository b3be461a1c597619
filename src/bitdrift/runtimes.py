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
# Inductor, ExecuTorch (bitdrift.formats.pt2)
PROGRAM_RUNTIMES = ("torch_export", "torch_inductor", "executorch")
RUNTIMES = KERAS_RUNTIMES + EXPORTED_RUNTIMES + PROGRAM_RUNTIMES
# The device keys that change a runtime's numerics (its knobs), as the schema names them;
# `explain` takes each as an attribute.
KNOBS = {"jax": ("xla_flags", "matmul_precision"),
         "onnxruntime": ("graph_optimization_level",),
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
