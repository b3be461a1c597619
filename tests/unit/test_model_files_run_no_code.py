"""A model file is downloaded: reading it never runs code it holds. A .pt2 that would run
code as torch.export.load reads it (a pickle in its sample inputs, a pickled weight or a
constant that is a pickled Python object: torch unpickles them in full; compiled
AOTInductor code; a symbolic shape that is Python, which torch parses with
sympy.sympify) is refused in one line naming the file and the entry: by the loader, the
format check, the config check and the workflow's dry run, and its code never runs. The
programs torch.export.save writes still load. A Keras model holding Python bytecode (a
Lambda layer) is refused likewise."""

import json
import os
import pickle
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
import yaml

from bitdrift import formats
from bitdrift.config import validate_config
from bitdrift.errors import ConfigError, ModelFormatError
from bitdrift.formats.pt2 import ProgramError, load_program
from tests.utils import snakemake


class Marker:
    """Unpickled, it creates the file ``path``: what a hostile pickle would do."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def program_file(tmp_path_factory):
    """A Linear with a buffer, exported with a dynamic batch (its shapes are symbolic)."""

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)
            self.register_buffer("scale", torch.full((3,), 2.0))

        def forward(self, x):
            return self.linear(x) * self.scale

    torch.manual_seed(0)
    program = torch.export.export(Scaled().eval(), (torch.ones(2, 4),), dynamic_shapes=(
        {0: torch.export.Dim("batch", max=1024)},))
    path = tmp_path_factory.mktemp("pt2") / "model.pt2"
    torch.export.save(program, path)
    return path


def rewritten(source, target, change):
    """``source``'s archive written to ``target`` with its entries ({name below the
    archive's top folder: bytes}) as ``change`` leaves them."""
    with zipfile.ZipFile(source) as archive:
        root = archive.namelist()[0].partition("/")[0]
        entries = {name.partition("/")[2]: archive.read(name) for name in archive.namelist()}
    change(entries)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(f"{root}/{name}", data)
    return target


def _pickled_sample_inputs(entries, marker):
    entries["data/sample_inputs/model.pt"] = pickle.dumps(Marker(marker), protocol=2)


def _payload(entries, config, marker, name=None, path_name=None):
    """A payload of a weights or constants config made a pickle that runs code."""
    found = json.loads(entries[config])
    fqn, payload = next(iter(found["config"].items())) if name is None else (name, {
        "path_name": path_name, "is_param": False, "use_pickle": True, "tensor_meta": None})
    payload["use_pickle"] = True
    found["config"][fqn] = payload
    entries[config] = json.dumps(found).encode()
    folder = config.rsplit("/", 1)[0]
    entries[f"{folder}/{payload['path_name']}"] = pickle.dumps(Marker(marker), protocol=2)


def _pickled_weight(entries, marker):
    _payload(entries, "data/weights/model_weights_config.json", marker)


def _pickled_constant(entries, marker):
    from torch.export.pt2_archive.constants import TENSOR_CONSTANT_FILENAME_PREFIX

    _payload(entries, "data/constants/model_constants_config.json", marker, "evil",
             f"{TENSOR_CONSTANT_FILENAME_PREFIX}0")


def _object_constant(entries, marker):
    from torch.export.pt2_archive.constants import OPAQUE_OBJ_FILENAME_PREFIX

    _payload(entries, "data/constants/model_constants_config.json", marker, "evil",
             f"{OPAQUE_OBJ_FILENAME_PREFIX}0")


def _compiled_code(entries, marker):
    entries["data/aotinductor/model/model.so"] = b"\x7fELF"


def _python_shape(entries, marker):
    graph = json.loads(entries["models/model.json"])
    stack, done = [graph], False
    while stack and not done:
        value = stack.pop()
        if isinstance(value, dict):
            if isinstance(value.get("expr_str"), str):
                value["expr_str"] = f"__import__('builtins').open({str(marker)!r}, 'w')"
                done = True
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    assert done, "the dynamic batch left no symbolic shape in the program"
    entries["models/model.json"] = json.dumps(graph).encode()


