"""What the Keras backends share: importing Keras on one backend in a process."""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np

from bitdrift.jobs import framework_imported


def import_keras(backend: str):
    """Import Keras with ``backend``; refuse if Keras was already loaded with another."""
    if "keras" in sys.modules:
        keras = sys.modules["keras"]
        if keras.backend.backend() != backend:
            raise RuntimeError(f"Keras already loaded with backend {keras.backend.backend()!r}, "
                               f"cannot switch to {backend!r} in this process")
        framework_imported()
        return keras
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    keras = importlib.import_module("keras")
    if backend != "tensorflow":
        # Keras' serialisation asks whether TensorFlow is installed (`tf.available`) and
        # imports it to find out: a torch process would load TensorFlow (seconds of
        # start-up, and a TensorFlow version in a torch device's fingerprint). A process
        # of another backend never uses it, so Keras is told it is absent.
        from keras.src.utils import module_utils

        if "tensorflow" not in sys.modules:
            module_utils.tensorflow._available = False
    framework_imported()
    return keras


# Modules Keras imports if they are installed and works without (each import is in a
# `try: ... except ImportError`): its scikit-learn wrapper, matplotlib for its image
# gallery, pandas for DataFrame inputs, and the frameworks of the other backends.
# A worker process of one backend uses none of them; leaving them out halves its import
# (TensorFlow 7.5 -> 3.2 s, torch 6.7 -> 4.0 s, JAX 4.4 -> 1.8 s; benchmarks/startup.py).
OPTIONAL_MODULES = ("sklearn", "matplotlib", "pandas", "jax", "torch", "tensorflow")


def preimport(backend: str) -> None:
    """What a worker process of ``backend`` imports before its job (bitdrift.run.workers):
    Keras on the backend, with the optional modules it does not use marked absent
    (``sys.modules[name] = None`` makes ``import name`` raise ImportError). Only worker
    processes and the workflow's jobs of one backend (training, export) call this: a
    process that later wants matplotlib must not."""
    for name in OPTIONAL_MODULES:
        if name != backend and name not in sys.modules:
            sys.modules[name] = None
    import_keras(backend)


def keras_environment(backend: str) -> dict:
    return {"KERAS_BACKEND": backend}


def members(backend: str):
    """(environment, preimport, import_keras) of a Keras backend whose process needs
    nothing set but Keras' own backend variable: tensorflow and torch."""
    return (lambda device: keras_environment(backend), lambda: preimport(backend),
            lambda: import_keras(backend))


