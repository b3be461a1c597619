"""Where the workflow puts things; shared by rules/common.smk and the command line."""

from __future__ import annotations

RESULTS = "results"


def dataset_file(dataset: str) -> str:
    return f"{RESULTS}/datasets/{dataset}.h5"


def trained_model_file(model: str, seed: int | str) -> str:
    return f"{RESULTS}/models/{model}/seed_{seed}/model.keras"


def model_file(config: dict, model: str) -> str:
    """The model the devices run: a bring-your-own file as is, else the inference seed's."""
    from bitdrift.config import inference_seed

    spec = config["models"][model]
    if "file" in spec:
        return spec["file"]
    return trained_model_file(model, inference_seed(spec))


def record_file(model: str, device: str) -> str:
    return f"{RESULTS}/inference/{model}/{device}.h5"
