"""Dynamic routing by agreement (Sabour et al. 2017) and squash, as pure tensor functions."""

from __future__ import annotations

import torch

SQUASH_EPS = 1e-8


def squash(s: torch.Tensor, dim: int = -1, eps: float = SQUASH_EPS) -> torch.Tensor:
    """Squash vectors along ``dim``: length |s|^2 / (1 + |s|^2), direction of s.

    Computed in fp32 (also under autocast); ``eps`` inside the square root keeps the
    gradient finite at s = 0.
    """
    s = s.float()
    sq_norm = (s * s).sum(dim=dim, keepdim=True)  # (..., 1, ...)
    scale = sq_norm / ((1.0 + sq_norm) * torch.sqrt(sq_norm + eps))
    return s * scale


def safe_norm(v: torch.Tensor, dim: int = -1, eps: float = SQUASH_EPS) -> torch.Tensor:
    """Euclidean length in fp32 with a finite gradient at zero."""
    v = v.float()
    return torch.sqrt((v * v).sum(dim=dim) + eps)


def dynamic_routing(
    u_hat: torch.Tensor, iterations: int, detach_inner: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing by agreement (Sabour et al. 2017).

    Args:
        u_hat: votes of each child for each parent, (B, n_in, n_out, d_out).
        iterations: routing iterations r >= 1.
        detach_inner: stop gradients through u_hat in all but the last iteration.

    Returns:
        v: parent capsules, (B, n_out, d_out), squashed.
        c: coupling coefficients of the last iteration, (B, n_in, n_out); sum to 1 over n_out.
    """
    if iterations < 1:
        raise ValueError(f"routing iterations must be >= 1, got {iterations}")
    u_hat = u_hat.float()
    batch, n_in, n_out, _ = u_hat.shape
    u_detached = u_hat.detach() if detach_inner else u_hat
    logits = u_hat.new_zeros(batch, n_in, n_out)  # (B, n_in, n_out): per example, not learned
    for it in range(iterations):
        last = it == iterations - 1
        votes = u_hat if last else u_detached
        c = torch.softmax(logits, dim=2, dtype=torch.float32)  # (B, n_in, n_out)
        s = torch.einsum("bij,bijd->bjd", c, votes)  # (B, n_out, d_out)
        v = squash(s)  # (B, n_out, d_out)
        if not last:
            logits = logits + torch.einsum("bijd,bjd->bij", votes, v)  # (B, n_in, n_out)
    return v, c
