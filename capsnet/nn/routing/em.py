"""EM routing (Hinton, Sabour, Frosst 2018) as pure tensor functions.

One implementation, ``em_routing``: EM iterations as steps over blocks of routing groups,
with the votes V_ij = M_i W_ij (+ a fixed bias, e.g. the coordinate addition) made from the
child poses (inside the steps when compiled, as one batched matmul per layer call when
eager). It runs on any device, eagerly or compiled with torch.compile;
``benchmarks/em_reference.py`` holds the readable loop version it is tested against.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from capsnet.nn.compiling import has_autocast

EM_FINAL_LAMBDA = 0.01  # official code: final inverse temperature
EM_MIN_VAR = 0.0005  # official code: variance floor
EM_EPS = 1e-6  # added to every r_ij a_i in the M-step weights (bounded with no active child)
_LOG_2PI = 1.8378770664093453  # log(2 pi)
# Vote entries per routing call on a CPU: 8 windows of em-capsnet's convolutional capsule
# layers (the best of 2..16 windows per compiled call on one core: cache-resident blocks).
# On other devices every group is routed in one call.
CPU_BLOCK_ELEMENTS = 8 * 288 * 32 * 16


def em_inverse_temperatures(iterations: int, final_lambda: float = EM_FINAL_LAMBDA) -> list[float]:
    """Inverse temperature of each EM iteration: final_lambda * (1 - 0.95^(i+1))."""
    return [final_lambda * (1.0 - 0.95 ** (i + 1)) for i in range(iterations)]


def device_cache(function):
    """``functools.lru_cache`` for tensor factories keyed by (device, shape, ...): the
    tensors are built on their device once and are never inference tensors (a first call
    inside ``torch.inference_mode`` must not poison later training steps)."""

    @functools.lru_cache(maxsize=64)
    def cached(*args):
        with torch.inference_mode(False):
            return function(*args)

    return functools.wraps(function)(cached)


@device_cache
def _inverse_temperature_tensor(
    iterations: int, final_lambda: float, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """(iterations,) inverse temperatures on ``device``: 0-d slices feed the compiled steps
    (one graph for every iteration) without a host-to-device copy per call."""
    return torch.tensor(em_inverse_temperatures(iterations, final_lambda), dtype=dtype).to(device)


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


def activation_logits(cost, beta_a, lam, normalise: bool = False, eps: float = EM_EPS):
    """cost (n, 1, J) -> activation logits lam (beta_a - cost) (n, 1, J). ``normalise``:
    the cost standardised over the J parents of each group first (mean 0, standard deviation
    1), so the logit compares parents instead of following the mass-weighted log-sigmas'
    scale (docs/notes/2026-11-28-em-learning.md)."""
    if normalise:
        centred = cost - cost.mean(dim=2, keepdim=True)  # (n, 1, J)
        cost = centred / torch.sqrt(centred.square().mean(dim=2, keepdim=True) + eps)
    return lam * (beta_a.reshape(1, 1, -1) - cost)  # (n, 1, J)


def m_step(r_a, votes, beta_v, beta_a, lam, min_var: float, normalise: bool = False,
           eps: float = EM_EPS):  # fmt: skip
    """The M-step over child-major votes (n, I, J, P) with activation-weighted assignments
    r_a (n, I, J) -> mu (n, 1, J, P), squared deviations (n, I, J, P), var (n, 1, J, P),
    log sigma (n, 1, J, P), activation logits (n, 1, J) (``activation_logits``). The
    variance is the weighted mean of the squared deviations (two passes, no E[V^2] - mu^2
    cancellation)."""
    n_in, n_out = votes.shape[1], votes.shape[2]
    mass = r_a.sum(dim=1, keepdim=True)  # (n, 1, J) = sum_i r_ij a_i
    weights = ((r_a + eps) / (mass + n_in * eps)).unsqueeze(3)  # (n, I, J, 1): sum_i 1
    mu = (weights * votes).sum(dim=1, keepdim=True)  # (n, 1, J, P)
    sq_diff = (votes - mu) ** 2  # (n, I, J, P)
    var = (weights * sq_diff).sum(dim=1, keepdim=True) + min_var  # (n, 1, J, P)
    log_sigma = 0.5 * torch.log(var)  # (n, 1, J, P)
    cost = ((beta_v.reshape(1, 1, n_out, 1) + log_sigma) * mass.unsqueeze(3)).sum(3)  # (n,1,J)
    logit_a = activation_logits(cost, beta_a, lam, normalise)  # (n, 1, J)
    return mu, sq_diff, var, log_sigma, logit_a


def make_votes(children, weight, bias=None):
    """Votes of a block of groups: children (n, I, c, 16) from ``expand_poses``, weight
    (I, J, c, 16) from ``expand_weight``, bias (I, J or 1, 16) or None -> (n, I, J, 16).
    Entry-wise products 16 wide, unrolled over c: the contraction is only c = 4 long, and
    torch.compile fuses them into the EM sums."""
    votes = children[:, :, None, 0] * weight[:, :, 0]  # (n, I, J, P): pose @ W, k = 0
    for k in range(1, children.shape[2]):
        votes = votes + children[:, :, None, k] * weight[:, :, k]  # (n, I, J, P)
    if bias is not None:
        votes = votes + bias  # (n, I, J, P)
    return votes


def matrix_votes(children, weight, bias=None):
    """Votes of N groups as one batched matmul: children (N, I, 16) as rows x c matrices,
    weight (I, J, c, c), bias (I, J or 1, 16) or None -> (N, I, J, 16), V_nij = M_ni W_ij
    (+ bias_ij). Per child slot i, the rows of all N poses times [W_i1 ... W_iJ] side by
    side: (I, N r, c) @ (I, c, J c); its backward is two matmuls as well, where the
    entry-wise form of ``make_votes`` runs vote-sized products and sums."""
    n, n_in, pose_dim = children.shape
    n_out, cols = weight.shape[1], weight.shape[-1]
    rows = pose_dim // cols
    m = children.reshape(n, n_in, rows, cols).transpose(0, 1)  # (I, N, r, c)
    w = weight.transpose(1, 2).reshape(n_in, cols, n_out * cols)  # (I, c, J c)
    votes = torch.bmm(m.reshape(n_in, n * rows, cols), w)  # (I, N r, J c)
    votes = votes.reshape(n_in, n, rows, n_out, cols).permute(1, 0, 3, 2, 4)  # (N,I,J,r,c)
    votes = votes.reshape(n, n_in, n_out, pose_dim)  # (N, I, J, 16)
    if bias is not None:
        votes = votes + bias  # (N, I, J, 16)
    return votes


def _fit(votes, activations, logits, log_total, beta_v, beta_a, lam, min_var, normalise):
    """Assignments from the previous E-step, then the M-step -> the outputs of ``m_step``."""
    r = torch.exp(logits - log_total.unsqueeze(2))  # (n, I, J): the E-step's assignments
    return m_step(r * activations.unsqueeze(2), votes, beta_v, beta_a, lam, min_var, normalise)


def step_from_votes(
    votes, activations, logits, log_total, beta_v, beta_a, lam, min_var, normalise=False
):
    """One EM iteration but the last, on a block of n groups with votes (n, I, J, 16).

    activations (n, I); the assignments are ``exp(logits - log_total)`` for the previous
    E-step's logits (n, I, J) (zeros at first) and log_total (n, I), the log of the child's
    sum of exp(logits) over all its parents; lam a 0-d tensor; ``normalise`` as in
    ``activation_logits``. -> the E-step logits
    (n, I, J), log a_j + log N(V_ij; mu_j, var_j), with their maximum over the parents
    (n, I) (no gradient) and the sum of exp(logits - maximum) (n, I).
    """
    _, sq_diff, var, log_sigma, logit_a = _fit(
        votes, activations, logits, log_total, beta_v, beta_a, lam, min_var, normalise
    )
    half_quad = (sq_diff * (0.5 / var)).sum(dim=3)  # (n, I, J): sum_h (V - mu)^2 / 2 var
    log_norm = log_sigma.sum(dim=3) + 0.5 * votes.shape[3] * _LOG_2PI  # (n, 1, J)
    out = F.logsigmoid(logit_a) - half_quad - log_norm  # (n, I, J)
    peak = out.detach().amax(dim=2)  # (n, I): a shift, no gradient
    return out, peak, torch.exp(out - peak.unsqueeze(2)).sum(dim=2)  # (n,I,J), (n,I), (n,I)


def last_step_from_votes(
    votes, activations, logits, log_total, beta_v, beta_a, lam, min_var, normalise=False
):
    """The last EM iteration (the arguments of ``step_from_votes``) -> pose (n, J, 16),
    activation (n, J)."""
    mu, _, _, _, logit_a = _fit(votes, activations, logits, log_total, beta_v, beta_a, lam,
                                min_var, normalise)  # fmt: skip
    return mu.squeeze(1), torch.sigmoid(logit_a).squeeze(1)  # (n, J, P), (n, J)


def em_step(children, weight, bias, *args):
    """``step_from_votes`` with the votes made inside from ``make_votes``'s arguments: the
    form torch.compile fuses, so the votes are never stored."""
    return step_from_votes(make_votes(children, weight, bias), *args)


def em_last_step(children, weight, bias, *args):
    """``last_step_from_votes`` with the votes made inside (as ``em_step``)."""
    return last_step_from_votes(make_votes(children, weight, bias), *args)


def compile_routing_function(function, dynamic: bool | None = False):
    """``torch.compile(function, dynamic=dynamic)`` with Inductor's on-disk cache kept apart
    per ``ATEN_CPU_CAPABILITY``: the cache does not key its CPU kernels on that setting, so a
    process run with another one would load kernels built for the other instruction set
    (wrong results, NaN, or a crash). A ``TORCHINDUCTOR_CACHE_DIR`` the user chose is kept;
    the default one, which Inductor writes into the environment when anything asks for its
    cache (an eager checkpointed step does), is replaced."""
    from capsnet.nn.compiling import quiet_cuda_home_probe

    quiet_cuda_home_probe()
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if capability:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        default = default_cache_dir()
        if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default, os.path.abspath(default)):
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default}_{capability}"
    return torch.compile(function, dynamic=dynamic)


_COMPILED: dict[str, tuple] = {}  # device type -> (em_step, em_last_step) compiled


def compiled_steps(device_type: str) -> tuple:
    """``em_step`` and ``em_last_step`` compiled once per device type: two functions, so
    that each keeps its few graphs (per layer shape and grad mode) within dynamo's recompile
    limit. CPU blocks are padded to one shape (static kernels); on other devices a call
    holds every group, whose count follows the batch (automatic dynamic shapes)."""
    if device_type not in _COMPILED:
        dynamic = False if device_type == "cpu" else None
        _COMPILED[device_type] = (
            compile_routing_function(em_step, dynamic),
            compile_routing_function(em_last_step, dynamic),
        )
    return _COMPILED[device_type]


def _eager_steps() -> tuple:
    """The steps run eagerly on each block's votes; with autograd on, each call is
    recomputed in the backward pass (activation checkpointing), so only its inputs are kept
    (the block's votes), never its vote-sized temporaries."""
    if not torch.is_grad_enabled():
        return step_from_votes, last_step_from_votes
    options = {"use_reentrant": False, "preserve_rng_state": False}
    return (
        functools.partial(checkpoint, step_from_votes, **options),
        functools.partial(checkpoint, last_step_from_votes, **options),
    )


def default_block(device: torch.device, group_elements: int) -> int | None:
    """Groups per routing call: about ``CPU_BLOCK_ELEMENTS`` vote entries on a CPU, every
    group (None) elsewhere."""
    if device.type == "cpu":
        return max(1, CPU_BLOCK_ELEMENTS // max(1, group_elements))
    return None


class GlobalScope:
    """Assignment normalisation of children shared by overlapping groups (Hinton et al.: a child
    feeding several K x K windows): a child's assignments sum to 1 over every (group,
    parent) it votes for. ``index`` (N, I) names the child in slot i of group n."""

    def __init__(self, index: torch.Tensor, n_children: int):
        self.index = index  # (N, I)
        self.flat = index.reshape(-1)  # (N*I,)
        self.n_children = n_children
        self._uniform: dict[tuple, torch.Tensor] = {}

    def _per_child_sum(self, values: torch.Tensor) -> torch.Tensor:
        """values (N, I) -> sums over each child's slots, read back at every slot (N, I)."""
        total = values.new_zeros(self.n_children).index_add(0, self.flat, values.reshape(-1))
        return total[self.index]  # (N, I)

    def log_uniform_total(self, n_out: int, dtype: torch.dtype) -> torch.Tensor:
        """(N, I) log(groups holding the child * n_out): with logits 0, exp(logits - this)
        is uniform over all the child's parents (the first E-step's assignments)."""
        if (n_out, dtype) not in self._uniform:
            with torch.inference_mode(False):
                ones = torch.ones(self.index.shape, dtype=dtype, device=self.index.device)
                self._uniform[n_out, dtype] = torch.log(self._per_child_sum(ones) * n_out)
        return self._uniform[n_out, dtype]

    def log_total(self, peak: torch.Tensor, sumexp: torch.Tensor) -> torch.Tensor:
        """Log of each child's sum of exp(logits) over all its parents, read back per slot
        (N, I), from per slot maxima ``peak`` (N, I) (no gradient) and sums of
        exp(logits - peak) ``sumexp`` (N, I) over the slot's parents."""
        child_peak = peak.new_full((self.n_children,), -torch.inf)  # (children,)
        child_peak = child_peak.scatter_reduce(0, self.flat, peak.reshape(-1), "amax")
        shift = child_peak[self.index]  # (N, I): the child's maximum logit
        return shift + torch.log(self._per_child_sum(sumexp * torch.exp(peak - shift)))


def child_index(
    batch: int, h: int, w: int, types: int, kernel: int, stride: int, device=None
) -> torch.Tensor:
    """Child of every window slot, (B*H'*W', K*K*T), windows row-major over (B, H', W'),
    slots over (kernel row, kernel col, type); children numbered row-major over (B, H, W, T)."""
    idx = torch.arange(batch * h * w * types, device=device).reshape(batch, h, w, types)
    idx = idx.unfold(1, kernel, stride).unfold(2, kernel, stride)  # (B, H', W', T, K, K)
    return idx.permute(0, 1, 2, 4, 5, 3).reshape(-1, kernel * kernel * types)  # (N, KKT)


@device_cache
def conv_scope(
    batch: int, h: int, w: int, types: int, kernel: int, stride: int, device: torch.device
) -> GlobalScope:
    """The GlobalScope of a K x K convolutional capsule layer over a (B, H, W, T) grid of
    children, built on ``device`` once per shape."""
    index = child_index(batch, h, w, types, kernel, stride, device)  # (N, KKT)
    return GlobalScope(index, batch * h * w * types)


def em_routing(
    children: torch.Tensor,
    activations: torch.Tensor,
    weight: torch.Tensor,
    beta_v: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int = 3,
    final_lambda: float = EM_FINAL_LAMBDA,
    min_var: float = EM_MIN_VAR,
    *,
    vote_bias: torch.Tensor | None = None,
    scope: GlobalScope | None = None,
    block: int | None = None,
    compiled: bool = False,
    normalise_cost: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EM routing (Hinton, Sabour, Frosst 2018) of N groups of I children to J parents,
    votes V_nij = M_ni W_ij (+ vote_bias_ij).

    Args:
        children: (N, I, 16) child poses (rows x c matrices flattened row by row).
        activations: (N, I) child activations in [0, 1].
        weight: (I, J, c, c) transformations, rows = 16 / c (4x4; 16x16 for 16-vectors).
        beta_v, beta_a: (J,) learned per parent. iterations >= 1; final_lambda: last
            inverse temperature scale; min_var: floor added to every per-parent variance.
        vote_bias: (I, J or 1, 16) added to every group's votes (coordinate addition), or None.
        scope: None (each group normalises a child's assignments over its own J parents) or
            a GlobalScope (over all parents of all groups holding the child).
        block: groups per routing call (default ``default_block``: every group in one call
            off the CPU); the last block is padded with inactive all-zero children, so every
            call has one shape.
        compiled: run the steps compiled (``compiled_steps``); raises where it cannot.
        normalise_cost: standardise each group's costs over its parents before the
            activation (``activation_logits``); False: the paper's lambda (beta_a - cost).

    Returns pose (N, J, 16) Gaussian means, activation (N, J) in (0, 1). Routing runs in
    fp32 (fp64 for fp64 inputs) whatever the autocast state; likelihoods and activations
    stay in log space.
    """
    if iterations < 1:
        raise ValueError(f"routing iterations must be >= 1, got {iterations}")
    n, n_in, pose_dim = children.shape
    n_out, cols = weight.shape[1], weight.shape[-1]
    block = min(n, block or default_block(children.device, n_in * n_out * pose_dim) or n)
    pad = (-n) % block
    with _without_autocast(children.device):
        dtype = torch.promote_types(children.dtype, torch.float32)
        padded = F.pad(children.to(dtype), (0, 0, 0, 0, 0, pad))  # (N + pad, I, 16)
        acts = F.pad(activations.to(dtype), (0, 0, 0, pad)).split(block)  # (block, I) each
        bias = None if vote_bias is None else vote_bias.to(dtype)  # (I, J or 1, 16)
        lams = _inverse_temperature_tensor(iterations, final_lambda, children.device, dtype)
        if compiled:  # votes made inside the compiled steps
            step, last_step = compiled_steps(children.device.type)
            w = expand_weight(weight.to(dtype), pose_dim // cols)  # (I, J, c, 16)
            groups = [(c, w, bias) for c in expand_poses(padded, cols).split(block)]
        else:  # votes made once per layer call, kept for the backward pass
            step, last_step = _eager_steps()
            votes = matrix_votes(padded, weight.to(dtype), bias)  # (N + pad, I, J, 16)
            groups = [(v,) for v in votes.split(block)]  # (block, I, J, 16) each
        constants = (beta_v.to(dtype), beta_a.to(dtype), lams, min_var, normalise_cost)
        inputs = (children, activations, weight, beta_v, beta_a)
        uniform_grad = compiled and torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
        steps = (step, last_step)
        return _iterate(steps, groups, acts, scope, (n, n_out), constants, uniform_grad)


def _iterate(steps, groups, acts, scope, sizes: tuple[int, int], constants, uniform_grad=False):
    """The EM iterations over the blocks: (pose (N, J, 16), activation (N, J)).

    ``groups`` holds each block's step inputs (votes, or children with the weights),
    ``acts`` each block's activations (block, I), ``sizes`` is (N, J). ``uniform_grad``:
    the first call's logits and log normalisers require grad as every later call's do, so
    a compiled step has one graph (dynamo guards on requires_grad) in training, not two.

    Each iteration is one call per block. Between iterations only the E-step logits of each
    block (n, I, J) and per-slot log normalisers (N, I) are kept: the normaliser of a child
    is combined over all its slots (``GlobalScope.log_total``) from each slot's maximum and
    sum of exponentials, and the next call turns the logits into assignments inside.
    """
    step, last_step = steps
    b_v, b_a, lams, min_var, normalise = constants
    n, n_out = sizes
    block, n_in = acts[0].shape
    padded = block * len(acts)  # N + pad
    if scope is None:
        log_total = acts[0].new_full((padded, n_in), math.log(n_out))  # (N + pad, I)
    else:
        log_total = F.pad(scope.log_uniform_total(n_out, acts[0].dtype), (0, 0, 0, padded - n))
    logits = [acts[0].new_zeros(block, n_in, n_out)] * len(acts)  # (block, I, J) each
    if uniform_grad:
        log_total = log_total.detach().requires_grad_()
        logits = [logits[0].requires_grad_()] * len(acts)
    for it in range(lams.shape[0] - 1):
        outs = [
            step(*g, a, lg, t, b_v, b_a, lams[it], min_var, normalise)
            for g, a, lg, t in zip(groups, acts, logits, log_total.split(block))
        ]  # logits (block, I, J), peak (block, I), sumexp (block, I) per block
        logits = [o[0] for o in outs]  # (block, I, J) each
        log_total = _log_totals(scope, outs, n)  # (N + pad, I)
    outs = [
        last_step(*g, a, lg, t, b_v, b_a, lams[-1], min_var, normalise)
        for g, a, lg, t in zip(groups, acts, logits, log_total.split(block))
    ]  # pose (block, J, 16), activation (block, J) per block
    pose = torch.cat([o[0] for o in outs])[:n]  # (N, J, 16)
    act = torch.cat([o[1] for o in outs])[:n]  # (N, J)
    return pose, act


def _without_autocast(device: torch.device):
    """Autocast switched off on ``device`` (a no-op where autocast does not exist: meta)."""
    if has_autocast(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _log_totals(scope: GlobalScope | None, outs, n: int) -> torch.Tensor:
    """Per-slot log normalisers (N + pad, I) from the blocks' (logits, peak, sumexp): per
    child across groups (``scope``) for the N real groups, per group for the padding (and
    for every group without a scope)."""
    peak = torch.cat([o[1] for o in outs])  # (N + pad, I)
    sumexp = torch.cat([o[2] for o in outs])  # (N + pad, I)
    if scope is None:
        return peak + torch.log(sumexp)  # (N + pad, I)
    own = peak[n:] + torch.log(sumexp[n:])  # (pad, I)
    return torch.cat([scope.log_total(peak[:n], sumexp[:n]), own])  # (N + pad, I)
