"""Small models in each format bitdrift runs, built here (no download): the preset
config/presets/your_model.yaml runs them (its rule example_model writes them), and the
tests build them too. One module per example; EXAMPLES is the list.

    python -m bitdrift.inputs.examples onnx_cnn OUT.onnx INPUTS.npy [--samples N]
    python -m bitdrift.inputs.examples torch_cnn OUT.pt2 INPUTS.npy [--samples N]
    python -m bitdrift.inputs.examples onnx_transformer OUT.onnx INPUTS.npy [--samples N]
    python -m bitdrift.inputs.examples torch_transformer OUT.pt2 INPUTS.npy [--samples N]
    python -m bitdrift.inputs.examples keras_cnn OUT.keras INPUTS.npy [--samples N]
"""

from __future__ import annotations

import importlib

from bitdrift.errors import ConfigError

EXAMPLES = ("onnx_cnn", "torch_cnn", "onnx_transformer", "torch_transformer", "keras_cnn")


def write_example(name: str, model_path, inputs_path, samples: int = 16) -> None:
    """Write example ``name``'s model and its inputs (each atomically)."""
    if name not in EXAMPLES:
        raise ConfigError(f"unknown example model {name!r} (bitdrift has "
                          f"{', '.join(EXAMPLES)})")
    from pathlib import Path

    module = importlib.import_module(f"bitdrift.inputs.examples.{name}")
    if Path(model_path).suffix != module.SUFFIX:
        raise ConfigError(f"{model_path}: example {name!r} is a {module.SUFFIX} model")
    module.write(model_path, inputs_path, samples=samples)
