"""Checks of the `batching` config section beyond its schema: names that exist, and the
sizes that would otherwise fail only inside a job (a batch above the test set, a sequence
longer than the model's context, prompt words outside the vocabulary)."""

from __future__ import annotations

from bitdrift.config import scheduled_device
from bitdrift.errors import ConfigError

TRANSFORMER_DEFAULTS = {"context": 64}
GRAMMAR_DEFAULTS = {"sequence_length": 32, "test_sequences": 256}


def batching_models(config: dict) -> dict[str, dict]:
    """The models only the study runs (they join the workflow's models)."""
    return dict((config.get("batching") or {}).get("models", {}))


def studied_model(config: dict) -> tuple[str, dict]:
    section = config["batching"]
    models = {**config["models"], **batching_models(config)}
    return section["model"], models[section["model"]]


def prompt_tokens(config: dict) -> list[list[int]]:
    """The decoding prompts as token ids of the studied model's dataset vocabulary."""
    from bitdrift.inputs.datasets import DatasetError, tokenize

    prompts = []
    for index, prompt in enumerate(config["batching"]["decoding"]["prompts"]):
        try:
            prompts.append(tokenize(prompt))
        except DatasetError as error:
            raise ConfigError(f"config key batching.decoding.prompts[{index}] "
                              f"({prompt!r}): {error}") from None
    return prompts


def check(config: dict) -> None:
    section = config.get("batching")
    if not section:
        return
    key = "config key batching"
    clashes = set(batching_models(config)) & set(config["models"])
    if clashes:
        raise ConfigError(f"{key}.models: {sorted(clashes)} already name models of `models`")
    known = {**config["models"], **batching_models(config)}
    if section["model"] not in known:
        raise ConfigError(f"{key}.model: unknown model {section['model']!r} (models and "
                          f"batching.models: {sorted(known)})")
    for name, model in batching_models(config).items():
        if model["dataset"] not in config["datasets"]:
            raise ConfigError(f"{key}.models.{name}.dataset: unknown dataset "
                              f"{model['dataset']!r} (datasets: {sorted(config['datasets'])})")
    for device in section["devices"]:
        scheduled_device(config, device, "batching.devices", "the study must run it")
    _, model = studied_model(config)
    if "dataset" not in model:
        raise ConfigError(f"{key}.model: model {section['model']!r} brings its own inputs; "
                          "the study runs a sequence model on a grammar dataset")
    dataset = config["datasets"][model["dataset"]]
    if dataset["source"] != "grammar":
        raise ConfigError(f"{key}.model: its dataset {model['dataset']!r} is not token "
                          "sequences (source grammar); the study runs sequence models")
    grammar = {**GRAMMAR_DEFAULTS, **dataset}
    n_test = min(grammar["test_sequences"], dataset.get("limit_test", grammar["test_sequences"]))
    beyond = [size for size in section["batch_sizes"] if size > n_test]
    if beyond:
        raise ConfigError(f"{key}.batch_sizes: {beyond} above the test set's {n_test} "
                          f"sequences (dataset {model['dataset']!r})")
    outside = [index for index in section["inputs"] if index >= n_test]
    if outside:
        raise ConfigError(f"{key}.inputs: {outside} beyond the test set (indices 0.."
                          f"{n_test - 1})")
    prompts = prompt_tokens(config)
    if model.get("architecture") == "tiny_transformer":
        context = model.get("context", TRANSFORMER_DEFAULTS["context"])
        length = grammar["sequence_length"]
        tokens = section["decoding"]["tokens"]
        if length > context:
            raise ConfigError(f"{key}.model: sequences of {length} tokens are longer than "
                              f"the model's context ({context})")
        padded = section["padded_length"]
        if padded and not length < padded <= context:
            raise ConfigError(f"{key}.padded_length: {padded} must be above the sequence "
                              f"length ({length}) and at most the model's context ({context})")
        for index, prompt in enumerate(prompts):
            if len(prompt) + tokens > context:
                raise ConfigError(
                    f"{key}.decoding: prompt {index} ({len(prompt)} tokens) + {tokens} "
                    f"generated tokens is longer than the model's context ({context})")
            if padded and len(prompt) + tokens > padded:
                raise ConfigError(
                    f"{key}.decoding: prompt {index} ({len(prompt)} tokens) + {tokens} "
                    f"generated tokens is longer than padded_length ({padded})")


def models(config: dict) -> dict[str, dict]:
    """The models this study adds to the workflow's (bitdrift.studies.study_models)."""
    return batching_models(config)
