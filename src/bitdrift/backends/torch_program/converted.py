"""A model run by a runtime of another format, converted by a loader of this package
(bitdrift.backends.torch_program.conversions), as Polygraphy composes one:
``SessionFromOnnx(ModifyOutputs(OnnxFromPath(p)))``. A torch.export program (.pt2) on
ONNX Runtime is "export to ONNX" (:func:`as_onnx`), then ONNX Runtime's runner; on
OpenVINO, OpenVINO's own conversion (:func:`as_openvino`), then its runner; on LiteRT,
litert-torch's conversion, then LiteRT's runner on the .tflite (:func:`program_on_litert`).
An ONNX model on LiteRT is converted twice (:func:`onnx_on_litert`). A conversion is named
in the record's fingerprint (converter, versions, options); a failed one fails only the
devices that need it, its reason in the failure record."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from bitdrift.backends.exported.common import compile_model
from bitdrift.backends.exported.tflite_file import file_session
from bitdrift.backends.torch_program import conversions
from bitdrift.backends.torch_program.eager import checked_layers, load, program_layers
from bitdrift.errors import InferenceError
from bitdrift.formats.pt2 import NAME, program_file_layers


@contextlib.contextmanager
def _program(runtime, job: dict, name: str):
    """(program, its recorded layers, the fingerprint's accelerator begun, a folder for
    the converted files): the folder lives until the runtime has compiled them (a worker
    ends by os._exit: no atexit)."""
    accelerator = runtime.check_accelerator(name, job["device"])
    accelerator["model_format"] = NAME
    program = load(job)
    layers, _ = program_layers(program)
    folder = tempfile.mkdtemp(prefix="bitdrift-pt2-")
    try:
        yield program, layers, accelerator, folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- the loaders: a program as the file a runtime compiles ------------------------------------
def as_onnx(program, layers, folder):
    """The program exported to ONNX (conversions.to_onnx), the module calls the export
    keeps made graph outputs (conversions.onnx_module_outputs): (conversion, the
    instrumented file, the deployed file, {layer: its output's position})."""
    import onnx

    conversion = conversions.to_onnx(program, os.path.join(folder, "model.onnx"))
    mapping = conversions.onnx_module_outputs(conversion.model,
                                              [layer for layer, _ in layers[:-1]])
    instrumented = conversions.with_outputs(conversion.model, list(mapping.values()))
    path = os.path.join(folder, "instrumented.onnx")
    onnx.save(instrumented, path)
    names = [output.name for output in instrumented.graph.output]
    positions = {layer: names.index(value) for layer, value in mapping.items()}
    return conversion, path, str(conversion.path), positions


def as_openvino(program, layers, folder):
    """The program converted by OpenVINO (conversions.to_openvino), the module calls the
    conversion keeps made outputs (conversions.openvino_with_outputs): (conversion, the
    instrumented file, the deployed file, {layer: its output's position})."""
    import openvino

    conversion = conversions.to_openvino(program)
    deployed_path = os.path.join(folder, "deployed.xml")
    openvino.save_model(conversion.model, deployed_path, compress_to_fp16=False)
    conversion.layers = {layer: value for layer, value in conversion.layers.items()
                         if layer in {name for name, _ in layers[:-1]}}
    positions = conversions.openvino_with_outputs(conversion)
    path = os.path.join(folder, "instrumented.xml")
    openvino.save_model(conversion.model, path, compress_to_fp16=False)
    return conversion, path, deployed_path, positions


# -- the sessions ------------------------------------------------------------------------------
def program_session(runtime, job: dict, name: str, loader):
    """The program converted by ``loader`` (as_onnx, as_openvino) and compiled by
    ``runtime`` with the device's settings. The layers recorded are the module calls the
    conversion keeps under their module paths (the eager run's names), the final output
    last; the others (fused away, or without a value of their own) are listed as
    unmapped, never guessed. The converted file without the added outputs is the model as
    deployed (the observer check)."""
    with _program(runtime, job, name) as (program, layers, accelerator, folder):
        return _compiled(runtime, job, name, program, layers, accelerator,
                         loader(program, layers, folder))


def _compiled(runtime, job, name, program, layers, accelerator, converted):
    from bitdrift.backends import Session
    from bitdrift.errors import BitdriftError

    device = job["device"]
    conversion, path, deployed_path, positions = converted
    accelerator.update(conversion.fingerprint())
    try:
        compiled, _ = compile_model(runtime, path, device, accelerator, False, name,
                                    shown=job["model_path"])
        deployed_run, _ = compile_model(runtime, deployed_path, device, dict(accelerator),
                                        False, name, shown=job["model_path"])
    except BitdriftError:
        raise
    except Exception as error:
        raise InferenceError(f"device {name!r}: {runtime.NAME} cannot run the converted "
                             f"{job['model_path']}: {error}") from error
    final_layer = layers[-1]
    recorded = [(layer, kind) for layer, kind in layers[:-1] if layer in positions]
    unmapped = [layer for layer, _ in layers[:-1] if layer not in positions]
    checked, unrevealed = {}, {}
    if job["layers"]:  # the converted runtimes run float32 (docs/pytorch-models.md)
        checked, probed, unrevealed = checked_layers(
            program_file_layers(program), [layer for layer, _ in recorded + [final_layer]],
            "float32")
        unrevealed.update({layer: f"the program converted by {conversion.converter}: its "
                                  "node alone is not probed" for layer in probed})
    accelerator["per_layer"] = (f"the module calls {conversion.converter} keeps under their "
                                "module paths; the others are unmapped")

    def final(batch):
        return deployed_run(batch)[0]

    def run(batch):
        outputs = compiled(batch)
        if not job["layers"]:
            return [outputs[0]]
        return [outputs[positions[layer]] for layer, _ in recorded] + [outputs[0]]

    def instrumented_final(batch):
        return compiled(batch)[0]

    return Session(layers=recorded + [final_layer] if job["layers"] else [], run=run,
                   final=instrumented_final, accelerator=accelerator, checked=checked,
                   unrevealed=unrevealed,
                   unmapped=unmapped if job["layers"] else [], deployed=final,
                   deployed_program=f"{Path(job['model_path']).name} converted by "
                                    f"{conversion.converter}, on {runtime.NAME}")


def program_on_litert(runtime, job: dict, name: str):
    """LiteRT on the program converted by litert-torch at the device's batch size
    (tflite_file.file_session on the .tflite): the module calls whose tensor the
    conversion keeps recorded under their module paths (conversions.litert_rename, checked
    against the eager run's values on the first batch), the others unmapped; the final
    output last."""
    with _program(runtime, job, name) as (program, layers, accelerator, folder):
        return _program_on_litert(runtime, job, name, program, layers, accelerator, folder)


def _program_on_litert(runtime, job, name, program, layers, accelerator, folder):
    from bitdrift.backends.torch_program.program import EagerRunner
    from bitdrift.inputs.datasets import first_batch

    batch = job["device"]["batch_size"]
    first = first_batch(job["dataset_path"], batch)
    path = os.path.join(folder, "model.tflite")
    conversion = conversions.to_litert(program, path, first)
    accelerator.update(conversion.fingerprint())
    accelerator["model_format"] = NAME
    modules = {layer: layer for layer, _ in layers[:-1]}  # named by their module paths

    def eager():
        values = EagerRunner(program, source=job["model_path"])([first]).layers
        return {layer: values[layer] for layer in modules if layer in values}

    by_module = conversions.litert_rename(layers, modules, eager)

    def rename(tensors, values):
        return by_module(tensors, values) if job["layers"] else ({}, [])

    accelerator["per_layer"] = (f"the module calls whose tensor {conversion.converter} "
                                "keeps, named by their module stack and equal to the eager "
                                "module's output on the first batch; the others are "
                                "unmapped")
    return file_session(runtime, job, name, path, rename=rename, program=(
        f"{Path(job['model_path']).name} converted by {conversion.converter}, on "
        f"{runtime.NAME}"), accelerator=accelerator)


def onnx_on_litert(runtime, job: dict, name: str):
    """A Session of LiteRT (``runtime``: its resolver and threads) on the ONNX model
    converted twice: by onnx2torch to a torch module (conversions.from_onnx), and that by
    litert-torch to a .tflite at the device's batch size (conversions.to_litert); both
    converters and their versions in the fingerprint, a failure of either failing this
    device alone, named. A node's value is recorded under its ONNX value's name where
    litert-torch names a tensor by the onnx2torch module computing it and that tensor's
    value on the first batch equals the module's eager output
    (conversions.litert_rename); the others are unmapped, never guessed."""
    from bitdrift.backends.exported.onnx_file import instrumented
    from bitdrift.backends.torch_program.program import run_graph, to_tensor
    from bitdrift.formats import onnx
    from bitdrift.inputs.datasets import first_batch

    device, path = job["device"], job["model_path"]
    accelerator = runtime.check_accelerator(name, device)
    accelerator["model_format"] = onnx.NAME
    _, layers, _ = instrumented(path)
    batch = device["batch_size"]
    first = first_batch(job["dataset_path"], batch)
    folder = tempfile.mkdtemp(prefix="bitdrift-onnx-litert-")
    try:
        converted_path = os.path.join(folder, "model.tflite")
        try:
            to_torch = conversions.from_onnx(path)
            to_tflite = conversions.to_litert(to_torch.model.eval(), converted_path, first)
        except InferenceError as error:
            raise InferenceError(f"device {name!r}: {error}") from error
        accelerator.update({
            "converter": f"{to_torch.converter}, then {to_tflite.converter}",
            "converter_versions": {**to_torch.versions, **to_tflite.versions},
            "converter_options": {**to_torch.options, **to_tflite.options}})
        # {onnx2torch submodule: the ONNX value its node computes}
        graph = {node.name: node for node in to_torch.model.graph.nodes}
        values = {graph[node].target: value for node, value in to_torch.layers.items()
                  if graph[node].op == "call_module"}

        def eager():
            return run_graph(to_torch.model, [to_tensor(first)],
                             {node: [graph[node].target] for node in to_torch.layers
                              if graph[node].op == "call_module"},
                             list(values), True, path, "float32").layers

        by_module = conversions.litert_rename(layers, values, eager)

        def rename(tensors, found_values):
            return by_module(tensors, found_values) if job["layers"] else ({}, [])

        accelerator["per_layer"] = (
            "the ONNX nodes whose onnx2torch module names a tensor litert-torch keeps, "
            "equal to the module's eager output on the first batch; the others are "
            "unmapped")
        return file_session(runtime, job, name, converted_path, rename=rename,
                            program=f"{Path(path).name} converted by "
                            f"{accelerator['converter']}, on {runtime.NAME}",
                            accelerator=accelerator)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