def open_session(runtime, job: dict, name: str):
    """The job's ``.keras`` model on a Keras backend: cast to the device's precision, built
    in the runtime's strategy scope, with a probe returning every recorded layer."""
    from bitdrift.analysis.accumulation.probes import probe_output, probe_spec
    from bitdrift.backends import Session
    from bitdrift.inputs.models import cast_model, layer_probe, register_layers

    device = job["device"]
    # a runtime that logs no kernel per call describes what each layer compiled (JAX)
    attach_trace = runtime.trace_layers(job) if job.get("trace") and \
        hasattr(runtime, "trace_layers") else None
    keras = runtime.import_keras()
    runtime.configure_threads(device.get("threads"))
    if hasattr(runtime, "configure_device"):  # a runtime's own switches (torch's TF32)
        runtime.configure_device(device)
    accelerator = runtime.check_accelerator(name, device)
    register_layers(keras)
    with runtime.strategy_scope(accelerator):
        model = keras.saving.load_model(job["model_path"], compile=False)
        model = cast_model(keras, model, device["precision"])
        kernels = unmark = None
        if job.get("trace"):
            unmark = mark_layers(model)
            if attach_trace is not None:
                kernels = attach_trace(model)
        if job["layers"]:
            probe, layers = layer_probe(keras, model)
        else:
            probe, layers = model, []
    # The first repeat also hands over what the effective-precision check needs (the
    # Dense/Conv layers' settings and weights as the device had them): the parent checks
    # in NumPy, with no framework loaded.
    checked = checked_layers(keras, model, [layer for layer, _ in layers]) \
        if job.get("fingerprint", True) else {}

    def run(batch):
        outputs = probe(batch, training=False)
        outputs = outputs if isinstance(outputs, list | tuple) else [outputs]
        return [keras.ops.convert_to_numpy(value) for value in outputs]

    def final(batch):
        return keras.ops.convert_to_numpy(model(batch, training=False))

    def deployed(batch):
        """The model as a user runs it: its own final output through Keras' predict path
        (a tf.function on TensorFlow, jax.jit on JAX, eager on torch: Keras' defaults)."""
        return keras.ops.convert_to_numpy(model.predict_on_batch(batch))

    recorded = {layer for layer, _ in layers}
    order_layers = {}
    for layer in model.layers:
        if layer.name not in recorded or not hasattr(layer, "kernel"):
            continue
        # a Dense layer is probed on rows of its terms; a Conv2D at its input's own shape
        # (a layer without one input, e.g. shared, is not probed)
        try:
            shape = tuple(layer.kernel.shape)[:1] if type(layer).__name__ == "Dense" \
                else tuple(layer.input.shape)[1:]
        except (AttributeError, ValueError):
            continue
        spec = probe_spec(type(layer).__name__, layer.get_config(), shape,
                          tuple(layer.kernel.shape))
        if spec is not None:
            order_layers[layer.name] = spec

    def order_probe(spec: dict, batch: int):
        """The layer alone, of the model's format, called as the model calls its layers:
        for revealing the order it sums in (bitdrift.analysis.accumulation)."""
        probe_layer = getattr(keras.layers, spec["class_name"])(**spec["config"],
                                                                dtype=model.dtype)
        probe_layer.build((None, *spec["input_shape"]))
        ones = np.ones((batch, *spec["input_shape"]), dtype=model.dtype)

        def call(kernel, bias):
            kernel = kernel.reshape(spec["kernel_shape"])
            probe_layer.set_weights([kernel, bias] if spec["use_bias"] else [kernel])
            return probe_output(spec, keras.ops.convert_to_numpy(probe_layer(
                ones, training=False)))

        return call

    deployed_program = \
        f"the .keras model through Keras predict (jit_compile={model.jit_compile})"
    if job.get("trace"):
        if attach_trace is not None:
            # JAX's layers are wrapped to dump what XLA compiles per layer: no deployed run
            deployed, deployed_program = None, ""
        else:
            deployed = marked_deployed(deployed, unmark)
    return Session(layers=layers, run=run, final=final, accelerator=accelerator,
                   checked=checked, order_layers=order_layers, order_probe=order_probe,
                   kernels=kernels, deployed=deployed, deployed_program=deployed_program)


def marked_deployed(deployed, unmark):
    """A traced job's deployed run: the layers' markers taken off first (a tf.function
    would print them while it traces, not while its kernels run), and the whole call
    between the markers of DEPLOYED_LAYER, so that the kernels the deployed program ran
    are logged apart from the instrumented run's (bitdrift.run.inference.traced_repeat)."""
    from bitdrift.analysis.kernels import DEPLOYED_LAYER

    def call(batch):
        unmark()
        print_marker("begin", DEPLOYED_LAYER)
        try:
            return deployed(batch)
        finally:
            print_marker("end", DEPLOYED_LAYER)

    return call


def print_marker(event: str, layer: str) -> None:
    """A marker line through C's stdio, the stream the kernel libraries print to."""
    import ctypes

    from bitdrift.analysis.kernels import MARKER

    ctypes.CDLL(None).printf(b"%s\n", f"{MARKER},{event},{layer}".encode())


def mark_layers(model):
    """Print a marker line before and after every layer's call, through C's stdio (the
    stream oneDNN, MKL, cuDNN and cuBLASLt print to), so that their kernel lines fall
    between the markers of the layer that made them (bitdrift.analysis.kernels). Eager calls run
    their kernels inside the call, so the attribution is exact. Returns a function that
    takes the markers off again."""
    import ctypes

    from bitdrift.analysis.kernels import MARKER

    printf = ctypes.CDLL(None).printf

    def marked(layer, call):
        begin = f"{MARKER},begin,{layer.name}".encode()
        end = f"{MARKER},end,{layer.name}".encode()

        def wrapper(*args, **kwargs):
            printf(b"%s\n", begin)
            try:
                return call(*args, **kwargs)
            finally:
                printf(b"%s\n", end)

        return wrapper

    originals = {layer: layer.call for layer in model.layers}
    for layer in model.layers:
        layer.call = marked(layer, layer.call)

    def unmark() -> None:
        for layer, call in originals.items():
            layer.call = call

    return unmark


