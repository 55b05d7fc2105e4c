"""Matrix capsules with EM routing (Hinton, Sabour, Frosst 2018) and the smallNORB CNN.

Shape fields (in_channels, input_size, num_classes) are data settings: the defaults are the
MNIST shape every registered model shares; smallNORB is in_channels=1 or 2 (one or both
stereo images), input_size=32, num_classes=5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from capsnet.models import ModelOutput, register
from capsnet.nn.em_layers import (
    COORDINATE_ENTRIES,
    POSE_SHAPES,
    ROUTING_SCOPES,
    ClassCaps,
    ConvMatrixCaps,
    PrimaryMatrixCaps,
    coordinate_offsets,
)
from capsnet.nn.routing.em import EM_FINAL_LAMBDA, EM_MIN_VAR


def _check_positive(config, names: tuple[str, ...]) -> None:
    for name in names:
        if int(getattr(config, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)}")


BETA_A_SCALE = 1000.0  # about 1 / lambda: beta_a moves an activation logit by ~1 per unit


def _out(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


@dataclass
class EMCapsNetConfig:
    in_channels: int = 1
    input_size: int = 28
    num_classes: int = 10
    A: int = 32  # ReLU Conv1 channels (5x5, stride 2)
    B: int = 32  # primary capsule types (1x1)
    C: int = 32  # ConvCaps1 types (3x3, stride 2)
    D: int = 32  # ConvCaps2 types (3x3, stride 1)
    routing_iterations: int = 3
    final_lambda: float = EM_FINAL_LAMBDA
    min_var: float = EM_MIN_VAR
    coordinate_addition: bool = True
    pose: str = "matrix"  # matrix (4x4) | vector (16, with 16x16 transforms): paper ablation
    # global: a child's assignments sum to 1 over all parents of all windows it feeds (paper);
    # window: each K x K window routed as its own group (the ablation)
    routing_scope: str = "global"
    # paper: (index + 0.5) / size of the ClassCaps input grid added to vote entries 3 and 7
    # (the right-hand column's first two, Hinton et al. 2018); first-entries: the receptive-field
    # centre in input pixels, (pixel + 0.5) / image size, added to entries 0 and 1
    coordinate_form: str = "paper"
    # beta_a enters the activation logit lambda (beta_a_scale * beta_a - cost): with lambda
    # about 1e-3 an unscaled beta_a barely moves an activation
    # (docs/notes/2026-11-28-em-learning.md)
    beta_a_scale: float = BETA_A_SCALE
    # standardise each routing group's costs over its parents before the activation
    # (em_routing's normalise_cost); false: the paper's raw cost
    # (docs/notes/2026-11-28-em-learning.md)
    normalise_cost: bool = False

    # Saved configs without a field were trained with this value (capsnet.models.checkpoint.load).
    missing_field_defaults: ClassVar[dict[str, object]] = {
        "routing_scope": "window",
        "coordinate_form": "first-entries",
        "beta_a_scale": 1.0,
        "normalise_cost": False,
    }

    def __post_init__(self):
        _check_positive(
            self, ("in_channels", "input_size", "num_classes", "A", "B", "C", "D",
                   "routing_iterations"),
        )  # fmt: skip
        if self.pose not in POSE_SHAPES:
            raise ValueError(f"pose must be one of {', '.join(POSE_SHAPES)}, got {self.pose!r}")
        if self.routing_scope not in ROUTING_SCOPES:
            raise ValueError(
                f"routing_scope must be one of {', '.join(ROUTING_SCOPES)}, "
                f"got {self.routing_scope!r}"
            )
        if self.coordinate_form not in COORDINATE_ENTRIES:
            raise ValueError(
                f"coordinate_form must be one of {', '.join(COORDINATE_ENTRIES)}, "
                f"got {self.coordinate_form!r}"
            )
        if self.final_lambda <= 0 or self.min_var <= 0 or self.beta_a_scale <= 0:
            raise ValueError("final_lambda, min_var and beta_a_scale must be > 0")
        if self.grid_sizes[-1] < 1:
            raise ValueError(f"input_size {self.input_size} is too small (needs >= 19)")

    @property
    def grid_sizes(self) -> tuple[int, int, int]:
        """Side of the primary, ConvCaps1 and ConvCaps2 grids (14, 6, 4 at 32x32)."""
        primary = _out(self.input_size, 5, 2)
        caps1 = _out(primary, 3, 2)
        return primary, caps1, _out(caps1, 3, 1)


# Receptive-field centre of ConvCaps2 cell i in input pixels ("first-entries" form): conv1
# (5x5, stride 2) maps cell i to pixel 2i + 2; ConvCaps1 (3x3, stride 2) maps i to primary
# 2i + 1; ConvCaps2 (3x3, stride 1) maps i to ConvCaps1 i + 1. Hence pixel
# 2 * (2 * (i + 1) + 1) + 2 = 4i + 8.
PIXEL_CENTRE_FIRST, PIXEL_CENTRE_STEP = 8.0, 4.0


@register(
    "em-capsnet",
    EMCapsNetConfig,
    "Matrix capsules, EM routing, A=B=C=D=32 (Hinton et al. 2018)",
    capsules=True,
    family="em",
)
@register(
    "em-capsnet-small",
    EMCapsNetConfig,
    "Matrix capsules, EM routing, small variant A=64, B=8, C=D=16",
    capsules=True,
    family="em",
    A=64,
    B=8,
    C=16,
    D=16,
)
class EMCapsNet(nn.Module):
    """ReLU Conv1 -> PrimaryCaps -> ConvCaps1 -> ConvCaps2 -> class capsules (EM routing)."""

    default_loss = "spread"

    def __init__(self, config: EMCapsNetConfig):
        super().__init__()
        self.config = config
        routing = {
            "iterations": config.routing_iterations,
            "final_lambda": config.final_lambda,
            "min_var": config.min_var,
            "pose": config.pose,
            "beta_a_scale": config.beta_a_scale,
            "normalise_cost": config.normalise_cost,
        }
        scope = {"routing_scope": config.routing_scope}
        self.conv1 = nn.Conv2d(config.in_channels, config.A, kernel_size=5, stride=2)
        self.primary = PrimaryMatrixCaps(config.A, config.B)
        self.caps1 = ConvMatrixCaps(config.B, config.C, kernel=3, stride=2, **routing, **scope)
        self.caps2 = ConvMatrixCaps(config.C, config.D, kernel=3, stride=1, **routing, **scope)
        self.classes = ClassCaps(
            config.D,
            config.num_classes,
            coordinate_addition=config.coordinate_addition,
            coordinate_entries=COORDINATE_ENTRIES[config.coordinate_form],
            **routing,
        )

    def compile_routing(self, enabled: bool = True) -> EMCapsNet:
        """Route the convolutional capsule layers with the EM routing steps compiled by
        torch.compile (``capsnet.nn.routing.em.compiled_steps``): several times faster per step
        after a one-off compilation per input shape; falls back to eager, with a warning,
        where torch.compile cannot build kernels. The class capsules (one small group per
        image) stay eager: their graphs would push the steps past dynamo's recompile limit."""
        for layer in (self.caps1, self.caps2):
            layer.compiled, layer.fallback = enabled, None
        return self

    def compile_fallback(self) -> str | None:
        """Why compiled routing fell back to eager (the first layer's error), or None."""
        return next((f for f in (self.caps1.fallback, self.caps2.fallback) if f), None)

    def coordinate_offsets(self, h: int, w: int, image_h: int, image_w: int, device):
        """(h, w, 2) scaled (row, col) of the ClassCaps input grid cells, on ``device``
        (built once per shape), in the config's ``coordinate_form``."""
        if self.config.coordinate_form == "paper":
            return coordinate_offsets(h, w, 0.0, 1.0, h, w, device)  # (index + 0.5) / size
        first, step = PIXEL_CENTRE_FIRST, PIXEL_CENTRE_STEP
        return coordinate_offsets(h, w, first, step, image_h, image_w, device)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> ModelOutput:
        """x (B, C, H, W) in [0, 1] -> class activations (B, E) and poses (B, E, 16)."""
        h = F.relu(self.conv1(x))  # (B, A, 14, 14)
        poses, act = self.primary(h)  # (B, 14, 14, B, 16), (B, 14, 14, B)
        poses, act = self.caps1(poses, act)  # (B, 6, 6, C, 16), (B, 6, 6, C)
        poses, act = self.caps2(poses, act)  # (B, 4, 4, D, 16), (B, 4, 4, D)
        offsets = self.coordinate_offsets(
            poses.shape[1], poses.shape[2], x.shape[2], x.shape[3], poses.device
        )  # (4, 4, 2)
        class_poses, scores = self.classes(poses, act, offsets)  # (B, E, 16), (B, E)
        return ModelOutput(scores, class_poses, None)


