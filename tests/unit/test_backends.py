"""The backend seam: one module per runtime, one dispatch that refuses what it lacks."""

import ast
from pathlib import Path

import pytest

from bitdrift import backends
from bitdrift.errors import ConfigError

SOURCE = Path(backends.__file__).parents[1]


def test_the_dispatch_refuses_an_unknown_backend():
    with pytest.raises(ConfigError, match="unknown backend 'jaxx'"):
        backends.get("jaxx")
    with pytest.raises(ConfigError, match="unknown backend 'keras_common'"):
        backends.get("keras_common")  # a helper module is no runtime


@pytest.mark.parametrize("name", backends.RUNTIMES)
def test_every_runtime_has_the_whole_interface(name):
    """Each runtime module against the Backend protocol, member by member (a missing one
    is named), its functions callable."""
    module = backends.get(name)
    assert module.NAME == name
    members = [member for member in backends.Backend.__annotations__] + [
        member for member in vars(backends.Backend) if not member.startswith("_")]
    missing = [member for member in members if not hasattr(module, member)]
    assert not missing, f"{name} lacks {missing}"
    assert isinstance(module, backends.Backend)
    assert all(callable(getattr(module, member)) for member in vars(backends.Backend)
               if not member.startswith("_"))


def test_explains_frameworks_are_the_runtimes():
    from bitdrift.analysis.explain import FRAMEWORKS

    assert set(FRAMEWORKS.values()) == set(backends.RUNTIMES)
    assert set(backends.KNOBS) <= set(backends.RUNTIMES)


def test_the_schema_names_exactly_the_runtimes():
    import yaml

    schema = yaml.safe_load((SOURCE / "config.schema.yaml").read_text())
    device = schema["properties"]["devices"]["additionalProperties"]["properties"]
    assert tuple(device["backend"]["enum"]) == backends.RUNTIMES


# Every module outside bitdrift.backends (and the runtimes' data): none branches on a
# runtime's name
OUTSIDE_BACKENDS = sorted(str(path.relative_to(SOURCE)) for path in SOURCE.rglob("*.py")
                          if path.relative_to(SOURCE).parts[0] not in ("backends", "runtimes.py"))


@pytest.mark.parametrize("module", OUTSIDE_BACKENDS)
def test_no_branch_on_a_backends_name(module):
    """`if backend == "tensorflow": ... else:` made the else mean torch by accident; a
    runtime's own module answers what others ask of it."""
    tree = ast.parse((SOURCE / module).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            constants = [c.value for c in [node.left, *node.comparators]
                         if isinstance(c, ast.Constant)]
            assert not set(constants) & set(backends.RUNTIMES), ast.unparse(node)


def test_the_formats_import_no_runtime_and_no_analysis():
    """A format says what its file is; running it is the runtimes' (bitdrift.backends),
    which import the formats, never the other way round."""
    for path in (SOURCE / "formats").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):  # `from bitdrift import backends` too
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            wrong = [name for name in names if name.split(".")[:2] in (
                ["bitdrift", "backends"], ["bitdrift", "analysis"], ["bitdrift", "run"])]
            assert not wrong, f"{path.name} imports {wrong}"


@pytest.mark.parametrize("name", backends.RUNTIMES)
def test_each_runtime_opens_exactly_the_formats_it_is_listed_for(name):
    """A runtime module's SESSIONS and the format x runtime matrix
    (bitdrift.runtimes.FORMAT_RUNTIMES) name the same pairs, each session callable."""
    from bitdrift.runtimes import FORMAT_RUNTIMES, SEVERAL_INPUTS

    module = backends.get(name)
    listed = {format for format, runtimes in FORMAT_RUNTIMES.items() if name in runtimes}
    assert set(module.SESSIONS) == listed
    assert all(callable(open_session) for open_session in module.SESSIONS.values())
    assert all(set(several) <= set(FORMAT_RUNTIMES[format])
               for format, several in SEVERAL_INPUTS.items())


