# Python helpers for the rules: config validation, target lists, wildcard constraints.
import sys

# The library is installed into the environment; fall back to the checkout's src/ so a
# plain clone still parses (e.g. `snakemake --lint` before installing).
sys.path.insert(0, f"{workflow.basedir}/src")

from snakemake.exceptions import WorkflowError

from bitdrift import paths
from bitdrift.config import ConfigError, inference_seed, validate_config

try:
    validate_config(config)
except ConfigError as error:
    raise WorkflowError(str(error)) from None

MODELS = list(config["models"])
DEVICES = list(config["devices"])
SCHEDULED_DEVICES = [d for d in DEVICES if not config["devices"][d]["external"]]
TRAINED_MODELS = [m for m in MODELS if "architecture" in config["models"][m]]


def _choice(names):
    return "|".join(names) if names else "(?!)"


wildcard_constraints:
    dataset=_choice(config["datasets"]),
    model=_choice(MODELS),
    seed=r"\d+",


def training_targets():
    return [
        paths.trained_model_file(model, seed)
        for model in TRAINED_MODELS
        for seed in config["models"][model]["train"]["seeds"]
    ]


def record_files(wildcards=None):
    """Every record, devices in config order (this order numbers the classes)."""
    return [paths.record_file(model, device) for model in MODELS for device in DEVICES]


def all_targets():
    return training_targets() + [
        "results/tables/eqc.csv",
        "results/tables/eqc_layers.csv",
        "results/tables/precision.csv",
        "results/figures/eqc.pdf",
        "results/figures/remaining_precision.pdf",
    ]


def canonical(entry):
    """A config entry with sorted keys: params are compared by value, so reordering keys
    in config.yaml must not trigger reruns."""
    if isinstance(entry, dict):
        return {key: canonical(entry[key]) for key in sorted(entry)}
    if isinstance(entry, list):
        return [canonical(item) for item in entry]
    return entry


def dataset_spec(wildcards):
    return canonical(config["datasets"][wildcards.dataset])


def model_spec(wildcards):
    return canonical(config["models"][wildcards.model])


def device_spec(wildcards):
    return canonical(config["devices"][wildcards.device])


def model_dataset_file(wildcards):
    return paths.dataset_file(config["models"][wildcards.model]["dataset"])


def inference_model_file(wildcards):
    return paths.model_file(config, wildcards.model)


def device_threads(wildcards):
    return config["devices"][wildcards.device]["threads"] or 1


def device_resource(key, default=None):
    """A resource of the device's config entry (cluster scheduling per device)."""

    def resource(wildcards):
        device = config["devices"][wildcards.device]
        if key == "gpu":
            return device.get("resources", {}).get(
                "gpu", 1 if device["accelerator"] == "gpu" else 0
            )
        return device.get("resources", {}).get(key, default)

    return resource
