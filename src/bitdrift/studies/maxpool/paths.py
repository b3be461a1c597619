"""Where the MaxPool study puts its files (on top of bitdrift.paths)."""

from __future__ import annotations

from bitdrift.paths import RESULTS


def maxpool_variation_file(precision="{precision}") -> str:
    return f"{RESULTS}/maxpool/variation/{precision}.csv"


def maxpool_volume_file(setting="{setting}") -> str:
    return f"{RESULTS}/maxpool/volume/{setting}.csv"


def maxpool_training_file(beta="{beta}", seed="{seed}") -> str:
    return f"{RESULTS}/maxpool/training/beta_{beta}/seed_{seed}.csv"
