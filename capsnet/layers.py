"""Capsule layers: primary capsules, the dense dynamic-routing layer and the decoder."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from capsnet.routing import dynamic_routing, squash


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


class PrimaryCapsules(nn.Module):
    """One convolution whose channels are grouped into ``caps_types`` capsules of ``caps_dim``.

    A capsule is formed across the ``caps_dim`` channels of one capsule type at one
    position (channel index = type * caps_dim + d), then squashed.
    """

    def __init__(self, in_channels: int, caps_types: int, caps_dim: int, kernel: int, stride: int):
        super().__init__()
        self.caps_types = caps_types
        self.caps_dim = caps_dim
        self.conv = nn.Conv2d(in_channels, caps_types * caps_dim, kernel, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)  # (B, T*D, h, w)
        batch, _, h, w = out.shape
        out = out.view(batch, self.caps_types, self.caps_dim, h, w)  # (B, T, D, h, w)
        out = out.permute(0, 1, 3, 4, 2).reshape(batch, -1, self.caps_dim)  # (B, T*h*w, D)
        return squash(out)


class DenseCapsules(nn.Module):
    """Fully connected capsule layer with routing by agreement.

    Votes u_hat[j|i] = W_ij u_i come from one einsum over W of shape (n_in, n_out, d_out, d_in).
    """

    def __init__(
        self,
        n_in: int,
        d_in: int,
        n_out: int,
        d_out: int,
        iterations: int = 3,
        detach_inner: bool = True,
    ):
        super().__init__()
        self.iterations = iterations
        self.detach_inner = detach_inner
        self.weight = nn.Parameter(torch.empty(n_in, n_out, d_out, d_in))
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(d_in) * 0.1)

    def votes(self, u: torch.Tensor) -> torch.Tensor:
        """u (B, n_in, d_in) -> u_hat (B, n_in, n_out, d_out)."""
        return torch.einsum("bik,ijdk->bijd", u, self.weight)

    def forward(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u_hat = self.votes(u)  # (B, n_in, n_out, d_out)
        return dynamic_routing(u_hat, self.iterations, self.detach_inner)


class Decoder(nn.Module):
    """FC decoder from the masked class capsules to the image (sigmoid output)."""

    def __init__(
        self, in_features: int, hidden: tuple[int, ...], image_shape: tuple[int, int, int]
    ):
        super().__init__()
        self.image_shape = image_shape
        sizes = [in_features, *hidden]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        layers.append(nn.Linear(sizes[-1], math.prod(image_shape)))
        self.net = nn.Sequential(*layers)

    def forward(self, poses: torch.Tensor, mask_index: torch.Tensor) -> torch.Tensor:
        """poses (B, K, D), mask_index (B,) -> reconstruction (B, C, H, W)."""
        mask = F.one_hot(mask_index, poses.shape[1]).to(poses.dtype)  # (B, K)
        masked = (poses * mask.unsqueeze(-1)).flatten(1)  # (B, K*D)
        out = torch.sigmoid(self.net(masked).float())  # (B, C*H*W)
        return out.view(-1, *self.image_shape)
