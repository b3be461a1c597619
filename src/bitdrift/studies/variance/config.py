"""Checks of the `training_variance` config section beyond its schema."""

from __future__ import annotations

from bitdrift.backends import EXPORTED_RUNTIMES
from bitdrift.config import scheduled_device
from bitdrift.errors import ConfigError, PlanError
from bitdrift.studies.variance.plans import arm_switches, ensemble_plan_name


def check(config: dict) -> None:
    """Names the `training_variance` section refers to: datasets, models, devices, arms."""
    section = config.get("training_variance")
    if not section:
        return
    for name, model in section["models"].items():
        if model["dataset"] not in config["datasets"]:
            raise ConfigError(f"config key training_variance.models.{name}.dataset: unknown "
                              f"dataset {model['dataset']!r} "
                              f"(datasets: {sorted(config['datasets'])})")
    entries = [(f"plans.{name}", plan) for name, plan in section["plans"].items()]
    if section.get("ensemble"):
        entries.append(("ensemble", section["ensemble"]))
    for key, entry in entries:
        if entry["model"] not in section["models"]:
            raise ConfigError(f"config key training_variance.{key}.model: unknown model "
                              f"{entry['model']!r} (training_variance.models: "
                              f"{sorted(section['models'])})")
        for device in entry["devices"]:
            scheduled_device(config, device, f"training_variance.{key}.devices",
                             "the workflow cannot train on it")
            if config["devices"][device]["backend"] in EXPORTED_RUNTIMES:
                raise ConfigError(f"config key training_variance.{key}.devices: {device!r} runs "
                                  f"backend {config['devices'][device]['backend']!r}, an "
                                  "exported model that cannot train (use a tensorflow, "
                                  "torch or jax device)")
        for arm, overrides in entry.get("arms", {}).items():
            try:
                arm_switches(arm, overrides or {}, entry["deterministic"])
            except PlanError as error:
                raise ConfigError(f"config key training_variance.{key}.arms.{arm}: "
                                  f"{error}") from None
        _check_dropout_backends(config, key, entry, section["models"][entry["model"]])
        for rate in entry.get("learning_rates", []):
            for momentum in entry.get("momentum", []):
                name = ensemble_plan_name(rate, momentum)
                if name in section["plans"]:
                    raise ConfigError(f"config key training_variance.plans.{name}: the name "
                                      "is taken by the ensemble's plan of that learning rate "
                                      "and momentum")
    _check_gallery(config)


def _check_dropout_backends(config: dict, key: str, entry: dict, model: dict) -> None:
    """Dropout masks are drawn by the backend's RNG: one seed gives the same masks on one
    backend, not across backends. A `fixed` dropout seed over devices of several backends
    would claim a sameness that is not there, so it is refused."""
    backends = {config["devices"][device]["backend"] for device in entry["devices"]}
    if not model.get("dropout") or len(backends) < 2:
        return
    arms = entry.get("arms") or {"(ensemble)": {"dropout": "fixed"}}
    for arm, overrides in arms.items():
        switches = arm_switches(arm, overrides or {}, entry.get("deterministic", False)) \
            if arm != "(ensemble)" else overrides
        if switches["dropout"] == "fixed":
            raise ConfigError(
                f"config key training_variance.{key}.devices: model {entry['model']!r} has "
                f"dropout and arm {arm!r} fixes its seed, but the devices use the backends "
                f"{sorted(backends)}, whose dropout masks differ for one seed; use devices of "
                "one backend or `dropout: per_run`")


def _check_gallery(config: dict) -> None:
    from bitdrift.studies.variance.plans import resolve_plans

    choice = config["training_variance"].get("divergence") or {}
    if "plan" not in choice:
        return
    plans = resolve_plans(config)
    plan = plans.get(choice["plan"])
    if plan is None:
        raise ConfigError(f"config key training_variance.divergence.plan: unknown plan "
                          f"{choice['plan']!r} (plans: {sorted(plans)})")
    if "arm" in choice and choice["arm"] not in plan["arms"]:
        raise ConfigError(f"config key training_variance.divergence.arm: plan "
                          f"{choice['plan']!r} has no arm {choice['arm']!r} "
                          f"(arms: {sorted(plan['arms'])})")
