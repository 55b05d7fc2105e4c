"""Compiled EM routing with ``routing_scope`` "global": a few windows per compiled call, one
EM iteration at a time. Between iterations only per-slot statistics, (windows, children),
cross the window boundary: each call returns the E-step logits of its windows with their
maximum and sum of exponentials per child slot, the per-child normaliser is formed from those
small tensors, and the next call turns the logits into assignments inside its kernel."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from capsnet.routing import em_inverse_temperatures
from capsnet.routing.em import m_step_child_major

COMPILED_BLOCK = 8  # windows per compiled call (as em_layers.compiled_em_routing)
_LOG_2PI = 1.8378770664093453  # log(2 pi)
_compiled_step = None
_compiled_last = None


def expand_poses(children: torch.Tensor, cols: int) -> torch.Tensor:
    """children (N, I, 16) as rows x cols matrices -> (N, I, c, 16), [n, i, k, (r, d)] =
    m[n, i, r, k] (for 16-vectors (N, I, 16, 1)): a vote is then sum_k of entry-wise
    products with ``expand_weight``."""
    n, n_in, pose_dim = children.shape
    m = children.reshape(n, n_in, pose_dim // cols, cols).transpose(2, 3)  # (N, I, c, r)
    if pose_dim == cols:  # 16-vectors: (N, I, 16, 1) broadcasts over the vote entries
        return m
    return m.unsqueeze(4).expand(-1, -1, -1, -1, cols).reshape(n, n_in, cols, pose_dim)


def expand_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """weight (I, J, c, c) -> (I, J, c, 16), [i, j, k, (r, d)] = W[i, j, k, d]."""
    n_in, n_out, cols, _ = weight.shape
    we = weight.unsqueeze(3).expand(-1, -1, -1, rows, -1)  # (I, J, c, r, c)
    return we.reshape(n_in, n_out, cols, rows * cols)  # (I, J, c, 16)


def _m_step(children, weight, activations, logits, log_total, beta_v, beta_a, lam, min_var):
    """M-step of a block of windows, votes made from the child poses inside: the arguments
    of ``em_step`` -> mu (n, 1, J, P), squared deviations (n, I, J, P), var (n, 1, J, P),
    log sigma (n, 1, J, P), activation logits (n, 1, J)."""
    cols = children.shape[2]
    votes = children[:, :, None, 0] * weight[:, :, 0]  # (n, I, J, P): pose @ W, k = 0
    for k in range(1, cols):  # unrolled: entry-wise products, 16 wide, fused into the sums
        votes = votes + children[:, :, None, k] * weight[:, :, k]  # (n, I, J, P)
    r = torch.exp(logits - log_total.unsqueeze(2))  # (n, I, J)
    return m_step_child_major(r * activations.unsqueeze(2), votes, beta_v, beta_a, lam, min_var)


def em_step(children, weight, activations, logits, log_total, beta_v, beta_a, lam, min_var):
    """One EM iteration but the last of a block of windows.

    children (n, I, c, 16) from ``expand_poses``, weight (I, J, c, 16) from
    ``expand_weight``, activations (n, I); the assignments are ``exp(logits - log_total)``
    for the previous E-step's logits (n, I, J) (zeros in the first iteration) and log_total
    (n, I), the log of the child's total of exp(logits) over all its parents; lam a 0-d
    tensor. -> the E-step logits (n, I, J), their maximum over the parents (n, I) (no
    gradient) and sum of exp(logits - maximum) (n, I).
    """
    _, sq_diff, var, log_sigma, logit_a = _m_step(
        children, weight, activations, logits, log_total, beta_v, beta_a, lam, min_var
    )
    half_quad = (sq_diff * (0.5 / var)).sum(dim=3)  # (n, I, J)
    log_norm = log_sigma.sum(dim=3) + 0.5 * children.shape[3] * _LOG_2PI  # (n, 1, J)
    out = F.logsigmoid(logit_a) - half_quad - log_norm  # (n, I, J)
    peak = out.detach().amax(dim=2)  # (n, I): a shift, no gradient
    return out, peak, torch.exp(out - peak.unsqueeze(2)).sum(dim=2)  # (n,I,J), (n,I), (n,I)


def em_last_step(children, weight, activations, logits, log_total, beta_v, beta_a, lam, min_var):
    """The last EM iteration (the arguments of ``em_step``) -> pose (n, J, 16), activation
    (n, J)."""
    mu, _, _, _, logit_a = _m_step(
        children, weight, activations, logits, log_total, beta_v, beta_a, lam, min_var
    )
    return mu.squeeze(1), torch.sigmoid(logit_a).squeeze(1)  # (n, J, P), (n, J)


def compile_routing_function(function):
    """``torch.compile(function, dynamic=False)`` with Inductor's on-disk cache kept apart
    per ``ATEN_CPU_CAPABILITY``: the cache does not key its CPU kernels on that setting, so a
    process run with another one would load kernels built for the other instruction set
    (wrong results, NaN, or a crash). An explicit ``TORCHINDUCTOR_CACHE_DIR`` is kept."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if capability and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}_{capability}"
    return torch.compile(function, dynamic=False)


