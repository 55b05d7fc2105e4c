"""Compiled EM routing with ``routing_scope`` "global": a few windows per compiled call, one
EM iteration at a time, the E-step normalised per child across all windows between calls."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from capsnet.routing import em_inverse_temperatures

COMPILED_BLOCK = 8  # windows per compiled call (as em_layers.compiled_em_routing)
_LOG_2PI = 1.8378770664093453  # log(2 pi)
_compiled_step = None


def em_step(children, weight, activations, r, beta_v, beta_a, lam, min_var, last, eps=1e-6):
    """One EM iteration of a block of windows, votes made from the child poses inside.

    children (n, I, 16), weight (I, J, c, c), activations (n, I), r (n, I, J) assignments,
    lam a 0-d tensor -> E-step logits (n, I, J) (log a_j + log N(V_ij)), or with ``last``
    pose (n, J, 16) and activation (n, J).
    """
    n, n_in, pose_dim = children.shape
    n_out, cols = weight.shape[1], weight.shape[-1]
    m = children.reshape(n, n_in, 1, pose_dim // cols, cols, 1)  # (n, I, 1, r, c, 1)
    votes = (m * weight.reshape(1, n_in, n_out, 1, cols, cols)).sum(dim=4)  # (n, I, J, r, c)
    votes = votes.reshape(n, n_in, n_out, pose_dim)  # (n, I, J, P)
    r_a = r * activations.unsqueeze(2)  # (n, I, J)
    mass = r_a.sum(dim=1, keepdim=True)  # (n, 1, J)
    weights = ((r_a + eps) / (mass + n_in * eps)).unsqueeze(3)  # (n, I, J, 1): sum_i 1
    mu = (weights * votes).sum(dim=1, keepdim=True)  # (n, 1, J, P)
    sq_diff = (votes - mu) ** 2  # (n, I, J, P)
    var = (weights * sq_diff).sum(dim=1, keepdim=True) + min_var  # (n, 1, J, P)
    log_sigma = 0.5 * torch.log(var)  # (n, 1, J, P)
    cost = ((beta_v.reshape(1, 1, n_out, 1) + log_sigma) * mass.unsqueeze(3)).sum(3)  # (n,1,J)
    logit_a = lam * (beta_a.reshape(1, 1, n_out) - cost)  # (n, 1, J)
    if last:
        return mu.squeeze(1), torch.sigmoid(logit_a).squeeze(1)  # (n, J, P), (n, J)
    half_quad = (sq_diff * (0.5 / var)).sum(dim=3)  # (n, I, J)
    log_norm = log_sigma.sum(dim=3) + 0.5 * pose_dim * _LOG_2PI  # (n, 1, J)
    return F.logsigmoid(logit_a) - half_quad - log_norm  # (n, I, J)


def compiled_global_routing(
    children: torch.Tensor,
    activations: torch.Tensor,
    weight: torch.Tensor,
    beta_v: torch.Tensor,
    beta_a: torch.Tensor,
    scope,
    iterations: int,
    final_lambda: float,
    min_var: float,
    block: int = COMPILED_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EM routing of all N windows of a layer with the assignments normalised per child
    across windows (``scope``: em_layers.GlobalScope), ``em_step`` compiled with
    torch.compile and run ``block`` windows per call: children (N, I, 16), activations
    (N, I), weight (I, J, c, c) -> pose (N, J, 16), activation (N, J). The last block is
    padded with inactive all-zero children, so every call has one shape."""
    global _compiled_step
    if _compiled_step is None:
        _compiled_step = torch.compile(em_step, dynamic=False)
    n, n_out = children.shape[0], weight.shape[1]
    pad = (-n) % block
    with torch.autocast(children.device.type, enabled=False):  # routing in fp32
        kids = F.pad(children.float(), (0, 0, 0, 0, 0, pad)).split(block)  # (block, I, 16) each
        acts = F.pad(activations.float(), (0, 0, 0, pad)).split(block)  # (block, I) each
        w, b_v, b_a = weight.float(), beta_v.float(), beta_a.float()
        r = scope.initial(n_out).float().transpose(1, 2)  # (N, I, J)
        for it, lam in enumerate(em_inverse_temperatures(iterations, final_lambda)):
            last = it == iterations - 1
            lam_t = torch.tensor(lam, device=children.device)  # 0-d: one kernel for every lam
            blocks = F.pad(r, (0, 0, 0, 0, 0, pad)).split(block)  # (block, I, J) each
            outs = [
                _compiled_step(c, w, a, rb, b_v, b_a, lam_t, min_var, last)
                for c, a, rb in zip(kids, acts, blocks)
            ]  # logits (block, I, J), or (pose (block, J, 16), activation (block, J))
            if last:
                break
            logits = torch.cat(outs)[:n]  # (N, I, J)
            r = scope.softmax(logits.transpose(1, 2)).transpose(1, 2)  # (N, I, J)
    pose = torch.cat([o[0] for o in outs])[:n]  # (N, J, 16)
    act = torch.cat([o[1] for o in outs])[:n]  # (N, J)
    return pose, act
