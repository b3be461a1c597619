"""Configuration: JSON-schema validation with errors that name the bad key, and defaults."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import yaml

from bitdrift.errors import ConfigError

SCHEMA_PATH = Path(__file__).with_name("config.schema.yaml")


def load_schema() -> dict:
    with open(SCHEMA_PATH) as handle:
        return yaml.safe_load(handle)


def _strict_integers(validator_class):
    """JSON Schema counts 2.0 as an integer; a config's `threads: 2.0` is a mistake that
    would surface later as a misleading Keras error, so integers must be written as such."""
    checker = validator_class.TYPE_CHECKER.redefine(
        "integer", lambda _, instance: isinstance(instance, int) and not isinstance(instance,
                                                                                    bool))
    return jsonschema.validators.extend(validator_class, type_checker=checker)


def _with_defaults(validator_class):
    """Validator that also fills in each property's `default` (jsonschema FAQ recipe)."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                # A `false` subschema (a key another runtime owns) has no default.
                if isinstance(subschema, dict) and "default" in subschema \
                        and name not in instance:
                    instance[name] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "(top level)"


def validate_config(config: dict) -> dict:
    """Validate ``config`` in place (filling defaults) and return it.

    Raises ConfigError naming the key, e.g. ``config key devices.cpu_t1.threads: 'two' is
    not of type 'integer', 'null'``.
    """
    expand_device_matrices(config)
    models = config.get("models") if isinstance(config, dict) else None
    trained_files = [name for name, model in (models or {}).items()
                     if isinstance(model, dict) and "file" in model and "train" in model]
    schema = load_schema()
    validator = _with_defaults(_strict_integers(jsonschema.Draft202012Validator))(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        # The deepest error is the most specific one (oneOf/anyOf wrap their children).
        error = max(errors, key=lambda e: len(e.absolute_path))
        best = jsonschema.exceptions.best_match([error])
        message = best.message
        if best.validator == "oneOf" and _key_path(best).startswith("models."):
            message = "a model needs exactly one of 'architecture', 'file' or 'quantize'"
        if best.validator == "enum" and list(best.absolute_path)[-1:] == ["emulate"]:
            from bitdrift.emulation.cpus import beyond_tcg

            if beyond_tcg(best.instance):  # a real CPU model, refused for a reason
                message = f"{best.instance!r} {beyond_tcg(best.instance)}"
        if best.validator == "enum" and len(best.validator_value) > 12 and \
                message == best.message:
            # a long list (QEMU's CPU models) is named by its start, not dumped whole
            message = (f"{best.instance!r} is not one of the {len(best.validator_value)} "
                       f"accepted values ({', '.join(map(str, best.validator_value[:6]))}, "
                       "...: the schema's description says which and why)")
        key = _key_path(best)
        if best.validator is None and list(best.relative_schema_path)[-1:] == ["properties"]:
            # A `false` subschema: a key that belongs to another runtime. jsonschema leaves
            # the key out of the path; it is the one the `properties` above forbid.
            owner, forbidding = config, schema
            for part in best.absolute_path:
                owner = owner[part]
            for part in best.relative_schema_path:
                forbidding = forbidding[part]
            names = [name for name, rule in forbidding.items()
                     if rule is False and name in owner]
            if names:
                key = f"{key}.{names[0]}"
                message = (f"not a setting of backend {owner.get('backend')!r} (it belongs "
                           "to another runtime; see the schema's description)")
        raise ConfigError(f"config key {key}: {message}")
    _check_references(config, trained_files)
    full = config.get("analysis", {}).get("full_samples")
    if isinstance(full, list) and set(full) - set(config.get("samples", [])):
        raise ConfigError(f"config key analysis.full_samples: "
                          f"{sorted(set(full) - set(config['samples']))} not among the "
                          f"samples {config['samples']}")
    return config


MATRIX_AXES = ("precision", "threads")  # the settings a device matrix varies


def matrix_device_name(base: str, setting: dict) -> str:
    """`tf_2threads` x {precision: float16} -> `tf_2threads_float16`; threads -> `_4t`."""
    parts = [base]
    if "precision" in setting:
        parts.append(setting["precision"])
    if "threads" in setting:
        parts.append(f"{setting['threads']}t")
    return "_".join(parts)


def expand_device_matrices(config: dict) -> None:
    """Replace each `devices` entry of the form ``{matrix: {devices: [...], precision:
    [...], threads: [...]}}`` by one device per base device and setting (the product of
    the axes given), in place and in the entry's position (config order numbers the
    classes). A base is an explicit device; its copies differ only in the axes varied.
    Errors name the key."""
    devices = config.get("devices") if isinstance(config, dict) else None
    if not isinstance(devices, dict) or not any(
            isinstance(entry, dict) and "matrix" in entry for entry in devices.values()):
        return
    import itertools

    expanded = {}
    for name, entry in devices.items():
        if not (isinstance(entry, dict) and "matrix" in entry):
            expanded[name] = entry
            continue
        key = f"config key devices.{name}"
        matrix = entry["matrix"]
        if set(entry) != {"matrix"} or not isinstance(matrix, dict):
            raise ConfigError(f"{key}: a device matrix has only `matrix: {{devices: [...], "
                              f"{' / '.join(MATRIX_AXES)}: [...]}}`")
        unknown = set(matrix) - {"devices", *MATRIX_AXES}
        if unknown:
            raise ConfigError(f"{key}.matrix: unknown key(s) {sorted(unknown)} (a matrix "
                              f"varies {', '.join(MATRIX_AXES)})")
        bases = matrix.get("devices")
        axes = {axis: matrix[axis] for axis in MATRIX_AXES if axis in matrix}
        if not isinstance(bases, list) or not bases or not axes or not all(
                isinstance(values, list) and values for values in axes.values()):
            raise ConfigError(f"{key}.matrix: needs a non-empty `devices` list and at least "
                              f"one non-empty list of {' or '.join(MATRIX_AXES)}")
        for base in bases:
            if not isinstance(devices.get(base), dict) or "matrix" in devices[base]:
                raise ConfigError(f"{key}.matrix.devices: {base!r} is not a device entry "
                                  "of its own (a matrix expands explicit devices)")
            for values in itertools.product(*axes.values()):
                setting = dict(zip(axes, values, strict=True))
                device = matrix_device_name(base, setting)
                if device in devices or device in expanded:
                    raise ConfigError(f"{key}: device {device!r} (from {base!r}) is already "
                                      "defined")
                expanded[device] = copy.deepcopy(devices[base]) | setting
    config["devices"] = expanded


def scheduled_device(config: dict, device: str, key: str, purpose: str) -> dict:
    """The entry of ``device``, named at config key ``key``, which the workflow itself
    must run (``purpose`` says why): a ConfigError for an unknown device or an external
    one (measured elsewhere)."""
    entry = config["devices"].get(device)
    if entry is None:
        raise ConfigError(f"config key {key}: unknown device {device!r} (devices: "
                          f"{sorted(config['devices'])})")
    if entry["external"]:
        raise ConfigError(f"config key {key}: device {device!r} is external (measured "
                          f"elsewhere); {purpose}")
    return entry


def _check_references(config: dict, trained_files: list[str]) -> None:
    import importlib

    from bitdrift.studies import STUDIES

    for study in STUDIES:  # each study checks the names its own section refers to
        importlib.import_module(f"bitdrift.studies.{study}.config").check(config)
    from bitdrift.emulation.cpus import check_device

    for name, device in config["devices"].items():
        check_device(name, device)
    for device in config["atlas"]["devices"]:
        scheduled_device(config, device, "atlas.devices", "the reference model runs on the "
                         "devices the workflow schedules")
    check_quantized_models(config)
    check_atlas_quantization(config)
    for name, model in config["models"].items():
        for device in model.get("devices", []):
            if device not in config["devices"]:
                raise ConfigError(f"config key models.{name}.devices: {device!r} is not a "
                                  f"key of devices ({', '.join(config['devices'])})")
    for name, model in config["models"].items():
        if "quantize" in model:
            continue  # it reads its float model's inputs
        if ("dataset" in model) == ("inputs" in model):
            raise ConfigError(f"config key models.{name}: a model needs exactly one of "
                              "'dataset' or 'inputs'")
        if "inputs" in model and "file" not in model:
            raise ConfigError(f"config key models.{name}.inputs: a trained architecture "
                              "reads its dataset; inputs go with a model file")
    recorded = {model["dataset"] for model in config["models"].values() if "dataset" in model}
    for name, dataset in config["datasets"].items():
        limit = dataset.get("limit_test") if name in recorded else None
        beyond = [sample for sample in config["samples"] if limit and sample >= limit]
        if beyond:
            raise ConfigError(f"config key samples: {beyond} beyond the test set of dataset "
                              f"{name!r} (limit_test {limit}: indices 0..{limit - 1})")
    for name, model in config["models"].items():
        if "dataset" in model and model["dataset"] not in config["datasets"]:
            raise ConfigError(
                f"config key models.{name}.dataset: unknown dataset {model['dataset']!r} "
                f"(datasets: {sorted(config['datasets'])})"
            )
        seeds = model.get("train", {}).get("seeds", [])
        if "inference_seed" in model and "architecture" in model and \
                model["inference_seed"] not in seeds:
            raise ConfigError(
                f"config key models.{name}.inference_seed: {model['inference_seed']} is not "
                f"one of the training seeds {seeds}"
            )
        if name in trained_files:
            raise ConfigError(f"config key models.{name}.train: a model given as a file is "
                              "used as is and cannot be trained")
        if "file" in model:
            check_model_file(name, model, config["samples"], config["devices"])


def check_quantized_models(config: dict) -> None:
    """Each model made by quantization (`quantize`): its float model a model of the config
    of a format its quantizer (`tool`, bitdrift.backends.quantizers) takes, no `dataset`
    or `inputs` of its own (it reads the float model's), and the quantizer's settings
    checked and completed with its defaults in place, each error naming the key."""
    from bitdrift import formats, paths
    from bitdrift.backends import quantizers

    models = config["models"]
    for name, model in models.items():
        if "quantize" not in model:
            continue
        key = f"config key models.{name}"
        for own in ("dataset", "inputs"):
            if own in model:
                raise ConfigError(f"{key}.{own}: a quantized model reads the inputs of the "
                                  "model it quantizes")
        settings = dict(model["quantize"])
        source = settings.pop("model")

        def named(setting, key=key):
            return f"{key}.quantize.{setting}"

        settings = quantizers.checked_settings(settings, named)
        tool = settings["tool"]
        float_model = models.get(source)
        if float_model is None or "quantize" in float_model:
            raise ConfigError(f"{key}.quantize.model: {source!r} is not a float model of "
                              f"the config (its models: {sorted(models)})")
        found = formats.planned_format(paths.model_file(config, source))
        if found not in quantizers.source_formats(tool):
            raise ConfigError(f"{key}.quantize.model: {source!r} is a {found} model; the "
                              f"{tool} quantizer takes "
                              f"{' or '.join(quantizers.source_formats(tool))}")
        model["quantize"] = {"model": source, **settings}


def check_atlas_quantization(config: dict) -> None:
    """The atlas's quantized reference model (atlas.quantize): a quantizer that takes a
    Keras model, its settings checked and completed with its defaults in place, and
    atlas.quantized_devices scheduled devices of the quantizer's runtimes."""
    from bitdrift.backends import quantizers
    from bitdrift.runtimes import QUANTIZERS

    atlas = config["atlas"]

    def named(setting):
        return f"config key atlas.quantize.{setting}"

    settings = quantizers.checked_settings({"tool": "litert", **(atlas.get("quantize") or {})},
                                           named)
    tool = settings["tool"]
    if "keras" not in quantizers.source_formats(tool):
        raise ConfigError(f"{named('tool')}: the {tool} quantizer takes "
                          f"{' or '.join(quantizers.source_formats(tool))}, not the Keras "
                          "reference model (litert takes it)")
    atlas["quantize"] = settings
    runtimes = QUANTIZERS[tool][2]
    for device in atlas.get("quantized_devices", []):
        entry = scheduled_device(config, device, "atlas.quantized_devices", "the quantized "
                                 "reference model runs on the devices the workflow schedules")
        if entry["backend"] not in runtimes:
            raise ConfigError(f"config key atlas.quantized_devices: device {device!r} runs "
                              f"{entry['backend']}; the {tool} quantizer's model runs on "
                              f"{', '.join(runtimes)}")


def check_model_file(name: str, model: dict, samples: list[int], devices: dict) -> None:
    """A model file's format by its content, and its inputs against its signature, where
    the files exist (a file made later is checked by its job: bitdrift.run.inference)."""
    from bitdrift import formats
    from bitdrift.errors import DatasetError, ModelFormatError

    if not Path(model["file"]).is_file():
        return
    try:
        format = formats.detect(model["file"])
    except ModelFormatError as error:
        raise ConfigError(f"config key models.{name}.file: {error}") from error
    runtimes = formats.runtimes(format)
    if not any(device["backend"] in runtimes for device in devices.values()):
        raise ConfigError(f"config key models.{name}.file: {model['file']} is "
                          f"{formats.get(format).WHAT}, and no device runs it (runtimes that "
                          f"can: {', '.join(runtimes) or 'none yet'})")
    if format == "keras" and "inputs" in model:
        raise ConfigError(f"config key models.{name}.inputs: {model['file']} is "
                          f"{formats.get(format).WHAT}, which reads a `dataset`")
    if format != "keras" and "dataset" in model:
        raise ConfigError(f"config key models.{name}.dataset: {model['file']} is "
                          f"{formats.get(format).WHAT}; give its own `inputs` (.npy or .npz)")
    inputs = None  # the model's signature, read once
    if "inputs" in model and Path(model["inputs"]).is_file():
        try:
            inputs = formats.check_inputs(model["inputs"], model["file"], format, samples)
        except (ModelFormatError, DatasetError) as error:
            raise ConfigError(f"config key models.{name}.inputs: {error}") from error
    running = {device_name: device["backend"] for device_name, device in devices.items()
               if device["backend"] in runtimes}
    if format != "keras" and running:
        inputs = inputs if inputs is not None else formats.signature(model["file"], format)
        for device_name, backend in running.items():
            try:
                formats.check_runtime_inputs(format, backend, inputs, model["file"])
            except ModelFormatError as error:
                raise ConfigError(f"config key devices.{device_name}.backend: {error}") \
                    from error


def load_config(path: str | Path) -> dict:
    path = Path(path)
    try:
        with open(path) as handle:
            config = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: cannot read config ({error})") from error
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: config must be a mapping")
    return validate_config(config)


def replay_settings(config: dict) -> dict:
    """The replay's settings of a validated config (``analysis``), as
    bitdrift.analysis.accumulation.replay.replay_layers takes them."""
    return {key: config["analysis"][key]
            for key in ("replay", "replay_positions", "replay_samples")}
