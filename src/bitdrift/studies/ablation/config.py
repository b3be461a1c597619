"""The `ablation` config section: its checks, and the model variants it stands for."""

from __future__ import annotations

import copy

from bitdrift.config import scheduled_device
from bitdrift.errors import ConfigError

# Architectures whose builders take `activation` and `pooling` (Table SUP-7's variants).
VARIANT_ARCHITECTURES = ("cifar10_small", "resnet18")


def ablation_devices(config: dict) -> list[str]:
    """Every device the variants run on: the matrix, then the cross-framework devices."""
    section = config["ablation"]
    return list(dict.fromkeys([*section["devices"], *section.get("cross_framework", [])]))


def variant_name(base: str, variant: str) -> str:
    return f"{base}_{variant}"


def variant_models(config: dict) -> dict[str, dict]:
    """{model name: spec} of every variant: the base model's spec with the variant's
    activation and pooling; an untrained variant keeps the training seeds (so the same
    initial weights) and trains 0 epochs."""
    section = config.get("ablation")
    if not section:
        return {}
    models = {}
    for base in section["models"]:
        for variant, change in section["variants"].items():
            spec = copy.deepcopy(config["models"][base])
            spec.update({key: change[key] for key in ("activation", "pooling") if key in change})
            if not change.get("trained", True):
                spec["train"]["epochs"] = 0
            models[variant_name(base, variant)] = spec
    return models


def variants_of(config: dict) -> list[dict]:
    """One entry per (base, variant), the base itself first as variant `base`: model name,
    and the activation, pooling and training its spec (:func:`variant_models`) has."""
    models = variant_models(config)
    entries = []
    for base in config["ablation"]["models"]:
        named = [("base", base, config["models"][base])] + [
            (variant, variant_name(base, variant), models[variant_name(base, variant)])
            for variant in config["ablation"]["variants"]]
        entries += [{"base": base, "variant": variant, "model": model,
                     "activation": spec.get("activation", "relu"),
                     "pooling": spec.get("pooling", "max"),
                     "trained": spec["train"]["epochs"] > 0}
                    for variant, model, spec in named]
    return entries


def check(config: dict) -> None:
    """Base models with an architecture that has the variants' options, devices that exist
    and are run by the workflow, and variant names that take no other model's name."""
    section = config.get("ablation")
    if not section:
        return
    for base in section["models"]:
        spec = config["models"].get(base)
        if spec is None:
            raise ConfigError(f"config key ablation.models: unknown model {base!r} "
                              f"(models: {sorted(config['models'])})")
        if spec.get("architecture") not in VARIANT_ARCHITECTURES:
            raise ConfigError(f"config key ablation.models: {base!r} must be built from one of "
                              f"{', '.join(VARIANT_ARCHITECTURES)} (the architectures with "
                              "activation and pooling options)")
        for variant in section["variants"]:
            if variant_name(base, variant) in config["models"]:
                raise ConfigError(f"config key ablation.variants.{variant}: its model name "
                                  f"{variant_name(base, variant)!r} is taken by a model")
    for key in ("devices", "cross_framework"):
        for device in section.get(key, []):
            entry = scheduled_device(config, device, f"ablation.{key}",
                                     "the workflow cannot run the variants on it")
            if entry["precision"] != config["analysis"]["precision"]:
                raise ConfigError(f"config key ablation.{key}: {device!r} computes in "
                                  f"{entry['precision']}; the variants are compared at the "
                                  f"analysis precision {config['analysis']['precision']}")
    backends = {device: config["devices"][device]["backend"] for device in section["devices"]}
    if len(set(backends.values())) > 1:
        raise ConfigError(
            "config key ablation.devices: devices of several backends "
            f"({', '.join(f'{d}={b}' for d, b in backends.items())}); the ablation compares "
            "devices within one framework (two frameworks differ in every activation's "
            "kernel); put one device per framework in ablation.cross_framework instead")
    cross = section.get("cross_framework", [])
    if cross and len({config["devices"][device]["backend"] for device in cross}) < 2:
        raise ConfigError("config key ablation.cross_framework: its devices must span at "
                          "least two backends")


def models(config: dict) -> dict[str, dict]:
    """The models this study adds to the workflow's (bitdrift.studies.study_models)."""
    return variant_models(config)
