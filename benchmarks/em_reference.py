"""Slow, readable reference for EM routing and the em-capsnet forward pass.

Written straight from the paper's equations (explicit (V - mu)^2, Gaussian log-densities,
a Python loop over output positions in convolutional capsule layers) so that the fast,
vectorised code in capsnet/nn/routing/em.py and capsnet/nn/em_layers.py can be checked against it
(tests/test_em.py) and timed against it (benchmarks/em_throughput.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _m_step(votes, activations, r, beta_v, beta_a, lam, min_var, eps, normalise=False):
    """Weighted Gaussian fit per parent and its activation: votes (B, I, J, P), r (B, I, J)
    -> mu (B, J, P), var (B, J, P), activation (B, J). ``normalise``: the costs are
    standardised over the J parents first (mean 0, standard deviation 1)."""
    n_in = votes.shape[1]
    r_a = r * activations[:, :, None]  # (B, I, J)
    mass = r_a.sum(dim=1)  # (B, J)
    weight = (r_a + eps) / (mass[:, None, :] + n_in * eps)  # (B, I, J); sum_i = 1
    mu = (weight[..., None] * votes).sum(dim=1)  # (B, J, P)
    var = (weight[..., None] * (votes - mu[:, None]) ** 2).sum(dim=1) + min_var  # (B, J, P)
    cost = ((beta_v[:, None] + torch.log(torch.sqrt(var))) * mass[..., None]).sum(dim=2)
    if normalise:
        mean = cost.mean(dim=1, keepdim=True)  # (B, 1)
        std = torch.sqrt(((cost - mean) ** 2).mean(dim=1, keepdim=True) + eps)  # (B, 1)
        cost = (cost - mean) / std  # (B, J)
    return mu, var, torch.sigmoid(lam * (beta_a - cost))  # (B, J, P), (B, J, P), (B, J)


def _log_posterior(votes, mu, var, activation):
    """log a_j + log N(V_ij; mu_j, var_j), unnormalised: -> (B, I, J)."""
    log_p = (
        -((votes - mu[:, None]) ** 2) / (2 * var[:, None])
        - torch.log(torch.sqrt(var[:, None]))
        - 0.5 * math.log(2 * math.pi)
    ).sum(dim=3)  # (B, I, J)
    return torch.log(activation)[:, None, :] + log_p  # (B, I, J)


def em_routing_reference(
    votes: torch.Tensor,
    activations: torch.Tensor,
    beta_v: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int = 3,
    final_lambda: float = 0.01,
    min_var: float = 0.0005,
    eps: float = 1e-6,
    normalise: bool = False,
):
    """votes (B, I, J, P), activations (B, I) -> pose (B, J, P), activation (B, J),
    assignments R (B, I, J), variance (B, J, P); ``normalise`` as in ``_m_step``."""
    batch, n_in, n_out, _ = votes.shape
    r = torch.full((batch, n_in, n_out), 1.0 / n_out, dtype=votes.dtype, device=votes.device)
    for it in range(iterations):
        lam = final_lambda * (1.0 - 0.95 ** (it + 1))
        mu, var, activation = _m_step(
            votes, activations, r, beta_v, beta_a, lam, min_var, eps, normalise
        )
        if it == iterations - 1:
            break
        r = torch.softmax(_log_posterior(votes, mu, var, activation), dim=2)  # (B, I, J)
    return mu, activation, r, var


def _window_votes(layer, poses, activations, y, x):
    """Votes (B, KKT, J, 16) and activations (B, KKT) of the window of output (y, x)."""
    k, s = layer.kernel, layer.stride
    batch, t_in = poses.shape[0], poses.shape[3]
    window = poses[:, y * s : y * s + k, x * s : x * s + k]  # (B, K, K, T, 16)
    a = activations[:, y * s : y * s + k, x * s : x * s + k].reshape(batch, -1)  # (B, KKT)
    m = window.reshape(batch, k * k * t_in, layer.rows, -1)  # (B, KKT, r, c)
    votes = torch.einsum("birc,ijcd->bijrd", m, layer.weight)  # (B, KKT, J, r, c)
    return votes.reshape(batch, k * k * t_in, -1, 16), a  # (B, KKT, J, 16), (B, KKT)


def _stack_grid(grid):
    """[[t (B, ...)] per column] per row -> (B, H', W', ...)."""
    return torch.stack([torch.stack(row, dim=1) for row in grid], dim=1)


def conv_caps_reference(layer, poses: torch.Tensor, activations: torch.Tensor):
    """A ConvMatrixCaps forward with loops over output positions, in the layer's
    ``routing_scope``: "window" routes each window alone, "global" routes them together
    (``conv_caps_global_reference``).

    poses (B, H, W, T, 16), activations (B, H, W, T) -> (B, H', W', T_out, 16), (B, H', W', T_out).
    """
    if layer.routing_scope == "global":
        return conv_caps_global_reference(layer, poses, activations)
    k, s = layer.kernel, layer.stride
    h_out, w_out = (poses.shape[1] - k) // s + 1, (poses.shape[2] - k) // s + 1
    out_poses = [[None] * w_out for _ in range(h_out)]
    out_acts = [[None] * w_out for _ in range(h_out)]
    for y in range(h_out):
        for x in range(w_out):
            votes, a = _window_votes(layer, poses, activations, y, x)  # (B, KKT, J, 16)
            pose, act, _, _ = em_routing_reference(
                votes, a, layer.beta_v, layer.activation_bias(), layer.iterations,
                layer.final_lambda, layer.min_var, normalise=layer.normalise_cost,
            )  # fmt: skip
            out_poses[y][x], out_acts[y][x] = pose, act
    return _stack_grid(out_poses), _stack_grid(out_acts)  # (B,H',W',J,16), (B,H',W',J)


def conv_caps_global_reference(layer, poses, activations, eps: float = 1e-6):
    """ConvMatrixCaps with "global" routing over the full convolution geometry: each EM
    E-step normalises a child's assignments over every (parent position, parent type) pair
    it votes for, i.e. over the parents of all windows covering it. -> as conv_caps_reference,
    plus the last assignments {(y, x): R (B, KKT, J)}."""
    k, s, t_in = layer.kernel, layer.stride, poses.shape[3]
    n_out = layer.weight.shape[1]
    h_out, w_out = (poses.shape[1] - k) // s + 1, (poses.shape[2] - k) // s + 1
    windows = [(y, x) for y in range(h_out) for x in range(w_out)]
    votes, acts = {}, {}
    for y, x in windows:
        votes[y, x], acts[y, x] = _window_votes(layer, poses, activations, y, x)
    # (child row, child col) -> [(window, slot of its first type)] of every window covering it
    covers = {}
    for y, x in windows:
        for dy in range(k):
            for dx in range(k):
                covers.setdefault((y * s + dy, x * s + dx), []).append(
                    ((y, x), (dy * k + dx) * t_in)
                )
    r = {}  # window -> R (B, KKT, J), uniform over each child's parents
    for y, x in windows:
        r[y, x] = torch.empty(votes[y, x].shape[:3], dtype=poses.dtype, device=poses.device)
    for parents in covers.values():
        for w, first in parents:
            r[w][:, first : first + t_in] = 1.0 / (len(parents) * n_out)
    for it in range(layer.iterations):
        lam = layer.final_lambda * (1.0 - 0.95 ** (it + 1))
        beta_a = layer.activation_bias()  # (J,)
        norm = layer.normalise_cost
        fit = {
            w: _m_step(votes[w], acts[w], r[w], layer.beta_v, beta_a, lam, layer.min_var, eps, norm)
            for w in windows
        }  # window -> (mu (B, J, 16), var (B, J, 16), activation (B, J))
        if it == layer.iterations - 1:
            break
        logits = {w: _log_posterior(votes[w], *fit[w]) for w in windows}  # (B, KKT, J) each
        new_r = {w: [None] * (k * k) for w in windows}  # window -> R per kernel offset
        for parents in covers.values():
            # the child's logits for every parent of every covering window: (B, T, windows * J)
            joint = torch.cat([logits[w][:, first : first + t_in] for w, first in parents], dim=2)
            for i, piece in enumerate(torch.softmax(joint, dim=2).split(n_out, dim=2)):
                w, first = parents[i]
                new_r[w][first // t_in] = piece  # (B, T, J)
        r = {w: torch.cat(pieces, dim=1) for w, pieces in new_r.items()}  # (B, KKT, J)
    out_poses = [[fit[y, x][0] for x in range(w_out)] for y in range(h_out)]
    out_acts = [[fit[y, x][2] for x in range(w_out)] for y in range(h_out)]
    return _stack_grid(out_poses), _stack_grid(out_acts), r


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
                row_entry, col_entry = layer.coordinate_entries
                votes[..., row_entry] += offsets[y, x, 0]
                votes[..., col_entry] += offsets[y, x, 1]
            all_votes.append(votes)
    votes = torch.cat(all_votes, dim=1)  # (B, HWT, E, 16): position-major like the fast layer
    pose, act, _, _ = em_routing_reference(
        votes, activations.reshape(batch, -1), layer.beta_v, layer.activation_bias(),
        layer.iterations, layer.final_lambda, layer.min_var, normalise=layer.normalise_cost,
    )  # fmt: skip
    return pose, act


class ReferenceEMCapsNet(nn.Module):
    """The same network as a given EMCapsNet (sharing its parameters), computed with the
    readable reference code above."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, target=None):
        from capsnet.models import ModelOutput

        m = self.model
        h = torch.relu(m.conv1(x))  # (B, A, h, w)
        poses, act = m.primary(h)  # (B, h, w, B, 16), (B, h, w, B)
        poses, act = conv_caps_reference(m.caps1, poses, act)[:2]  # (B, h1, w1, C, 16)
        poses, act = conv_caps_reference(m.caps2, poses, act)[:2]  # (B, h2, w2, D, 16)
        offsets = reference_offsets(m.config.coordinate_form, poses.shape[1], x.shape[2])
        class_poses, scores = class_caps_reference(m.classes, poses, act, offsets.to(x.device))
        return ModelOutput(scores, class_poses, None)


def reference_offsets(form: str, size: int, image_size: int) -> torch.Tensor:
    """(size, size, 2) scaled (row, col) of each ClassCaps input cell, one by one: "paper",
    the cell's (index + 0.5) / size; "first-entries", its receptive-field centre in input
    pixels, conv1 (5x5/2) -> ConvCaps1 (3x3/2) -> ConvCaps2 (3x3/1): pixel 4 i + 8, as
    (pixel + 0.5) / image size."""
    offsets = torch.empty(size, size, 2)
    for y in range(size):
        for x in range(size):
            if form == "paper":
                offsets[y, x] = torch.tensor([(y + 0.5) / size, (x + 0.5) / size])
            else:
                offsets[y, x] = torch.tensor([4 * y + 8.5, 4 * x + 8.5]) / image_size
    return offsets
