"""PyTorch ``torch.export`` programs (``torch.export.save``: a zip holding
``<name>/archive_format`` and ``<name>/models/*.json``): the file recognised and checked,
the program loaded (:func:`load_program`), its module calls (:func:`module_outputs`) and
its Linear and Conv2d calls read as layers (:func:`file_layers`). Its runtimes
(bitdrift.runtimes.FORMAT_RUNTIMES) run it natively (torch eager, torch.compile,
ExecuTorch: bitdrift.backends.torch_program) or converted (ONNX Runtime, OpenVINO,
LiteRT: bitdrift.backends.torch_program.converted)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bitdrift.errors import BitdriftError, ModelFormatError
from bitdrift.formats import Input

NAME = "pt2"
WHAT = "a PyTorch torch.export .pt2 archive"
# The ATen calls read as layers (file_layers): nn.Linear and nn.Conv2d export as these
LINEAR, CONV2D = "aten.linear.default", "aten.conv2d.default"


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
    # The program read as a runtime reads it (weights only, load_program): an archive torch
    # cannot read, or one that would run code, is refused here as the model file, before
    # any check of its inputs reads its signature
    signature(path)


def signature(path) -> list[Input]:
    """The program's user inputs, from the program :func:`load_program` reads (torch is
    imported here); read once per file version with :func:`check`."""
    try:
        key = _version(path)
    except OSError as error:
        raise ModelFormatError(f"{path}: cannot be read ({error.strerror})") from None
    if key not in _SIGNATURES:
        try:
            program = load_program(path)
        except ProgramError as error:
            raise ModelFormatError(str(error)) from None
        if len(_SIGNATURES) >= 16:
            _SIGNATURES.clear()
        _SIGNATURES[key] = program_signature(program)
    return _SIGNATURES[key]


# {(file, size, mtime): its signature}: detect() checks a file by loading it, and the
# config's checks ask for its signature next; one load serves both
_SIGNATURES: dict[tuple, list[Input]] = {}


def _version(path) -> tuple:
    found = Path(path).stat()
    return str(Path(path).resolve()), found.st_size, found.st_mtime_ns


def program_signature(program) -> list[Input]:
    """A loaded program's user inputs."""
    users = set(program.graph_signature.user_inputs)
    inputs = []
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in users:
            value = node.meta.get("val")
            shape = tuple(dim if isinstance(dim, int) else None for dim in value.shape)
            inputs.append(Input(node.name, shape, str(value.dtype).removeprefix("torch.")))
    return inputs


# -- the program, as torch.export.load reads it --------------------------------------------
class ProgramError(BitdriftError, ValueError):
    """A ``.pt2`` file that is not a torch.export program, or inputs it cannot take."""

    exit_code = 3


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines() or [type(error).__name__])[0][:300]


def load_program(path: str | Path):
    """The ``torch.export.ExportedProgram`` in ``path``, read without running any code the
    file holds (:func:`refuse_code`: a model file is downloaded); ProgramError in one line
    naming the file for one that is missing, damaged, not written by
    ``torch.export.save``, or that would run code. A quantized program (PT2E's
    convert_pt2e, bitdrift.backends.torch_program.pt2e_quantization) calls torch's own
    ``quantized_decomposed`` ops, which torch registers only when their module is
    imported: it is, before the program is read (torch's code, not the file's)."""
    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    path = Path(path)
    what = "not a readable torch.export program (a .pt2 written by torch.export.save)"
    if not path.is_file():
        raise ProgramError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        raise ProgramError(f"{path}: {what}: not a zip archive")
    # One handle for the check and the load: what torch reads is what was checked
    with open(path, "rb") as handle:
        try:
            with zipfile.ZipFile(handle) as archive:
                if not any(name.endswith("/archive_format") for name in archive.namelist()):
                    raise ProgramError(f"{path}: {what}: a zip archive without a "
                                       "torch.export archive_format entry")
                refuse_code(path, archive)
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            raise ProgramError(f"{path}: {what}: {_first_line(error)}") from error
        handle.seek(0)
        # torch.export.load logs the reader's error with its traceback, then tries the
        # older format and raises "check the warnings above": the error is kept, unprinted,
        # and the one line says it
        kept = _KeptErrors()
        quiet = logging.getLogger("torch.export")
        saved = quiet.level, quiet.propagate, quiet.handlers
        quiet.setLevel(logging.WARNING)
        quiet.propagate, quiet.handlers = False, [kept]  # torch gives it a handler of its own
        try:
            with _weights_only():
                return torch.export.load(handle)
        except Exception as error:  # zipfile, pickle, KeyError, RuntimeError from the reader
            cause = kept.errors[0] if kept.errors else error
            while cause.__cause__ or cause.__context__:  # the innermost says what is wrong
                cause = cause.__cause__ or cause.__context__
            raise ProgramError(f"{path}: {what}: {_first_line(cause)}") from error
        finally:
            quiet.setLevel(saved[0])
            quiet.propagate, quiet.handlers = saved[1], saved[2]


