"""PyTorch's own quantizer as a step: a float ``torch.export`` program (``.pt2``) to an
int8 one by the PT2E flow (torchao's ``prepare_pt2e``, calibration, ``convert_pt2e``) with
``X86InductorQuantizer`` and its default configuration
(``get_default_x86_inductor_quantization_config``: uint8 activations per tensor, int8
weights per output channel, symmetric, for Conv2d and Linear and the ops around them),
re-exported by ``torch.export`` and saved (``torch.export.save``), written atomically.

The quantized program holds ``quantized_decomposed`` quantize/dequantize pairs around
float ops: torch eager (torch_export) runs them as such (fake quantization, float
arithmetic on the dequantized values); torch.compile (torch_inductor) with ``freezing``
lowers the pairs with their Conv2d/Linear to oneDNN's int8 kernels
(``onednn.qconv_pointwise``, ``onednn.qlinear_pointwise``, the record's compiled
kernels say which ran); without freezing Inductor fuses them as float code.

Settings: ``method`` static (activations' scales calibrated on the model's inputs by a
histogram observer) or dynamic (activations' scales computed at run time, Linear only);
``reduce_range`` (7-bit activations, 0..127, for CPUs without VNNI, whose u8 x s8
``vpmaddubsw`` saturates). Each default is the quantizer's own."""

from __future__ import annotations

from pathlib import Path

from bitdrift.errors import ConfigError, ModelFormatError

# {setting: (its values, X86InductorQuantizer's default)}
SETTINGS = {"method": (("static", "dynamic"), "static"),
            "reduce_range": ((False, True), False)}
# each setting's help, for `bitdrift quantize --tool torch`
HELP = {"method": "static (calibrated on --inputs) or dynamic activations",
        "reduce_range": "7-bit activations"}
CALIBRATION_BATCH = 16  # samples a calibration step feeds, where the batch axis is free
NAME = "torch.ao PT2E (X86InductorQuantizer)"
# What a quantized program's nodes are: the ops convert_pt2e writes (torch's own library,
# registered by bitdrift.formats.pt2.load_program before it reads a program)
QUANTIZE_OPS = ("quantize_per_tensor", "quantize_per_channel", "choose_qparams")


def config_key(key: str) -> str:
    return f"quantize.{key}"


def checked_settings(settings: dict, named=config_key) -> dict:
    """``settings`` with the quantizer's defaults filled in; ConfigError in one line
    naming the setting (``named(key)``) for an unknown key or a value not allowed."""
    from bitdrift.backends.quantizers import checked_choices

    return checked_choices(settings, SETTINGS, named, "the torch quantizer")


def calibration_batches(model_path, signature, inputs_path) -> list[list]:
    """The model's inputs file as calibration batches (lists of tensors in the program's
    input order) of CALIBRATION_BATCH samples, or the program's fixed batch
    (bitdrift.backends.quantizers.calibration_batches: the inputs checked first, a
    mismatch one line naming the model, the file and why)."""
    from bitdrift.backends import quantizers
    from bitdrift.backends.torch_program.program import to_tensor

    return [[to_tensor(feed[spec.name]) for spec in signature]
            for feed in quantizers.calibration_batches(model_path, inputs_path, "pt2",
                                                       CALIBRATION_BATCH, "quantization")]


def dynamic_shapes(signature):
    """torch.export's dynamic shapes for the re-export: the float program's own dynamic
    dimensions, with their ranges."""
    import torch

    shapes = []
    for index, spec in enumerate(signature):
        dims = {}
        for axis, (least, most) in spec.dynamic.items():
            bounds = {"max": most} if most is not None else {}
            dims[axis] = torch.export.Dim(f"input{index}_dim{axis}", min=least, **bounds)
        shapes.append(dims or None)
    return tuple(shapes)


def quantize_program(program, batches: list[list], settings: dict, source: str = "the program"):
    """The float ``program`` quantized by PT2E with X86InductorQuantizer, calibrated on
    ``batches``, re-exported: a new ExportedProgram. ModelFormatError naming ``source``
    where a step fails or the quantizer quantized nothing."""
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    from bitdrift.backends.torch_program.program import _first_line, input_signature

    signature = input_signature(program)
    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config(
        is_qat=False, is_dynamic=settings["method"] == "dynamic",
        reduce_range=settings["reduce_range"]))
    step = "prepare_pt2e"
    try:
        prepared = prepare_pt2e(program.module(), quantizer)
        step = "calibration"
        with torch.no_grad():
            for batch in batches:
                prepared(*batch)
        step = "convert_pt2e"
        converted = convert_pt2e(prepared)
        step = "torch.export of the quantized program"
        quantized = torch.export.export(converted, tuple(batches[0]),
                                        dynamic_shapes=dynamic_shapes(signature))
    except Exception as error:  # the quantizer's passes and torch.export raise their own
        raise ModelFormatError(f"{source}: {NAME} cannot quantize it ({step}: "
                               f"{_first_line(error)})") from error
    found = [node for node in quantized.graph.nodes if node.op == "call_function"
             and getattr(node.target, "namespace", None) == "quantized_decomposed"
             and node.target._opname in QUANTIZE_OPS]
    if not found:
        raise ModelFormatError(f"{source}: {NAME} quantized nothing: the program has no op "
                               "it quantizes (Conv2d, Linear, matmul)")
    return quantized


def quantize_model(model_path, out, settings: dict | None = None, inputs_path=None,
                   named=config_key) -> dict:
    """Quantize the float torch.export program at ``model_path`` into ``out`` (a .pt2,
    written atomically): ``settings`` (SETTINGS; the quantizer's defaults where left out;
    a wrong one named by ``named``), static quantization calibrated on ``inputs_path``,
    the model's inputs (dynamic quantization runs them once, to trace). Returns the
    settings used, defaults filled in."""
    import torch

    from bitdrift.atomic import atomic_output
    from bitdrift.backends.torch_program.program import ProgramError, input_signature
    from bitdrift.formats import detect
    from bitdrift.formats.pt2 import load_program

    settings = checked_settings(settings, named)
    if detect(model_path) != "pt2":
        raise ModelFormatError(f"{model_path}: {NAME} takes a torch.export program (.pt2)")
    if inputs_path is None:
        raise ConfigError(f"quantization of {model_path} needs its inputs to calibrate on")
    try:
        program = load_program(model_path)
        signature = input_signature(program)
    except ProgramError as error:
        raise ModelFormatError(str(error)) from error
    batches = calibration_batches(model_path, signature, inputs_path)
    quantized = quantize_program(program, batches, settings, str(model_path))
    with atomic_output(out) as tmp:
        torch.export.save(quantized, str(tmp))
        if not Path(tmp).is_file():
            raise ModelFormatError(f"{model_path}: {NAME} wrote no model")
    return settings
