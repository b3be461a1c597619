"""Checks of the `maxpool` config section beyond its schema."""

from __future__ import annotations

from bitdrift.errors import ConfigError


def check(config: dict) -> None:
    """The dataset the MaxPool study names must be one of the config's datasets."""
    study = config.get("maxpool")
    if study and study["dataset"] not in config["datasets"]:
        raise ConfigError(f"config key maxpool.dataset: unknown dataset {study['dataset']!r} "
                          f"(datasets: {sorted(config['datasets'])})")