def _compiled_functions():
    """``em_step`` and ``em_last_step`` compiled (once): two functions, so that each keeps
    its own few cache entries (shapes per layer, grad mode) within dynamo's recompile limit."""
    global _compiled_step, _compiled_last
    if _compiled_step is None:
        _compiled_step = compile_routing_function(em_step)
    if _compiled_last is None:
        _compiled_last = compile_routing_function(em_last_step)
    return _compiled_step, _compiled_last


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
    (N, I), weight (I, J, c, c) for rows x c poses -> pose (N, J, 16), activation (N, J).
    The last block is padded with inactive all-zero children, so every call has one shape.
    Routing runs in fp32 (fp64 for fp64 inputs); between iterations only the logits of each
    block (block, I, J) and the per-slot normalisers (N, I) are kept."""
    step, last_step = _compiled_functions()
    n, n_in = activations.shape
    n_out, cols = weight.shape[1], weight.shape[-1]
    pad = (-n) % block
    with torch.autocast(children.device.type, enabled=False):  # routing in fp32 or fp64
        dtype = torch.promote_types(children.dtype, torch.float32)
        kids = expand_poses(F.pad(children.to(dtype), (0, 0, 0, 0, 0, pad)), cols)
        kids = kids.split(block)  # (block, I, c, 16) each
        acts = F.pad(activations.to(dtype), (0, 0, 0, pad)).split(block)  # (block, I) each
        w = expand_weight(weight.to(dtype), children.shape[-1] // cols)  # (I, J, c, 16)
        b_v, b_a = beta_v.to(dtype), beta_a.to(dtype)
        logits = [kids[0].new_zeros(block, n_in, n_out)] * len(kids)  # (block, I, J) each
        log_total = F.pad(scope.log_uniform_total(n_out).to(dtype), (0, 0, 0, pad))  # (N+pad,I)
        lams = em_inverse_temperatures(iterations, final_lambda)
        for lam in lams[:-1]:
            lam_t = torch.tensor(lam, dtype=dtype, device=children.device)  # 0-d: one kernel
            outs = [
                step(c, w, a, lg, t, b_v, b_a, lam_t, min_var)
                for c, a, lg, t in zip(kids, acts, logits, log_total.split(block))
            ]  # logits (block, I, J), peak (block, I), sumexp (block, I) per block
            logits = [o[0] for o in outs]  # (block, I, J) each
            log_total = _log_totals(scope, outs, n)  # (N + pad, I)
        lam_t = torch.tensor(lams[-1], dtype=dtype, device=children.device)
        outs = [
            last_step(c, w, a, lg, t, b_v, b_a, lam_t, min_var)
            for c, a, lg, t in zip(kids, acts, logits, log_total.split(block))
        ]  # pose (block, J, 16), activation (block, J) per block
    pose = torch.cat([o[0] for o in outs])[:n]  # (N, J, 16)
    act = torch.cat([o[1] for o in outs])[:n]  # (N, J)
    return pose, act


def _log_totals(scope, outs, n: int) -> torch.Tensor:
    """Per-slot log normalisers (N + pad, I) from the blocks' (logits, peak, sumexp): per
    child across windows for the N real windows, per window for the padding."""
    peak = torch.cat([o[1] for o in outs])  # (N + pad, I)
    sumexp = torch.cat([o[2] for o in outs])  # (N + pad, I)
    own = peak[n:] + torch.log(sumexp[n:])  # (pad, I)
    return torch.cat([scope.log_total(peak[:n], sumexp[:n]), own])  # (N + pad, I)
