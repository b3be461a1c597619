"""Checks of the `probes` config section beyond its schema, and its held-out devices."""

from __future__ import annotations

from bitdrift.config import scheduled_device
from bitdrift.errors import ConfigError


def held_out_devices(config: dict) -> list[str]:
    """Every scheduled device of the search devices' precision that the search never runs."""
    section = config["probes"]
    search = section["search_devices"]
    precisions = {config["devices"][d]["precision"] for d in search}
    return [name for name, device in config["devices"].items()
            if name not in search and not device["external"]
            and device["precision"] in precisions]


def evaluation_devices(config: dict) -> list[str]:
    return [*config["probes"]["search_devices"], *held_out_devices(config)]


def check(config: dict) -> None:
    """The model and devices the section names exist; the search devices share one
    precision (outputs of two precisions are never bitwise equal: no finding); two
    devices are left to hold out."""
    section = config.get("probes")
    if not section:
        return
    if section["model"] not in config["models"]:
        raise ConfigError(f"config key probes.model: unknown model {section['model']!r} "
                          f"(models: {sorted(config['models'])})")
    if "dataset" not in config["models"][section["model"]]:
        raise ConfigError(f"config key probes.model: model {section['model']!r} brings its "
                          "own inputs; the probe search runs a model on a dataset's images")
    for device in section["search_devices"]:
        scheduled_device(config, device, "probes.search_devices", "the search must run it")
    # The search runs its devices one after another in one job: on a cluster that job
    # lands on one node, so the devices must ask for the same node.
    places = {(config["devices"][d]["accelerator"],
               repr(sorted(config["devices"][d].get("resources", {}).items())))
              for d in section["search_devices"]}
    if len(places) > 1:
        raise ConfigError("config key probes.search_devices: devices of different "
                          "accelerators or resources; the search runs them in one job on "
                          "one node (search GPU devices and CPU devices separately)")
    precisions = {config["devices"][d]["precision"] for d in section["search_devices"]}
    if len(precisions) > 1:
        raise ConfigError(f"config key probes.search_devices: devices of precisions "
                          f"{sorted(precisions)}; the search compares one precision")
    if len(held_out_devices(config)) < 2:
        raise ConfigError("config key probes.search_devices: fewer than two scheduled "
                          "devices of that precision are left to hold out; the probes "
                          "must be judged on devices the search never ran")
