"""Conv-net baselines: LeNet5 and the Sabour et al. baseline CNN (Sabour et al. 2017, section 5)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from capsnet.models import ModelOutput, register


def _check_positive(config, names: tuple[str, ...]) -> None:
    for name in names:
        if int(getattr(config, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")


@dataclass
class LeNet5Config:
    in_channels: int = 1
    input_size: int = 28
    num_classes: int = 10

    def __post_init__(self):
        _check_positive(self, ("in_channels", "input_size", "num_classes"))
        if self.input_size < 12:
            raise ValueError(f"input_size must be >= 12 for LeNet5, got {self.input_size}")


@register(
    "lenet5",
    LeNet5Config,
    "LeNet5: conv 6@5x5, pool, conv 16@5x5, pool, FC 120-84",
    capsules=False,
    family="lenet5",
)
class LeNet5(nn.Module):
    default_loss = "cross-entropy"

    def __init__(self, config: LeNet5Config):
        super().__init__()
        self.config = config
        self.conv1 = nn.Conv2d(config.in_channels, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        side = (config.input_size // 2 - 4) // 2
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, config.num_classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> ModelOutput:
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)  # (B, 6, 14, 14)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)  # (B, 16, 5, 5)
        h = F.relu(self.fc1(h.flatten(1)))  # (B, 120)
        h = F.relu(self.fc2(h))  # (B, 84)
        return ModelOutput(self.fc3(h).float())  # (B, classes)


@dataclass
class BaselineCNNConfig:
    in_channels: int = 1
    input_size: int = 28
    num_classes: int = 10
    channels: tuple[int, ...] = (256, 256, 128)
    hidden: tuple[int, ...] = (328, 192)
    dropout: float = 0.5

    def __post_init__(self):
        self.channels = tuple(int(c) for c in self.channels)
        self.hidden = tuple(int(h) for h in self.hidden)
        _check_positive(self, ("in_channels", "input_size", "num_classes"))
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


@register(
    "baseline-cnn",
    BaselineCNNConfig,
    "Sabour et al. baseline: conv 256-256-128, FC 328-192",
    capsules=False,
    family="sabour-cnn",
)
class BaselineCNN(nn.Module):
    """Three 5x5 'same' convolutions without pooling, two FC layers, dropout, classifier."""

    default_loss = "cross-entropy"

    def __init__(self, config: BaselineCNNConfig):
        super().__init__()
        self.config = config
        convs, prev = [], config.in_channels
        for ch in config.channels:
            convs += [nn.Conv2d(prev, ch, 5, padding=2), nn.ReLU(inplace=True)]
            prev = ch
        self.features = nn.Sequential(*convs)
        fcs, width = [], prev * config.input_size**2
        for h in config.hidden:
            fcs += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            width = h
        self.hidden = nn.Sequential(*fcs)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(width, config.num_classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> ModelOutput:
        h = self.features(x)  # (B, 128, H, W)
        h = self.hidden(h.flatten(1))  # (B, 192)
        return ModelOutput(self.classifier(self.dropout(h)).float())  # (B, classes)
