"""PyTorch ``torch.export`` programs (``torch.export.save``: a zip holding
``<name>/archive_format`` and ``<name>/models/*.json``), run natively by torch eager
(``torch_export``), torch.compile (``torch_inductor``) and ExecuTorch (``executorch``, a
lowering each repeat makes), and through a conversion by ONNX Runtime and OpenVINO
(:func:`open_session`: ``torch.onnx.export(dynamo=True)``, ``openvino.convert_model``).
A conversion is named in the record's fingerprint (converter, versions, options); a
failed one fails only the devices that need it, its reason in the failure record."""

from __future__ import annotations

import zipfile
from pathlib import Path

from bitdrift.errors import ModelFormatError
from bitdrift.formats import Input

NAME = "pt2"
WHAT = "a PyTorch torch.export .pt2 archive"
RUNTIMES = ("torch_export", "torch_inductor", "executorch", "onnxruntime", "openvino")
# a program of several inputs: each fed by its name (a .npz of one array per input)
SEVERAL_INPUTS = ("torch_export",)
NATIVE = ("torch_export", "torch_inductor", "executorch")  # each opens the file itself
file_layers = None  # no reading of its layers' weights yet (repro, effective precision)


def _names(path) -> list[str]:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return []


def recognise(path, head: bytes) -> bool:
    return head.startswith(b"PK") and any(name.endswith("/archive_format")
                                          for name in _names(path))


def check(path) -> None:
    names = _names(path)
    if not any("/models/" in name and name.endswith(".json") for name in names):
        raise ModelFormatError(f"{path}: a damaged torch.export .pt2 archive (no "
                               "models/*.json)")
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError) as error:
        raise ModelFormatError(f"{path}: a damaged torch.export .pt2 archive ({error})") \
            from error
    if bad is not None:
        raise ModelFormatError(f"{path}: a damaged torch.export .pt2 archive ({bad} fails "
                               "its checksum)")


def signature(path) -> list[Input]:
    """The program's user inputs, from torch.export.load (torch is imported here)."""
    import torch

    try:
        program = torch.export.load(str(path))
    except Exception as error:  # torch raises many kinds for a damaged archive
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ModelFormatError(f"{path}: torch.export.load cannot read it ({first})") \
            from error
    users = set(program.graph_signature.user_inputs)
    inputs = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in users:
            value = node.meta.get("val")
            shape = tuple(dim if isinstance(dim, int) else None for dim in value.shape)
            inputs.append(Input(node.name, shape, str(value.dtype).removeprefix("torch.")))
    return inputs


def open_session(runtime, job: dict, name: str):
    """A Session of ``runtime`` on the job's program: a torch runtime's own
    (``open_session(job, name)``); ONNX Runtime and OpenVINO on the program converted in
    this process (:func:`converted_session`)."""
    if runtime.NAME in NATIVE:
        return runtime.open_session(job, name)
    return converted_session(runtime, job, name)


def converted_session(runtime, job: dict, name: str):
    """The program converted for ``runtime`` (ONNX for onnxruntime, OpenVINO's own
    conversion for openvino), compiled with the device's settings. The layers recorded
    are the module calls the conversion keeps under their module paths (the eager run's
    names, torch_conversions.onnx_module_outputs / openvino_module_outputs), the final
    output last; the others (fused away, or without a value of their own) are listed as
    unmapped, never guessed. The converted file without the added outputs is the model
    as deployed (the observer check)."""
    import shutil
    import tempfile

    from bitdrift.backends.torch_export import load, program_layers

    device = job["device"]
    accelerator = runtime.check_accelerator(name, device)
    accelerator["model_format"] = NAME
    program = load(job)
    layers, _ = program_layers(program)
    # the converted files live until compiled (a worker ends by os._exit: no atexit)
    folder = tempfile.mkdtemp(prefix="bitdrift-pt2-")
    try:
        return _converted(runtime, job, name, program, layers, accelerator, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _converted(runtime, job, name, program, layers, accelerator, folder):
    import os

    from bitdrift.backends import Session
    from bitdrift.backends import torch_conversions as conversions
    from bitdrift.errors import BitdriftError, InferenceError
    from bitdrift.formats.onnx import compile_model

    device = job["device"]
    if runtime.NAME == "onnxruntime":
        import onnx

        conversion = conversions.to_onnx(program, os.path.join(folder, "model.onnx"))
        mapping = conversions.onnx_module_outputs(conversion.model,
                                                  [layer for layer, _ in layers[:-1]])
        instrumented = conversions.with_outputs(conversion.model, list(mapping.values()))
        path = os.path.join(folder, "instrumented.onnx")
        onnx.save(instrumented, path)
        names = [output.name for output in instrumented.graph.output]
        positions = {layer: names.index(value) for layer, value in mapping.items()}
        deployed_path = str(conversion.path)
    elif runtime.NAME == "openvino":
        import openvino

        conversion = conversions.to_openvino(program)
        deployed_path = os.path.join(folder, "deployed.xml")
        openvino.save_model(conversion.model, deployed_path, compress_to_fp16=False)
        conversion.layers = {layer: value for layer, value in conversion.layers.items()
                             if layer in {name for name, _ in layers[:-1]}}
        positions = conversions.openvino_with_outputs(conversion)
        path = os.path.join(folder, "instrumented.xml")
        openvino.save_model(conversion.model, path, compress_to_fp16=False)
    else:
        raise InferenceError(f"device {name!r}: {runtime.NAME} has no conversion of a .pt2 "
                             "program")
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
                   final=instrumented_final, accelerator=accelerator,
                   unmapped=unmapped if job["layers"] else [], deployed=final,
                   deployed_program=f"{Path(job['model_path']).name} converted by "
                                    f"{conversion.converter}, on {runtime.NAME}")

