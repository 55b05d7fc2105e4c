"""Slow, readable reference for EM routing and the em-capsnet forward pass.

Written straight from the paper's equations (explicit (V - mu)^2, Gaussian log-densities,
a Python loop over output positions in convolutional capsule layers) so that the fast,
vectorised code in capsnet/routing/em.py and capsnet/em_layers.py can be checked against it
(tests/test_em.py) and timed against it (benchmarks/em_throughput.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from capsnet.em_layers import COORD_ENTRIES


def em_routing_reference(
    votes: torch.Tensor,
    activations: torch.Tensor,
    beta_v: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int = 3,
    final_lambda: float = 0.01,
    min_var: float = 0.0005,
    eps: float = 1e-6,
):
    """votes (B, I, J, P), activations (B, I) -> pose (B, J, P), activation (B, J),
    assignments R (B, I, J), variance (B, J, P)."""
    batch, n_in, n_out, _ = votes.shape
    a_in = activations[:, :, None]  # (B, I, 1)
    r = torch.full((batch, n_in, n_out), 1.0 / n_out, dtype=votes.dtype)  # (B, I, J)
    for it in range(iterations):
        lam = final_lambda * (1.0 - 0.95 ** (it + 1))
        # M-step: weighted Gaussian fit per parent, then the parent's activation
        r_a = r * a_in  # (B, I, J)
        mass = r_a.sum(dim=1)  # (B, J)
        weight = (r_a + eps) / (mass[:, None, :] + n_in * eps)  # (B, I, J); sum_i = 1
        mu = (weight[..., None] * votes).sum(dim=1)  # (B, J, P)
        var = (weight[..., None] * (votes - mu[:, None]) ** 2).sum(dim=1) + min_var  # (B, J, P)
        sigma = torch.sqrt(var)  # (B, J, P)
        cost = ((beta_v[:, None] + torch.log(sigma)) * mass[..., None]).sum(dim=2)  # (B, J)
        activation = torch.sigmoid(lam * (beta_a - cost))  # (B, J)
        if it == iterations - 1:
            break
        # E-step: posterior of each parent given the vote
        log_p = (
            -((votes - mu[:, None]) ** 2) / (2 * var[:, None])
            - torch.log(sigma[:, None])
            - 0.5 * math.log(2 * math.pi)
        ).sum(dim=3)  # (B, I, J)
        r = torch.softmax(torch.log(activation)[:, None, :] + log_p, dim=2)  # (B, I, J)
    return mu, activation, r, var


def conv_caps_reference(layer, poses: torch.Tensor, activations: torch.Tensor):
    """A ConvMatrixCaps forward with a loop over output positions.

    poses (B, H, W, T, 16), activations (B, H, W, T) -> (B, H', W', T_out, 16), (B, H', W', T_out).
    """
    k, s = layer.kernel, layer.stride
    batch, h, w, t_in, _ = poses.shape
    h_out, w_out = (h - k) // s + 1, (w - k) // s + 1
    rows, cols = layer.rows, layer.weight.shape[-1]
    out_poses = [[None] * w_out for _ in range(h_out)]
    out_acts = [[None] * w_out for _ in range(h_out)]
    for y in range(h_out):
        for x in range(w_out):
            window = poses[:, y * s : y * s + k, x * s : x * s + k]  # (B, K, K, T, 16)
            a = activations[:, y * s : y * s + k, x * s : x * s + k].reshape(batch, -1)  # (B, KKT)
            m = window.reshape(batch, k * k * t_in, rows, cols)  # (B, KKT, r, c)
            votes = torch.einsum("birc,ijcd->bijrd", m, layer.weight)  # (B, KKT, J, r, c)
            votes = votes.reshape(batch, k * k * t_in, -1, 16)  # (B, KKT, J, 16)
            pose, act, _, _ = em_routing_reference(
                votes, a, layer.beta_v, layer.beta_a, layer.iterations, layer.final_lambda,
                layer.min_var,
            )  # fmt: skip
            out_poses[y][x], out_acts[y][x] = pose, act
    poses_out = torch.stack([torch.stack(row, dim=1) for row in out_poses], dim=1)  # (B,H',W',J,16)
    acts_out = torch.stack([torch.stack(row, dim=1) for row in out_acts], dim=1)  # (B, H', W', J)
    return poses_out, acts_out


def class_caps_reference(layer, poses: torch.Tensor, activations: torch.Tensor, offsets):
    """A ClassCaps forward, votes built position by position. -> (B, E, 16), (B, E)."""
    batch, h, w, t_in, _ = poses.shape
    rows, cols = layer.rows, layer.weight.shape[-1]
    all_votes = []
    for y in range(h):
        for x in range(w):
            m = poses[:, y, x].reshape(batch, t_in, rows, cols)  # (B, T, r, c)
            votes = torch.einsum("btrc,tecd->bterd", m, layer.weight)  # (B, T, E, r, c)
            votes = votes.reshape(batch, t_in, -1, 16).clone()  # (B, T, E, 16)
            if layer.coordinate_addition:
                votes[..., COORD_ENTRIES[0]] += offsets[y, x, 0]
                votes[..., COORD_ENTRIES[1]] += offsets[y, x, 1]
            all_votes.append(votes)
    votes = torch.cat(all_votes, dim=1)  # (B, HWT, E, 16): position-major like the fast layer
    pose, act, _, _ = em_routing_reference(
        votes, activations.reshape(batch, -1), layer.beta_v, layer.beta_a, layer.iterations,
        layer.final_lambda, layer.min_var,
    )  # fmt: skip
    return pose, act


class ReferenceEMCapsNet(nn.Module):
    """The same network as a given EMCapsNet (sharing its parameters), computed with the
    readable reference code above."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, target=None):
        from capsnet.em_layers import coordinate_offsets
        from capsnet.models import ModelOutput
        from capsnet.models.em import _CENTRE_FIRST, _CENTRE_STEP

        m = self.model
        h = torch.relu(m.conv1(x))  # (B, A, h, w)
        poses, act = m.primary(h)  # (B, h, w, B, 16), (B, h, w, B)
        poses, act = conv_caps_reference(m.caps1, poses, act)  # (B, h1, w1, C, 16)
        poses, act = conv_caps_reference(m.caps2, poses, act)  # (B, h2, w2, D, 16)
        offsets = coordinate_offsets(
            poses.shape[1], poses.shape[2], _CENTRE_FIRST, _CENTRE_STEP, x.shape[2], x.shape[3]
        )  # (h2, w2, 2)
        class_poses, scores = class_caps_reference(m.classes, poses, act, offsets)
        return ModelOutput(scores, class_poses, None)
