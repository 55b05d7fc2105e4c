"""A deliberately naive CapsNet, written the way many tutorials write it.

For benchmarks only (benchmarks/throughput.py compares against it): the architecture, the
parameter count and the outputs equal ``capsnet.models.build("capsnet")`` when given the
same weights (``NaiveCapsNet.from_model``), but the votes come from tiling the inputs and
the weights with ``.repeat`` and routing tiles its tensors in every iteration. Depends on
torch only, so it runs without the capsnet package.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn


def squash(s: torch.Tensor, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    """Squash along ``dim`` (same formula and epsilon as capsnet.nn.routing.squash)."""
    sq_norm = (s * s).sum(dim=dim, keepdim=True)  # (..., 1)
    return s * sq_norm / ((1.0 + sq_norm) * torch.sqrt(sq_norm + eps))


class NaiveCapsNet(nn.Module):
    """Tutorial-style CapsNet; ``config`` is a capsnet CapsNetConfig (or any object with
    the same attributes)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.conv1 = nn.Conv2d(config.in_channels, config.conv_channels, config.conv_kernel)
        # one convolution per capsule dimension, as several tutorials do
        self.primary = nn.ModuleList(
            nn.Conv2d(
                config.conv_channels,
                config.primary_types,
                config.primary_kernel,
                stride=config.primary_stride,
            )
            for _ in range(config.primary_dim)
        )
        conv = config.input_size - config.conv_kernel + 1
        grid = (conv - config.primary_kernel) // config.primary_stride + 1
        self.num_primary = config.primary_types * grid * grid
        self.W = nn.Parameter(
            0.01
            * torch.randn(
                1, self.num_primary, config.num_classes, config.class_dim, config.primary_dim
            )
        )
        layers: list[nn.Module] = []
        sizes = [config.num_classes * config.class_dim, *config.decoder_hidden]
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), nn.ReLU()]
        pixels = config.in_channels * config.input_size * config.input_size
        layers += [nn.Linear(sizes[-1], pixels), nn.Sigmoid()]
        self.decoder = nn.Sequential(*layers) if config.decoder else None

    @classmethod
    def from_model(cls, model: nn.Module) -> NaiveCapsNet:
        """A NaiveCapsNet holding the same weights as a capsnet CapsNet ``model``."""
        cfg = model.config
        naive = cls(cfg)
        with torch.no_grad():
            naive.conv1.weight.copy_(model.conv1.weight)
            naive.conv1.bias.copy_(model.conv1.bias)
            # our primary channel index is type * dim + d; naive conv d holds the types
            weight = model.primary.conv.weight.view(
                cfg.primary_types, cfg.primary_dim, *model.primary.conv.weight.shape[1:]
            )  # (T, D, C, k, k)
            bias = model.primary.conv.bias.view(cfg.primary_types, cfg.primary_dim)  # (T, D)
            for d, conv in enumerate(naive.primary):
                conv.weight.copy_(weight[:, d])
                conv.bias.copy_(bias[:, d])
            naive.W.copy_(model.classes.weight.unsqueeze(0))
            if naive.decoder is not None:
                linears = [m for m in model.decoder.net if isinstance(m, nn.Linear)]
                ours = [m for m in naive.decoder if isinstance(m, nn.Linear)]
                for a, b in zip(ours, linears):
                    a.weight.copy_(b.weight)
                    a.bias.copy_(b.bias)
        return naive

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None):
        """x (B, C, H, W) -> (scores (B, K), poses (B, K, 16), reconstruction or None)."""
        batch = x.shape[0]
        h = F.relu(self.conv1(x))  # (B, 256, 20, 20)
        caps = [conv(h) for conv in self.primary]  # 8 x (B, 32, 6, 6)
        u = torch.stack(caps, dim=-1)  # (B, 32, 6, 6, 8)
        u = squash(u.reshape(batch, self.num_primary, -1))  # (B, 1152, 8)

        n_out = self.W.shape[2]
        u_tiled = u.unsqueeze(2).unsqueeze(-1).repeat(1, 1, n_out, 1, 1)  # (B, 1152, 10, 8, 1)
        w_tiled = self.W.repeat(batch, 1, 1, 1, 1)  # (B, 1152, 10, 16, 8)
        u_hat = torch.matmul(w_tiled, u_tiled).squeeze(-1)  # (B, 1152, 10, 16)
        u_hat_detached = u_hat.detach()

        b_ij = torch.zeros(batch, self.num_primary, n_out, device=x.device)  # (B, 1152, 10)
        iterations = self.config.routing_iterations
        for it in range(iterations):
            votes = u_hat if it == iterations - 1 else u_hat_detached
            c_ij = F.softmax(b_ij, dim=2)  # (B, 1152, 10)
            c_tiled = c_ij.unsqueeze(-1).repeat(1, 1, 1, votes.shape[-1])  # (B, 1152, 10, 16)
            s_j = (c_tiled * votes).sum(dim=1)  # (B, 10, 16)
            v_j = squash(s_j)  # (B, 10, 16)
            if it < iterations - 1:
                v_tiled = v_j.unsqueeze(1).repeat(1, self.num_primary, 1, 1)  # (B, 1152, 10, 16)
                b_ij = b_ij + (votes * v_tiled).sum(dim=-1)  # (B, 1152, 10)

        scores = torch.sqrt((v_j * v_j).sum(dim=-1) + 1e-8)  # (B, 10)
        reconstruction = None
        if self.decoder is not None:
            index = scores.argmax(dim=1) if target is None else target
            mask = F.one_hot(index, n_out).float()  # (B, 10)
            flat = (v_j * mask.unsqueeze(-1)).reshape(batch, -1)  # (B, 160)
            reconstruction = self.decoder(flat).view_as(x)  # (B, C, H, W)
        return scores, v_j, reconstruction
