"""A small PyTorch CNN exported with ``torch.export`` and saved by ``torch.export.save``
(``.pt2``): Conv2d, BatchNorm2d, ReLU, a depthwise Conv2d (groups = channels), BatchNorm2d,
ReLU, average pooling, Linear; seeded weights and batch-norm statistics, eval mode. Its
inputs: seeded normal samples of shape (samples, 3, 16, 16), float32, NCHW."""

from __future__ import annotations

import numpy as np

INPUT_SHAPE = (3, 16, 16)
CLASSES = 10
SUFFIX = ".pt2"


def build_module(seed: int = 0):
    """The torch.nn.Module, eval mode, its batch norms with seeded running statistics."""
    import torch
    from torch import nn

    class TorchCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU())
            self.pool = nn.AdaptiveAvgPool2d(2)
            self.classifier = nn.Linear(8 * 2 * 2, CLASSES)

        def forward(self, x):
            return self.classifier(torch.flatten(self.pool(self.features(x)), 1))

    torch.manual_seed(seed)
    model = TorchCNN()
    generator = torch.Generator().manual_seed(seed + 1)
    for norm in (model.features[1], model.features[4]):
        norm.running_mean.copy_(torch.randn(8, generator=generator) * 0.1)
        norm.running_var.copy_(torch.rand(8, generator=generator) + 0.5)
        norm.weight.data.copy_(torch.rand(8, generator=generator) + 0.5)
        norm.bias.data.copy_(torch.randn(8, generator=generator) * 0.1)
    return model.eval()


def export(module, batch: int = 1):
    """The module's torch.export program, the batch axis dynamic (a device sets its batch
    size); ``batch`` is the example batch traced."""
    import torch

    example = torch.zeros((max(batch, 2), *INPUT_SHAPE))
    return torch.export.export(module, (example,),
                               dynamic_shapes=({0: torch.export.Dim("batch", max=1024)},))


def make_inputs(samples: int = 16, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(
        (samples, *INPUT_SHAPE)).astype(np.float32)


def write(model_path, inputs_path, samples: int = 16, seed: int = 0) -> None:
    """The program (torch.export.save) and its inputs, each written atomically."""
    import torch

    from bitdrift.atomic import atomic_output

    with atomic_output(model_path) as partial:
        torch.export.save(export(build_module(seed)), str(partial))
    with atomic_output(inputs_path) as partial:
        with open(partial, "wb") as handle:
            np.save(handle, make_inputs(samples))