@dataclass
class SmallNORBCNNConfig:
    in_channels: int = 1
    input_size: int = 28
    num_classes: int = 10
    channels: tuple[int, int] = (32, 64)
    hidden: int = 1024
    dropout: float = 0.5

    def __post_init__(self):
        self.channels = tuple(int(c) for c in self.channels)
        _check_positive(self, ("in_channels", "input_size", "num_classes", "hidden"))
        if len(self.channels) != 2 or min(self.channels) < 1:
            raise ValueError(f"channels must be two positive ints, got {self.channels}")
        if self.input_size < 4:
            raise ValueError(f"input_size must be >= 4, got {self.input_size}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


@register(
    "smallnorb-cnn",
    SmallNORBCNNConfig,
    "smallNORB baseline CNN: conv 32@5x5+pool, conv 64@5x5+pool, FC 1024, dropout",
    capsules=False,
    family="smallnorb-cnn",
)
class SmallNORBCNN(nn.Module):
    """The EM paper's CNN baseline ('same' 5x5 convolutions, 2x2 max pools): 4.25M
    parameters at 32x32 with 5 classes."""

    default_loss = "cross-entropy"

    def __init__(self, config: SmallNORBCNNConfig):
        super().__init__()
        self.config = config
        c1, c2 = config.channels
        self.conv1 = nn.Conv2d(config.in_channels, c1, 5, padding=2)
        self.conv2 = nn.Conv2d(c1, c2, 5, padding=2)
        side = config.input_size // 2 // 2
        self.fc = nn.Linear(c2 * side * side, config.hidden)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.hidden, config.num_classes)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> ModelOutput:
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)  # (B, 32, 16, 16)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)  # (B, 64, 8, 8)
        h = self.dropout(F.relu(self.fc(h.flatten(1))))  # (B, 1024)
        return ModelOutput(self.classifier(h).float())  # (B, classes)