class _KeptErrors(logging.Handler):
    """The exceptions a logger was given (its records are not printed)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.errors: list[BaseException] = []

    def emit(self, record) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.errors.append(record.exc_info[1])


# torch.load reads these on every call: forced, every pickle torch.export.load unpickles
# goes through torch's weights-only unpickler, its fallback to a full unpickle of the
# sample inputs (torch._export.serde.serialize.deserialize_torch_artifact) included
FORCE_WEIGHTS_ONLY, FORCE_NO_WEIGHTS_ONLY = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD",
                                             "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")


@contextlib.contextmanager
def _weights_only():
    saved = {key: os.environ.get(key) for key in (FORCE_WEIGHTS_ONLY, FORCE_NO_WEIGHTS_ONLY)}
    os.environ[FORCE_WEIGHTS_ONLY] = "1"
    os.environ.pop(FORCE_NO_WEIGHTS_ONLY, None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def refuse_code(path, archive: zipfile.ZipFile) -> None:
    """ProgramError naming ``path`` and the entry for an archive torch.export.load would
    run code from: a pickle that is not weights only (its sample inputs, a pickled weight
    or constant: torch falls back to a full unpickle), a pickled Python object as a
    constant, compiled code (AOTInductor's shared libraries), or a symbolic shape that is
    no arithmetic (torch parses it with sympy.sympify, which evaluates Python). Checked on
    the archive's entries before torch reads any (mirroring torch.export.pt2_archive.
    _package.load_pt2), so nothing of the file runs."""
    import torch
    from torch.export.pt2_archive import constants as pt2

    def refuse(why: str) -> ProgramError:
        return ProgramError(f"{path}: refused: {why}; bitdrift reads a model file without "
                            "running code it holds (weights only)")

    # torch reads each entry below the archive's own top folder
    entries = {name.partition("/")[2]: name for name in archive.namelist()}
    compiled = sorted(rel for rel in entries if rel.startswith(pt2.AOTINDUCTOR_DIR))
    if compiled:
        raise refuse(f"{compiled[0]} is compiled code (AOTInductor), which loading runs")
    prefix, suffix = pt2.MODELS_FILENAME_FORMAT.split("{}")
    for rel in sorted(entries):
        if not (rel.startswith(prefix) and rel.endswith(suffix)):
            continue
        model = rel[len(prefix):-len(suffix)]
        _check_expressions(refuse, rel, _json(archive, entries[rel]))
        pickled = [pt2.SAMPLE_INPUTS_FILENAME_FORMAT.format(model),
                   f"{pt2.WEIGHTS_DIR}{model}.pt", f"{pt2.CONSTANTS_DIR}{model}.pt"]
        for config_name, folder in ((pt2.WEIGHTS_CONFIG_FILENAME_FORMAT, pt2.WEIGHTS_DIR),
                                    (pt2.CONSTANTS_CONFIG_FILENAME_FORMAT,
                                     pt2.CONSTANTS_DIR)):
            config = _json(archive, entries.get(config_name.format(model)))
            payloads = config.get("config") if isinstance(config, dict) else None
            for name, payload in (payloads or {}).items():
                if not isinstance(payload, dict):
                    continue  # torch refuses the config itself
                file = str(payload.get("path_name", ""))
                if folder == pt2.CONSTANTS_DIR and file.startswith(
                        (pt2.CUSTOM_OBJ_FILENAME_PREFIX, pt2.OPAQUE_OBJ_FILENAME_PREFIX)):
                    raise refuse(f"constant {name!r} ({folder}{file}) is a pickled Python "
                                 "object, which unpickling runs")
                if payload.get("use_pickle"):
                    pickled.append(os.path.join(folder, file))
        for rel_pickle in pickled:
            if rel_pickle not in entries:
                continue  # torch finds none either, and says so
            data = archive.read(entries[rel_pickle])
            if not data:
                continue
            try:
                torch.load(io.BytesIO(data), weights_only=True)
            except pickle.UnpicklingError as error:
                found = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
                raise refuse(f"{rel_pickle} is a pickle that is not weights only" + (
                    f" (it calls {found.group(1)})" if found else
                    f" ({_first_line(error)})")) from None
            except Exception as error:  # a damaged pickle: torch's load says no more
                raise ProgramError(f"{path}: {rel_pickle} cannot be read: "
                                   f"{_first_line(error)}") from None


def _json(archive: zipfile.ZipFile, name: str | None):
    """An entry read as JSON; None where it is missing or no JSON (torch then refuses)."""
    if name is None:
        return None
    try:
        return json.loads(archive.read(name))
    except ValueError:
        return None


# What a symbolic shape torch.export writes is made of (sympy's srepr: "Mul(Integer(2),
# Symbol('s77', positive=True, integer=True))"): sympy's and torch.utils._sympy.functions'
# classes, a size's name (s0, u1), numbers, keyword names, quoted names and numerals, and
# operators. Anything else (an attribute, a builtin, a string of code) would be Python that
# sympy.sympify evaluates.
_TOKEN = re.compile(r"(?P<space>\s+)|(?P<number>[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
                    r"|(?P<keyword>[A-Za-z_][A-Za-z0-9_]*(?==(?!=)))"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<quoted>'(?:[A-Za-z][A-Za-z0-9_]*|[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?)')"
                    r"|(?P<operator>\*\*|//|==|!=|<=|>=|[-+*/%(),<>=&|~])")
_SYMBOL = re.compile(r"[a-z]+[0-9]+|OpaqueUnaryFn_[a-z0-9]+")
_SYMPY_NAMES = frozenset({
    "Symbol", "Integer", "Rational", "Float", "Add", "Mul", "Pow", "Mod", "Max", "Min",
    "Abs", "floor", "ceiling", "sqrt", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality",
    "Unequality", "StrictLessThan", "StrictGreaterThan", "LessThan", "GreaterThan", "And",
    "Or", "Not", "true", "false", "True", "False", "BooleanTrue", "BooleanFalse", "oo",
    "zoo", "nan", "pi", "E", "Infinity", "NegativeInfinity", "NegativeOne", "One", "Zero",
    "Half", "Piecewise", "ExprCondPair", "ITE", "Tuple"})


def _check_expressions(refuse, entry: str, graph) -> None:
    """Each ``expr_str`` of a program's JSON checked to be arithmetic (_TOKEN)."""
    from torch.utils._sympy import functions

    allowed = _SYMPY_NAMES | set(functions.__all__)
    stack = [graph]
    while stack:
        value = stack.pop()
        if isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                if key == "expr_str" and not _arithmetic(item, allowed):
                    raise refuse(f"{entry}: the symbolic shape {str(item)[:80]!r} is no "
                                 "arithmetic (torch evaluates it as Python)")
                stack.append(item)


