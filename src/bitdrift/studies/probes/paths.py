"""Where the probe study puts its files (on top of bitdrift.paths)."""

from __future__ import annotations

from bitdrift.paths import RESULTS


def probe_file(model="{model}") -> str:
    """The probes of a model: a dataset file whose test set is the probes."""
    return f"{RESULTS}/probes/{model}/probes.h5"


def probe_evaluation_file(model="{model}") -> str:
    """The probes, then the natural test samples: what every device runs to judge them."""
    return f"{RESULTS}/probes/{model}/evaluation.h5"


def probe_record_file(model="{model}", device="{device}") -> str:
    return f"{RESULTS}/probes/{model}/records/{device}.h5"


# The tables `bitdrift probe-evaluate` writes, by key; its figure is `probes`.
PROBE_TABLES = {"classes": "probe_classes", "summary": "probe_summary",
                "identify": "probe_identify"}