def checked_layers(keras, model, recorded: list[str]) -> dict:
    """{layer: (spec, weights)} of the layers the effective-precision check recomputes:
    Dense and Conv layers fed by the model input or by a recorded layer. Weights in the
    model's (cast) format, as the device computed with them."""
    from bitdrift.analysis.effective_precision import layer_spec

    inputs = {layer.name for layer in model.layers
              if isinstance(layer, keras.layers.InputLayer)}
    checked = {}
    for entry in model.get_config().get("layers", []):
        nodes = entry.get("inbound_nodes") or []
        args = nodes[0].get("args", []) if len(nodes) == 1 else []
        history = args[0].get("config", {}).get("keras_history") \
            if len(args) == 1 and isinstance(args[0], dict) else None
        if not history:
            continue
        source = history[0]
        if source not in inputs and source not in recorded:
            continue
        layer = model.get_layer(entry["config"]["name"])
        spec = layer_spec(layer, None if source in inputs else source)
        if spec is not None and layer.name in recorded:
            checked[layer.name] = (spec, layer.get_weights())
    return checked


# -- a repro script's code (bitdrift.run.repro) ---------------------------------------------
# The Keras layer alone, after the script's header (which defines x, weights and BATCH):
# built from its config, its weights set, run on whole batches into ``out``. ``before`` and
# ``after`` are the runtime's thread settings (SCRIPT_THREADS) around ``import keras``.
SCRIPT = '''{before}import keras
{after}{float64}
config = {config}
layer = keras.layers.{class_name}.from_config(config)
layer.build((None,) + x.shape[1:])
layer.set_weights(weights)
out = np.concatenate([keras.ops.convert_to_numpy(layer(x[start:start + BATCH]))
                      for start in range(0, len(x), BATCH)])
'''
# Keras computes float64 in float32 on torch and JAX unless told (bitdrift.inputs.models)
FLOAT64 = ('from keras.src.backend.common import dtypes\n\n'
           'dtypes.BIT64_TO_BIT32_DTYPE["float64"] = "float64"\n')
SCRIPT_LAYER = None  # a Keras script reads the weights as .npy


def minimal_config(config: dict) -> dict:
    """What the layer computes: its config without initialisers, regularisers,
    constraints and Keras' bookkeeping, the dtype policy as its name."""
    kept = {key: value for key, value in config.items()
            if not key.endswith(("_initializer", "_regularizer", "_constraint"))
            and key not in ("trainable", "shared_object_id")}
    dtype = kept.get("dtype")
    if isinstance(dtype, dict):
        kept["dtype"] = dtype.get("config", {}).get("name", "float32")
    return kept


def script_code(runtime, device: dict, layer) -> str:
    """The code of ``runtime``'s repro script for a Keras ``layer`` (class_name, config)
    with the device's threads (the runtime's SCRIPT_THREADS: code before and after
    ``import keras``, of ``n`` threads) and precision."""
    import pprint

    from bitdrift.inputs.models import rewrite_dtypes

    threads = device.get("threads")
    before, after = (code.format(n=threads) if threads else "" for code in runtime.SCRIPT_THREADS)
    config = rewrite_dtypes(minimal_config(layer.config), device["precision"])
    return SCRIPT.format(
        before=before, after=after,
        float64=FLOAT64 if device["precision"] == "float64" else "",
        class_name=layer.class_name,
        config=pprint.pformat(config, width=88 - 9, sort_dicts=False).replace(
            "\n", "\n" + " " * 9))


def script_refusal(device: dict, layer) -> str | None:
    """Nothing refuses a Keras layer's script on a Keras runtime."""
    return None