def test_a_runtime_that_cannot_run_the_format_is_refused_naming_both():
    from bitdrift.errors import InferenceError

    device = {"backend": "tensorflow", "accelerator": "cpu", "batch_size": 2}
    with pytest.raises(InferenceError, match=r"^device 'd': backend 'tensorflow' cannot run "
                       r"m\.tflite \(a LiteRT \.tflite flatbuffer; runtimes that can: "
                       r"litert\)$"):
        backends.open_session({"device": device, "model_path": "m.tflite",
                               "model_format": "tflite"}, "d")


def test_a_devices_runtime_settings_win_over_inherited_ones():
    """An XLA_FLAGS left in the user's shell must not replace the device's own flags (the
    measured device would silently be another); a user's TF log level is kept."""
    from bitdrift.run.devices import device_environment

    device = {"backend": "jax", "accelerator": "cpu", "threads": 2, "xla_flags": "--a=1"}
    env = device_environment(device, {"XLA_FLAGS": "--inherited", "TF_CPP_MIN_LOG_LEVEL": "0",
                                      "KERAS_BACKEND": "torch"})
    assert env["XLA_FLAGS"] == "--a=1" and env["KERAS_BACKEND"] == "jax"
    assert env["JAX_PLATFORMS"] == "cpu" and env["TF_CPP_MIN_LOG_LEVEL"] == "0"


@pytest.mark.parametrize(("backend", "key", "value"), [("torch", "xla_flags", "--x=1"),
                                                       ("tensorflow", "matmul_precision",
                                                        "high")])
def test_a_knob_of_another_runtime_is_refused_naming_the_key(backend, key, value):
    from bitdrift.config import validate_config

    config = {"datasets": {"d": {"source": "digits"}},
              "models": {"m": {"architecture": "cifar10_small", "dataset": "d"}},
              "devices": {"dv": {"accelerator": "cpu", "backend": backend, key: value}}}
    with pytest.raises(ConfigError, match=f"config key devices.dv.{key}: not a setting of "
                       f"backend '{backend}'"):
        validate_config(config)


@pytest.mark.parametrize("backend", backends.EXPORTED_RUNTIMES)
def test_an_exported_runtime_cannot_train(backend):
    """Its device in a training plan is a config error naming the key; asked for Keras in
    a process, it refuses instead of loading another runtime."""
    from bitdrift.config import validate_config

    config = {"datasets": {"d": {"source": "digits"}},
              "models": {"m": {"architecture": "cifar10_small", "dataset": "d"}},
              "devices": {"dv": {"accelerator": "cpu", "backend": backend}},
              "training_variance": {"models": {"s": {"architecture": "small_cnn",
                                                     "dataset": "d"}},
                                    "plans": {"p": {"model": "s", "devices": ["dv"], "runs": 1,
                                                          "arms": {"control": {}}}}}}
    with pytest.raises(ConfigError, match=f"training_variance.plans.p.devices: 'dv' runs "
                       f"backend '{backend}'"):
        validate_config(config)
    with pytest.raises(ConfigError, match="cannot train"):
        backends.get(backend).import_keras()


@pytest.mark.parametrize(("key", "value"), [("graph_optimization_level", "all"),
                                            ("op_resolver", "builtin"),
                                            ("execution_mode", "ACCURACY")])
def test_an_exported_runtimes_knob_on_tensorflow_is_refused(key, value):
    from bitdrift.config import validate_config

    config = {"datasets": {"d": {"source": "digits"}},
              "models": {"m": {"architecture": "cifar10_small", "dataset": "d"}},
              "devices": {"dv": {"accelerator": "cpu", "backend": "tensorflow", key: value}}}
    with pytest.raises(ConfigError, match=f"config key devices.dv.{key}: not a setting"):
        validate_config(config)


def test_exported_runtimes_compute_float32_only():
    from bitdrift.config import validate_config

    config = {"datasets": {"d": {"source": "digits"}},
              "models": {"m": {"architecture": "cifar10_small", "dataset": "d"}},
              "devices": {"dv": {"accelerator": "cpu", "backend": "openvino",
                                 "precision": "float16"}}}
    with pytest.raises(ConfigError, match="config key devices.dv.precision"):
        validate_config(config)