def _arithmetic(text, allowed: frozenset) -> bool:
    if not isinstance(text, str):
        return False
    at = 0
    for token in _TOKEN.finditer(text):
        if token.start() != at:
            return False
        if token.lastgroup == "name" and token.group() not in allowed and \
                not _SYMBOL.fullmatch(token.group()):
            return False
        at = token.end()
    return at == len(text)


@dataclass(frozen=True)
class ModuleOutput:
    """A recorded module call: its name (the module path, ``@n`` for a later call,
    ``:i`` for one of several tensors), the module's class and the graph node whose value
    it is."""

    name: str
    module_type: str
    node: str


def module_outputs(graph) -> tuple[list[ModuleOutput], dict[str, str]]:
    """The module calls in an exported graph whose outputs are recorded, in the graph's
    (topological) order, and the aliases: {container call: the call recorded for the same
    tensor}. ``graph`` is a torch.fx Graph with ``nn_module_stack`` metadata."""
    members: dict[str, list] = {}
    about: dict[str, tuple[str, str, int]] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue  # placeholders, the output, export's own _guards_fn call
        for depth, (key, (path, module_type)) in enumerate(
                (node.meta.get("nn_module_stack") or {}).items()):
            if not path:
                continue  # the root module: its output is the program's output
            members.setdefault(key, []).append(node)
            call = key.rsplit("@", 1)[1] if "@" in key else ""
            about[key] = (f"{path}@{call}" if call.isdigit() else path, module_type, depth)
    position = {node: index for index, node in enumerate(graph.nodes)}
    by_node: dict = {}
    for key, nodes in members.items():
        inside = set(nodes)
        handed_on = [node for node in nodes if _is_tensor(node)
                     and any(user not in inside for user in node.users)]
        name, module_type, depth = about[key]
        for index, node in enumerate(handed_on):
            label = name if len(handed_on) == 1 else f"{name}:{index}"
            by_node.setdefault(node, []).append((depth, label, module_type))
    recorded, aliases = [], {}
    for node in sorted(by_node, key=position.__getitem__):
        calls = sorted(by_node[node], reverse=True)  # the innermost module names the tensor
        recorded.append(ModuleOutput(calls[0][1], calls[0][2], node.name))
        aliases.update({label: calls[0][1] for _, label, _ in calls[1:]})
    return recorded, aliases


