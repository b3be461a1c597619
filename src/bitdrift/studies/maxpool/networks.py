"""PyTorch networks of the MaxPool study (no torchvision needed): LeNet-5, VGG-11/13/16/19
with optional batch normalisation, ResNet-18. Every ReLU and MaxPool is a module of
:mod:`bitdrift.studies.maxpool.jacobians`, so its :func:`set_program` switches the Jacobian
choices of the whole network without touching its parameters."""

from __future__ import annotations

from torch import nn

from bitdrift.studies.maxpool.jacobians import MaxPool2d, NormPool2d, ReLU

VGG_LAYERS = {
    11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    13: [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512,
         "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512,
         512, 512, 512, "M"],
}


def _pool(pooling: str):
    return NormPool2d(kernel_size=2) if pooling == "norm" else MaxPool2d(kernel_size=2)


class LeNet5(nn.Module):
    """LeNet-5 (LeCun et al. 1998) for 32x32 inputs, MaxPool instead of subsampling."""

    def __init__(self, *, channels: int = 1, classes: int = 10, pooling: str = "max"):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, 5), ReLU(), _pool(pooling),
            nn.Conv2d(6, 16, 5), ReLU(), _pool(pooling),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(16 * 5 * 5, 120), ReLU(), nn.Linear(120, 84), ReLU(),
            nn.Linear(84, classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


class VGG(nn.Module):
    """VGG-11/13/16/19 for 32x32 inputs (CIFAR variant: one linear classifier)."""

    def __init__(self, *, depth: int = 11, channels: int = 3, classes: int = 10,
                 batch_norm: bool = False, width: float = 1.0):
        super().__init__()
        layers, in_channels = [], channels
        for item in VGG_LAYERS[depth]:
            if item == "M":
                layers.append(MaxPool2d(kernel_size=2))
                continue
            out_channels = max(1, int(item * width))
            layers.append(nn.Conv2d(in_channels, out_channels, 3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(out_channels))
            layers.append(ReLU())
            in_channels = out_channels
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(in_channels, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def _norm(channels: int, batch_norm: bool) -> nn.Module:
    # Without batch normalisation the paper replaces each BN with the identity.
    return nn.BatchNorm2d(channels) if batch_norm else nn.Identity()


class _BasicBlock(nn.Module):
    def __init__(self, in_channels, out_channels, stride, batch_norm=True):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = _norm(out_channels, batch_norm)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = _norm(out_channels, batch_norm)
        self.relu1, self.relu2 = ReLU(), ReLU()
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                _norm(out_channels, batch_norm))

    def forward(self, x):
        out = self.relu1(self.bn1(self.conv1(x)))
        return self.relu2(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18 (He et al. 2016) with the stem's MaxPool kept (2x2), for 32x32 inputs;
    ``batch_norm=False`` replaces every BatchNorm with the identity."""

    def __init__(self, *, channels: int = 3, classes: int = 10, width: float = 1.0,
                 batch_norm: bool = True):
        super().__init__()
        widths = [max(1, int(w * width)) for w in (64, 128, 256, 512)]
        self.stem = nn.Sequential(nn.Conv2d(channels, widths[0], 3, 1, 1, bias=False),
                                  _norm(widths[0], batch_norm), ReLU(),
                                  MaxPool2d(kernel_size=2))
        blocks, in_channels = [], widths[0]
        for index, out_channels in enumerate(widths):
            for block in range(2):
                stride = 2 if index > 0 and block == 0 else 1
                blocks.append(_BasicBlock(in_channels, out_channels, stride, batch_norm))
                in_channels = out_channels
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(in_channels, classes))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def build_network(name: str, *, channels: int, classes: int, batch_norm: bool = False,
                  width: float = 1.0, pooling: str = "max") -> nn.Module:
    """`lenet5`, `vgg11`/`vgg13`/`vgg16`/`vgg19` or `resnet18`."""
    if name == "lenet5":
        return LeNet5(channels=channels, classes=classes, pooling=pooling)
    if name.startswith("vgg") and int(name[3:]) in VGG_LAYERS:
        return VGG(depth=int(name[3:]), channels=channels, classes=classes,
                   batch_norm=batch_norm, width=width)
    if name == "resnet18":
        return ResNet18(channels=channels, classes=classes, width=width, batch_norm=batch_norm)
    raise ValueError(f"unknown network {name!r}")
