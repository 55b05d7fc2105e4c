"""Losses: margin (dynamic routing), reconstruction, spread (EM routing), cross-entropy."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _as_multi_hot(target: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Int labels (B,) or multi-hot (B, K) -> float (B, K)."""
    if target.dim() == 1:
        return F.one_hot(target.long(), num_classes).float()
    return target.float()


def margin_loss(
    lengths: torch.Tensor,
    target: torch.Tensor,
    m_plus: float = 0.9,
    m_minus: float = 0.1,
    lam: float = 0.5,
) -> torch.Tensor:
    """Margin loss summed over classes, averaged over the batch.

    lengths (B, K) capsule lengths; target (B,) labels or (B, K) multi-hot.
    """
    t = _as_multi_hot(target, lengths.shape[1])  # (B, K)
    lengths = lengths.float()
    present = t * F.relu(m_plus - lengths).pow(2)  # (B, K)
    absent = lam * (1.0 - t) * F.relu(lengths - m_minus).pow(2)  # (B, K)
    return (present + absent).sum(dim=1).mean()


def reconstruction_loss(
    reconstruction: torch.Tensor, images: torch.Tensor, weight: float = 0.0005
) -> torch.Tensor:
    """Sum of squared errors per example, averaged over the batch, scaled by ``weight``.

    reconstruction and images (B, C, H, W), or (B, n, C, H, W) for n images per example
    (MultiMNIST: each digit against its own image), whose errors are summed.
    """
    if reconstruction.shape != images.shape:
        raise ValueError(
            f"reconstruction_loss: reconstruction {tuple(reconstruction.shape)} and images "
            f"{tuple(images.shape)} differ in shape"
        )
    diff = reconstruction.float() - images.float()  # (B, [n,] C, H, W)
    return weight * diff.pow(2).flatten(1).sum(dim=1).mean()


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy for int labels (B,), or for multi-hot targets (B, K) as
    independent sigmoids (each present class is a positive)."""
    if target.dim() == 1:
        return F.cross_entropy(logits.float(), target.long())
    return (
        F.binary_cross_entropy_with_logits(logits.float(), target.float(), reduction="sum")
        / (logits.shape[0])
    )


def spread_loss(activations: torch.Tensor, target: torch.Tensor, margin: float) -> torch.Tensor:
    """Spread loss sum_{i != t} max(0, m - (a_t - a_i))^2, averaged over the batch.

    activations (B, K); target (B,) int labels.
    """
    activations = activations.float()
    a_t = activations.gather(1, target.long().view(-1, 1))  # (B, 1)
    gaps = F.relu(margin - (a_t - activations)).pow(2)  # (B, K)
    not_target = 1.0 - F.one_hot(target.long(), activations.shape[1]).float()  # (B, K)
    return (gaps * not_target).sum(dim=1).mean()