def _is_tensor(node) -> bool:
    import torch

    return isinstance(node.meta.get("val"), torch.Tensor)


def to_numpy(tensor) -> np.ndarray:
    """A tensor's values as numpy, bit for bit (bfloat16 as ml_dtypes' bfloat16)."""
    import torch

    tensor = tensor.detach().cpu().clone()  # never a view of a tensor a later node changes
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes  # numpy has no bfloat16

        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


# -- the program's layers, as the analyses take them ------------------------------------------
def file_layers(path) -> list[dict]:
    """The program's layers as bitdrift.inputs.models.keras_file_layers gives a Keras model's,
    named as the torch_export device records them (module paths, torch_program.
    module_outputs): each user input as an InputLayer, each ``aten.linear`` call as a
    Dense layer (kernel ``weight.T``, (terms, units)), each ``aten.conv2d`` call whose
    padding Keras can name (none, or stride-1 symmetric "same") as a channels-first
    Conv2D (kernel HWIO, as the ONNX loader gives a Conv's); every other call by its
    ATen op, with no weights, so those analyses leave it out. A layer's ``inbound`` is
    the recorded call that hands on its input, else that input's node name (a function
    outside any module: not recorded). ``op_type`` is the module class (Linear, Conv2d),
    ``node`` the graph node, ``input_shape`` its input's shape per sample (None where
    dynamic)."""
    return program_file_layers(load_program(path))


