"""Capsule layers: primary capsules, the dense dynamic-routing layer and the decoder."""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import nn

from capsnet.nn.compiling import has_autocast
from capsnet.nn.routing import dynamic_routing, squash

ROUTING_CHUNK = 32  # examples per routing chunk on a CPU (best of 16..128 on 2 cores, batch 128)


def routing_chunk(device: torch.device, batch: int) -> int:
    """Examples routed together on ``device``: ``ROUTING_CHUNK`` on a CPU, where the chunk's
    tensors should stay in cache; the whole batch elsewhere (a GPU wants few, large kernels)."""
    return ROUTING_CHUNK if device.type == "cpu" else max(1, batch)


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def fused_dynamic_routing(
    u: torch.Tensor,
    weight: torch.Tensor,
    iterations: int,
    detach_inner: bool = True,
    chunk_size: int = ROUTING_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dynamic_routing(einsum("bik,ijdk->bijd", u, weight), ...)`` without building u_hat.

    Because u_hat[j|i] = W_ij u_i is linear in u, both routing sums become matmuls over
    the flattened (child, d_in) axis of size n_in * d_in:
        s_j = sum_i c_ij W_ij u_i = W_j (c_j * u)          (one GEMM per parent j)
        <u_hat[j|i], v_j> = <u_i, W_ij^T v_j>               (q = v_j W_j, then a dot over d_in)
    The largest tensors are (n_out, b, n_in * d_in), half the size of u_hat, and the batch
    is routed ``chunk_size`` examples at a time so they stay in cache. Under bf16 autocast
    the products run in bf16; squash and the softmax of the routing logits stay fp32.

    Args:
        u: child capsules, (B, n_in, d_in).
        weight: W, (n_in, n_out, d_out, d_in).
        iterations: routing iterations r >= 1.
        detach_inner: stop gradients through the votes in all but the last iteration.
        chunk_size: examples routed together (>= 1).

    Returns:
        v (B, n_out, d_out) squashed; c (B, n_in, n_out) of the last iteration.
    """
    if iterations < 1:
        raise ValueError(f"routing iterations must be >= 1, got {iterations}")
    n_in, n_out, d_out, d_in = weight.shape
    weight = _autocast_once(weight)
    w = weight.permute(0, 3, 1, 2).reshape(n_in * d_in, n_out * d_out)  # (I*K, J*D)
    w_j = w.view(n_in * d_in, n_out, d_out).permute(1, 0, 2)  # (J, I*K, D): strided view
    vs, cs = [], []
    for u_chunk in u.split(max(1, chunk_size)):
        v, c = _route_chunk(u_chunk, w, w_j, iterations, detach_inner)
        vs.append(v)  # (b, J, D)
        cs.append(c)  # (b, I, J)
    return torch.cat(vs), torch.cat(cs)  # (B, J, D), (B, I, J)


def _autocast_once(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` in autocast's dtype when autocast is on for its device, else unchanged.
    Every routing product would cast it again (it is a view, not a parameter, so autocast
    keeps no cached copy); one cast gives the same forward values once per forward, and
    sums the weight's gradient over the products in bf16 before casting it back."""
    kind = weight.device.type
    if has_autocast(kind) and torch.is_autocast_enabled(kind):
        return weight.to(torch.get_autocast_dtype(kind))
    return weight


def _route_chunk(
    u: torch.Tensor, w: torch.Tensor, w_j: torch.Tensor, iterations: int, detach_inner: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing for one chunk; u (b, I, K), w (I*K, J*D), w_j (J, I*K, D) a view of w."""
    batch, n_in, d_in = u.shape
    n_out, _, d_out = w_j.shape
    u_flat = u.reshape(batch, n_in * d_in)  # (b, I*K)
    grad = torch.is_grad_enabled()
    logits = None  # (J, b, I): per example, zero before the first iteration
    for it in range(iterations):
        last = it == iterations - 1
        with torch.set_grad_enabled(grad and (last or not detach_inner)):
            if logits is None:  # uniform coupling: one GEMM for all parents
                s = (u_flat @ w).view(batch, n_out, d_out) / n_out  # (b, J, D)
                s = s.transpose(0, 1)  # (J, b, D)
                if last:
                    c = u_flat.new_full((n_out, batch, n_in), 1.0 / n_out)  # (J, b, I)
            else:
                c = torch.softmax(logits, dim=0, dtype=torch.float32)  # (J, b, I)
                z = (c.unsqueeze(-1) * u.unsqueeze(0)).view(n_out, batch, n_in * d_in)  # (J,b,I*K)
                s = torch.bmm(z, w_j)  # (J, b, D)
            v = squash(s)  # (J, b, D), fp32
            if not last:
                q = torch.bmm(v, w_j.transpose(1, 2))  # (J, b, I*K)
                agreement = (q.view(n_out, batch, n_in, d_in) * u).sum(-1)  # (J, b, I)
                logits = agreement.float() if logits is None else logits + agreement
    return v.transpose(0, 1), c.permute(1, 2, 0)  # (b, J, D), (b, I, J)


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
        chunk_size: int | None = None,
    ):
        super().__init__()
        self.iterations = iterations
        self.detach_inner = detach_inner
        # examples routed together; None: per device (routing_chunk); 0: the reference path
        self.chunk_size = chunk_size
        self.weight = nn.Parameter(torch.empty(n_in, n_out, d_out, d_in))
        nn.init.normal_(self.weight, std=1.0 / math.sqrt(d_in) * 0.1)

    def votes(self, u: torch.Tensor) -> torch.Tensor:
        """u (B, n_in, d_in) -> u_hat (B, n_in, n_out, d_out)."""
        return torch.einsum("bik,ijdk->bijd", u, self.weight)

    def forward(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """u (B, n_in, d_in) -> (v (B, n_out, d_out), c (B, n_in, n_out)).

        Same result as ``dynamic_routing(self.votes(u), ...)`` (to fp32 rounding), computed
        by ``fused_dynamic_routing`` in chunks of ``chunk_size`` examples (None: chosen per
        device by ``routing_chunk``); ``chunk_size=0`` runs the plain reference path instead.
        """
        if self.chunk_size == 0:
            u_hat = self.votes(u)  # (B, n_in, n_out, d_out)
            return dynamic_routing(u_hat, self.iterations, self.detach_inner)
        chunk = self.chunk_size or routing_chunk(u.device, u.shape[0])
        return fused_dynamic_routing(u, self.weight, self.iterations, self.detach_inner, chunk)


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