CASES = {
    "sample inputs": (_pickled_sample_inputs, "data/sample_inputs/model.pt is a pickle "
                                              "that is not weights only (it calls io.open)"),
    "pickled weight": (_pickled_weight, "data/weights/weight_0 is a pickle that is not "
                                        "weights only (it calls io.open)"),
    "pickled constant": (_pickled_constant, "is a pickle that is not weights only (it "
                                            "calls io.open)"),
    "object constant": (_object_constant, "constant 'evil' (data/constants/"),
    "compiled code": (_compiled_code, "data/aotinductor/model/model.so is compiled code"),
    "python shape": (_python_shape, "models/model.json: the symbolic shape"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_program_that_would_run_code_is_refused_naming_file_and_entry(program_file,
                                                                        tmp_path, case,
                                                                        monkeypatch):
    change, said = CASES[case]
    marker = tmp_path / "ran"
    hostile = rewritten(program_file, tmp_path / "hostile.pt2",
                        lambda entries: change(entries, marker))
    with pytest.raises(ProgramError) as error:
        load_program(hostile)
    message = str(error.value)
    assert message.startswith(f"{hostile}: refused: ") and said in message, message
    assert message.endswith("(weights only)") and "\n" not in message
    with pytest.raises(ModelFormatError) as error:
        formats.detect(hostile)
    assert str(error.value) == message
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "inputs.npy", np.ones((2, 4), np.float32))
    with pytest.raises(ConfigError) as error:
        validate_config({"models": {"mine": {"file": "hostile.pt2", "inputs": "inputs.npy"}},
                         "samples": [0, 1], "devices": {"eager": {
                             "accelerator": "cpu", "backend": "torch_export"}}})
    relative = message.replace(f"{tmp_path}/", "")
    assert str(error.value) == f"config key models.mine.file: {relative}"
    assert not marker.exists()


def test_a_program_cut_short_is_one_line_naming_the_model_file(program_file, tmp_path,
                                                               monkeypatch, capfd):
    """A weight cut short: torch logged its reader's traceback (~60 lines) before the
    one-line error, which named models.X.inputs (the signature was first read to check
    the inputs) and said 'check the warnings above'. Now the reader's own error, one
    line, naming the model file, and nothing else on stderr."""

    def cut(entries):
        name = next(name for name in entries if name.startswith("data/weights/weight_"))
        entries[name] = entries[name][:-4]

    rewritten(program_file, tmp_path / "cut.pt2", cut)
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "inputs.npy", np.ones((2, 4), np.float32))
    capfd.readouterr()
    with pytest.raises(ConfigError) as error:
        validate_config({"models": {"mine": {"file": "cut.pt2", "inputs": "inputs.npy"}},
                         "samples": [0, 1], "devices": {"eager": {
                             "accelerator": "cpu", "backend": "torch_export"}}})
    assert str(error.value).startswith(
        "config key models.mine.file: cut.pt2: not a readable torch.export program (a .pt2 "
        "written by torch.export.save): setStorage: "), str(error.value)
    assert "out of bounds" in str(error.value) and "\n" not in str(error.value)
    assert capfd.readouterr().err == ""


def test_the_programs_torch_writes_still_load_weights_only(program_file, tmp_path):
    """Sample inputs, weights and constants as torch.export.save writes them pass the
    weights-only reading, and the program computes what it was exported from."""
    program = load_program(program_file)
    (signature,) = formats.signature(program_file)
    assert signature.shape == (None, 4) and signature.dtype == "float32"
    same = rewritten(program_file, tmp_path / "same.pt2", lambda entries: None)
    x = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(load_program(same).module()(x), program.module()(x))


def test_a_program_that_would_run_code_fails_the_dry_run_naming_the_file(program_file,
                                                                         tmp_path):
    """`snakemake -n` reads the config's model files: the hostile one is named, one line,
    and its code never runs."""
    marker = tmp_path / "ran"
    rewritten(program_file, tmp_path / "hostile.pt2",
              lambda entries: _pickled_sample_inputs(entries, marker))
    np.save(tmp_path / "inputs.npy", np.ones((2, 4), np.float32))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "samples": [0, 1], "analysis": {"precision": "float32"},
        "devices": {"eager": {"accelerator": "cpu", "backend": "torch_export",
                              "threads": 1}},
        "models": {"mine": {"file": "hostile.pt2", "inputs": "inputs.npy"}}}))
    done = snakemake(tmp_path, "all", "-n", configfile=config, check=False)
    said = done.stdout + done.stderr
    assert done.returncode != 0
    assert ("config key models.mine.file: hostile.pt2: refused: data/sample_inputs/model.pt "
            "is a pickle that is not weights only (it calls io.open)") in said, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    assert not marker.exists()


KERAS_LAMBDA = """
import sys, keras
inputs = keras.Input((4,), name="input")
doubled = keras.layers.Lambda(lambda x: x * 2, name="doubling")(inputs)
keras.Model(inputs, keras.layers.Dense(3, name="dense")(doubled)).save(sys.argv[1])
"""


def test_a_keras_model_holding_python_bytecode_is_refused_naming_file_and_layer(tmp_path):
    """A Lambda layer's function is stored as Python bytecode: Keras' safe mode refuses it
    when a job loads the model, in many lines; the format check refuses it in one."""
    model = tmp_path / "lambda.keras"
    subprocess.run([sys.executable, "-c", KERAS_LAMBDA, str(model)], check=True,
                   capture_output=True, env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    with pytest.raises(ModelFormatError) as error:
        formats.detect(model)
    assert str(error.value) == (
        f"{model}: refused: layer 'doubling' holds Python bytecode (a Lambda layer's "
        "function), which loading would run; bitdrift reads a model file without running "
        "code it holds")