def program_file_layers(program) -> list[dict]:
    """file_layers of a loaded ExportedProgram."""
    module = program.module()
    recorded, _ = module_outputs(module.graph)
    names = {call.node: call.name for call in recorded}
    # the unlifted module's placeholders are the user inputs (its weights are get_attr)
    inputs = [node.name for node in module.graph.nodes if node.op == "placeholder"]
    layers = [{"name": name, "class_name": "InputLayer", "config": {}, "inbound": [],
               "weights": []} for name in inputs]
    # a call fed by one of several program inputs is read by its ATen op alone: the
    # analyses that read "the model input" (inbound None) know one
    several = set(inputs) if len(inputs) > 1 else set()
    for node in module.graph.nodes:
        if node.op != "call_function" or node.name not in names:
            continue
        target = str(node.target)
        source = node.args[0] if node.args and hasattr(node.args[0], "op") else None
        entry = {"name": names[node.name], "class_name": target, "config": {},
                 "inbound": [] if source is None else [_source(source, names)],
                 "weights": [], "node": node.name,
                 "input_shape": [] if source is None else _sample_shape(source)}
        if several.intersection(entry["inbound"]):
            pass
        elif target == LINEAR:
            weight, bias = (_value(module, arg) for arg in _arguments(node, 3)[1:])
            if weight is not None and weight.ndim == 2:
                entry.update(class_name="Dense", op_type="Linear", config={
                    "activation": "linear", "use_bias": bias is not None,
                    "units": int(weight.shape[0])},
                    weights=[np.ascontiguousarray(weight.T)] +
                    ([bias] if bias is not None else []))
        elif target == CONV2D:
            _, weight_node, bias_node, strides, pads, dilations, groups = _arguments(node, 7)
            weight, bias = _value(module, weight_node), _value(module, bias_node)
            strides, pads, dilations = (_pair(value) for value in (strides, pads, dilations))
            padding = _padding(pads, strides, dilations, weight.shape[2:]) \
                if weight is not None and weight.ndim == 4 else None
            if padding is not None:
                kernel = np.ascontiguousarray(weight.transpose(2, 3, 1, 0))  # to HWIO
                entry.update(class_name="Conv2D", op_type="Conv2d", config={
                    "activation": "linear", "use_bias": bias is not None,
                    "filters": int(kernel.shape[-1]), "strides": strides,
                    "dilation_rate": dilations, "padding": padding,
                    "data_format": "channels_first", "groups": int(groups)},
                    weights=[kernel] + ([bias] if bias is not None else []))
        layers.append(entry)
    from bitdrift.record.hdf5 import _sanitize  # named as the record names them

    return [dict(layer, name=_sanitize(layer["name"]),
                 inbound=[_sanitize(name) for name in layer["inbound"]]) for layer in layers]


# aten.conv2d's defaults: (input, weight, bias, stride, padding, dilation, groups)
CONV2D_DEFAULTS = (None, None, None, [1, 1], [0, 0], [1, 1], 1)


def _arguments(node, count: int) -> list:
    """A call's first ``count`` arguments, its keyword ones and ATen's defaults filled in."""
    import torch

    schema = node.target._schema.arguments if isinstance(
        node.target, torch._ops.OpOverload) else []
    values = list(node.args) + [None] * (count - len(node.args))
    for index, argument in enumerate(schema[:count]):
        if argument.name in node.kwargs:
            values[index] = node.kwargs[argument.name]
    if str(node.target) == CONV2D:
        values = [CONV2D_DEFAULTS[index] if value is None else value
                  for index, value in enumerate(values[:count])]
    return values[:count]


def _value(module, node) -> np.ndarray | None:
    """A parameter, buffer or constant a call reads (a get_attr node) as float numpy."""
    if node is None or getattr(node, "op", None) != "get_attr":
        return None
    from functools import reduce

    return to_numpy(reduce(getattr, node.target.split("."), module))


def _sample_shape(node) -> list:
    """A value's shape per sample (the batch axis dropped), None for a dynamic size."""
    value = node.meta.get("val")
    shape = getattr(value, "shape", None) or ()
    return [size if isinstance(size, int) else None for size in list(shape)[1:]]


def _source(node, names: dict) -> str:
    """The recorded call whose value ``node`` is, or a user input's name, else the node's
    own name (no layer has it: the analyses leave a layer so fed out)."""
    return names.get(node.name, node.name)


def _pair(value) -> list[int]:
    values = [int(item) for item in (value if isinstance(value, list | tuple) else [value])]
    return values * 2 if len(values) == 1 else values


def _padding(pads, strides, dilations, kernel_shape) -> str | None:
    """aten.conv2d's padding as Keras names it: valid (none), same (what same pads, both
    sides alike, at stride 1); None for any other."""
    if not any(pads):
        return "valid"
    wanted = [(size - 1) * dilation for size, dilation in zip(kernel_shape, dilations,
                                                               strict=True)]
    if strides == [1, 1] and all(total % 2 == 0 and pad == total // 2
                                 for pad, total in zip(pads, wanted, strict=True)):
        return "same"
    return None
