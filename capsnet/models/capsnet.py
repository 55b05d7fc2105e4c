"""CapsNet with dynamic routing (Sabour, Frosst, Hinton 2017)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from capsnet.models import ModelOutput, register
from capsnet.nn.layers import Decoder, DenseCapsules, PrimaryCapsules, conv_output_size
from capsnet.nn.routing import safe_norm


@dataclass
class CapsNetConfig:
    in_channels: int = 1
    input_size: int = 28
    num_classes: int = 10
    conv_channels: int = 256
    conv_kernel: int = 9
    primary_types: int = 32
    primary_dim: int = 8
    primary_kernel: int = 9
    primary_stride: int = 2
    class_dim: int = 16
    routing_iterations: int = 3
    detach_inner: bool = True
    decoder: bool = True
    decoder_hidden: tuple[int, ...] = (512, 1024)

    def __post_init__(self):
        self.decoder_hidden = tuple(int(h) for h in self.decoder_hidden)
        for name in (
            "in_channels",
            "input_size",
            "num_classes",
            "conv_channels",
            "primary_types",
            "primary_dim",
            "class_dim",
            "routing_iterations",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.primary_grid < 1:
            raise ValueError(f"input_size {self.input_size} is too small for the kernels")

    @property
    def primary_grid(self) -> int:
        conv = conv_output_size(self.input_size, self.conv_kernel)
        return conv_output_size(conv, self.primary_kernel, self.primary_stride)

    @property
    def num_primary(self) -> int:
        return self.primary_types * self.primary_grid**2


@register(
    "capsnet",
    CapsNetConfig,
    "Sabour et al. 2017 CapsNet (3 routing iterations)",
    capsules=True,
    family="capsnet",
)
@register(
    "capsnet-small",
    CapsNetConfig,
    "CapsNet with 64 conv channels and 8 primary types (for CPU runs)",
    capsules=True,
    family="capsnet",
    conv_channels=64,
    primary_types=8,
    decoder_hidden=(256, 512),
)
class CapsNet(nn.Module):
    default_loss = "margin"
    #: torch.compile mode of ``compile_routing`` per device type (docs/guides/gpu.md, "compile"):
    #: CUDA graphs on CUDA, where training batches have one static shape.
    COMPILE_MODES: ClassVar[dict[str, str]] = {"cuda": "reduce-overhead"}

    def __init__(self, config: CapsNetConfig):
        super().__init__()
        self.config = config
        self.conv1 = nn.Conv2d(config.in_channels, config.conv_channels, config.conv_kernel)
        self.primary = PrimaryCapsules(
            config.conv_channels,
            config.primary_types,
            config.primary_dim,
            config.primary_kernel,
            config.primary_stride,
        )
        self.classes = DenseCapsules(
            config.num_primary,
            config.primary_dim,
            config.num_classes,
            config.class_dim,
            iterations=config.routing_iterations,
            detach_inner=config.detach_inner,
        )
        # channels_last weights make both convolutions run channels_last (faster oneDNN/cuDNN
        # kernels); the capsule formation in PrimaryCapsules is layout independent.
        self.conv1.to(memory_format=torch.channels_last)
        self.primary.conv.to(memory_format=torch.channels_last)
        image_shape = (config.in_channels, config.input_size, config.input_size)
        self.decoder = (
            Decoder(config.num_classes * config.class_dim, config.decoder_hidden, image_shape)
            if config.decoder
            else None
        )

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> ModelOutput:
        """x (B, C, H, W) in [0, 1]; target masks the decoder: labels (B,), or (B, n) for one
        reconstruction per label (see ``reconstruct``); None masks by the prediction."""
        x = x.contiguous(memory_format=torch.channels_last)  # (B, C, H, W)
        h = F.relu(self.conv1(x), inplace=True)  # (B, conv_channels, G, G), channels_last
        u = self.primary(h)  # (B, n_primary, primary_dim)
        v, _ = self.classes(u)  # (B, K, class_dim)
        scores = safe_norm(v)  # (B, K)
        reconstruction = None
        if self.decoder is not None:
            mask_index = scores.argmax(dim=1) if target is None else target
            reconstruction = self.reconstruct(v, mask_index)  # (B, [n,] C, H, W)
        return ModelOutput(scores, v, reconstruction)

    def compile_routing(self, enabled: bool = True) -> CapsNet:
        """torch.compile the whole forward (convolutions, capsules, routing, decoder; the
        backward with it) in the mode of ``COMPILE_MODES`` for the parameters' device
        ("default" where none is named); ``enabled=False`` goes back to eager. The weights
        and the state_dict keys are unchanged."""
        if not enabled:
            self._compiled_call_impl = None
            return self
        from capsnet.nn.compiling import quiet_cuda_home_probe

        quiet_cuda_home_probe()
        device = next(self.parameters()).device
        self.compile(mode=self.COMPILE_MODES.get(device.type, "default"))
        return self

    def compile_fallback(self) -> str | None:
        """None: a compile error is raised, never run around (``EMCapsNet``'s falls back)."""
        return None

    def reconstruct(self, poses: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The decoder's image of each labelled class capsule: poses (B, K, D) with labels
        (B,) -> (B, C, H, W); with labels (B, n) -> (B, n, C, H, W), the i-th image decoded
        from capsule labels[:, i] alone (MultiMNIST: one reconstruction per digit)."""
        if self.decoder is None:
            raise ValueError("reconstruct: this model has no decoder (decoder=False)")
        if labels.dim() == 1:
            return self.decoder(poses, labels)  # (B, C, H, W)
        batch, n = labels.shape
        repeated = poses.unsqueeze(1).expand(batch, n, *poses.shape[1:])  # (B, n, K, D)
        images = self.decoder(repeated.flatten(0, 1), labels.flatten())  # (B*n, C, H, W)
        return images.view(batch, n, *images.shape[1:])  # (B, n, C, H, W)
