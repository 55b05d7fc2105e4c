"""EM routing (Hinton et al. 2018) as pure tensor functions: the plain form, the blocked form
that never stores every vote, and the form computed from child poses and transforms."""

from __future__ import annotations

import torch

EM_FINAL_LAMBDA = 0.01  # official code: final inverse temperature
EM_MIN_VAR = 0.0005  # official code: variance floor
_LOG_2PI = 1.8378770664093453  # log(2 pi)
_CHUNK_ELEMENTS = 1 << 22  # vote entries per block of the fused EM statistics (16 MiB fp32)


def _blocks(votes: torch.Tensor):
    """Slices over dim 0 so that each block holds about _CHUNK_ELEMENTS vote entries."""
    per_group = max(1, votes[0].numel())
    step = max(1, _CHUNK_ELEMENTS // per_group)
    return [slice(s, s + step) for s in range(0, votes.shape[0], step)]


class _WeightedMoments(torch.autograd.Function):
    """mu = sum_i w_i V_i and m2 = sum_i w_i V_i^2 per parent, for V (N, J, I, P), w (N, J, I).

    Blocked over N so that V^2 is never stored: the only saved tensor is V itself, and the
    backward writes the vote gradient in one pass.
    """

    @staticmethod
    def forward(ctx, v, w):
        mu = torch.matmul(w.unsqueeze(2), v).squeeze(2)  # (N, J, P)
        m2 = torch.empty_like(mu)  # (N, J, P)
        for b in _blocks(v):
            m2[b] = torch.matmul(w[b].unsqueeze(2), v[b] * v[b]).squeeze(2)  # (n, J, P)
        ctx.save_for_backward(v, w)
        return mu, m2

    @staticmethod
    def backward(ctx, g_mu, g_m2):
        v, w = ctx.saved_tensors
        dv = torch.empty_like(v) if ctx.needs_input_grad[0] else None  # (N, J, I, P)
        dw = torch.empty_like(w) if ctx.needs_input_grad[1] else None  # (N, J, I)
        for b in _blocks(v):
            vb, gm, g2 = v[b], g_mu[b].unsqueeze(2), g_m2[b].unsqueeze(2)  # (n,J,I,P), (n,J,1,P)
            u = torch.addcmul(gm, vb, g2)  # (n, J, I, P) = g_mu + V g_m2
            if dw is not None:
                dw[b] = (u * vb).sum(dim=3)  # (n, J, I) = sum_h V g_mu + V^2 g_m2
            if dv is not None:
                dv[b] = u.addcmul_(vb, g2).mul_(w[b].unsqueeze(3))  # (n, J, I, P)
        return dv, dw


class _Mahalanobis(torch.autograd.Function):
    """q_i = sum_h V_ih^2 inv_h - 2 V_ih b_h, i.e. sum_h (V_ih - mu_h)^2 / var_h up to a
    per-parent constant, for V (N, J, I, P), inv = 1 / var and b = mu / var (N, J, P).
    Blocked over N; saves only V."""

    @staticmethod
    def forward(ctx, v, inv, b):
        q = v.new_empty(v.shape[:3])  # (N, J, I)
        for s in _blocks(v):
            t = torch.addcmul(-2.0 * b[s].unsqueeze(2), v[s], inv[s].unsqueeze(2))  # (n,J,I,P)
            q[s] = (t * v[s]).sum(dim=3)  # (n, J, I)
        ctx.save_for_backward(v, inv, b)
        return q

    @staticmethod
    def backward(ctx, g_q):
        v, inv, b = ctx.saved_tensors
        dv = torch.empty_like(v) if ctx.needs_input_grad[0] else None  # (N, J, I, P)
        d_inv = torch.empty_like(inv)  # (N, J, P)
        d_b = torch.empty_like(b)  # (N, J, P)
        for s in _blocks(v):
            vs, gq = v[s], g_q[s].unsqueeze(2)  # (n, J, I, P), (n, J, 1, I)
            d_b[s] = -2.0 * torch.matmul(gq, vs).squeeze(2)  # (n, J, P)
            d_inv[s] = torch.matmul(gq, vs * vs).squeeze(2)  # (n, J, P)
            if dv is not None:
                t = torch.addcmul(-b[s].unsqueeze(2), vs, inv[s].unsqueeze(2))  # (n,J,I,P)
                dv[s] = t.mul_(2.0 * g_q[s].unsqueeze(3))  # (n, J, I, P)
        return dv, d_inv, d_b


def em_inverse_temperatures(iterations: int, final_lambda: float = EM_FINAL_LAMBDA) -> list[float]:
    """Inverse temperature of each EM iteration: final_lambda * (1 - 0.95^(i+1))."""
    return [final_lambda * (1.0 - 0.95 ** (i + 1)) for i in range(iterations)]


def em_routing(
    votes: torch.Tensor,
    activations: torch.Tensor,
    beta_v: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int = 3,
    final_lambda: float = EM_FINAL_LAMBDA,
    min_var: float = EM_MIN_VAR,
    eps: float = 1e-6,
    return_assignments: bool = False,
    scope=None,
):
    """EM routing (Hinton, Sabour, Frosst 2018) over groups of children.

    Args:
        votes: (N, n_in, n_out, P) vote of each child for each parent (P = 16 pose entries).
            Fastest when ``votes.transpose(1, 2)`` is contiguous, i.e. the caller allocated
            the votes as (N, n_out, n_in, P).
        activations: (N, n_in) child activations in [0, 1].
        beta_v, beta_a: learned per parent type, broadcastable to (n_out,).
        iterations: EM iterations >= 1; final_lambda: last inverse temperature scale;
        min_var: variance floor added to every per-parent variance; eps: added to every
            r_ij a_i in the mean and variance weights, so that they stay normalised (and the
            gradients bounded) when all children are inactive.
        return_assignments: also return the assignments R of the last E-step and the variances.
        scope: None (each group normalises its children's assignments over its own parents)
            or an object whose ``initial(n_out)`` gives the first assignments (N, n_out, n_in)
            and ``softmax(logits (N, n_out, n_in))`` normalises them across groups (a child
            shared by overlapping windows: em_layers.GlobalScope).

    Returns:
        pose (N, n_out, P) Gaussian means, activation (N, n_out) in (0, 1), and with
        ``return_assignments`` R (N, n_in, n_out) (sums to 1 over n_out; uniform when
        ``iterations == 1``) and the variances (N, n_out, P) (each >= min_var).

    Memory: the votes are the only vote-sized tensor kept for the backward pass; the sums
    over children (weighted moments, Mahalanobis distances) are fused blocked operations.
    Likelihoods and log-activations stay in log space (logsigmoid, softmax of logits). The
    votes are first centred on their mean over children (the result is invariant to the
    shift), so E[V^2] - mu^2 and the expanded quadratic form keep their precision.
    """
    if iterations < 1:
        raise ValueError(f"routing iterations must be >= 1, got {iterations}")
    with torch.autocast(votes.device.type, enabled=False):  # routing always in fp32 or fp64
        return _em_routing(
            votes, activations, beta_v, beta_a, iterations, final_lambda, min_var, eps,
            return_assignments, scope,
        )  # fmt: skip


def _em_routing(
    votes, activations, beta_v, beta_a, iterations, final_lambda, min_var, eps, return_assignments,
    scope,
):  # fmt: skip
    dtype = torch.promote_types(votes.dtype, torch.float32)  # fp32 (or fp64) under autocast
    votes = votes.to(dtype)
    n, n_in, n_out, pose_dim = votes.shape
    v = votes.transpose(1, 2)  # (N, n_out, n_in, P) view
    centre = v.detach().mean(dim=2, keepdim=True)  # (N, n_out, 1, P): a shift, no gradient
    v = v - centre  # (N, n_out, n_in, P) contiguous
    a_in = activations.to(dtype).reshape(n, 1, n_in)  # (N, 1, n_in)
    beta_v = beta_v.to(dtype).reshape(-1, 1)  # (n_out or 1, 1)
    beta_a = beta_a.to(dtype).reshape(-1)  # (n_out or 1,)
    if scope is None:
        r = v.new_full((n, n_out, n_in), 1.0 / n_out)  # (N, n_out, n_in): uniform assignments
    else:
        r = scope.initial(n_out).to(dtype)  # (N, n_out, n_in): uniform over a child's parents
    for it, lam in enumerate(em_inverse_temperatures(iterations, final_lambda)):
        # M-step: per-parent Gaussian (mean, variance per pose entry) and activation
        r_a = r * a_in  # (N, n_out, n_in)
        mass = r_a.sum(dim=2, keepdim=True)  # (N, n_out, 1) = sum_i r_ij a_i
        weights = (r_a + eps) / (mass + n_in * eps)  # (N, n_out, n_in): sums to exactly 1
        mu, mean_sq = _WeightedMoments.apply(v, weights)  # (N, n_out, P) each
        var = (mean_sq - mu * mu).clamp_min(0.0) + min_var  # (N, n_out, P) >= min_var
        log_sigma = 0.5 * torch.log(var)  # (N, n_out, P)
        cost = ((beta_v + log_sigma) * mass).sum(dim=2)  # (N, n_out)
        logit_a = lam * (beta_a - cost)  # (N, n_out)
        if it == iterations - 1:
            break
        # E-step: log N(V_ij; mu_j, var_j) + log a_j, normalised over the parents j
        inv_var = 1.0 / var  # (N, n_out, P)
        quad = _Mahalanobis.apply(v, inv_var, mu * inv_var)  # (N, n_out, n_in)
        quad = quad + (mu * mu * inv_var).sum(dim=2, keepdim=True)  # sum_h (V - mu)^2 / var
        log_norm = log_sigma.sum(dim=2, keepdim=True) + 0.5 * pose_dim * _LOG_2PI  # (N, n_out, 1)
        logits = torch.nn.functional.logsigmoid(logit_a).unsqueeze(2) - 0.5 * quad - log_norm
        if scope is None:
            r = torch.softmax(logits, dim=1)  # (N, n_out, n_in): sums to 1 over parents
        else:
            r = scope.softmax(logits)  # (N, n_out, n_in): sums to 1 over all a child's parents
    pose = mu + centre.squeeze(2)  # (N, n_out, P)
    activation = torch.sigmoid(logit_a)  # (N, n_out)
    if return_assignments:
        return pose, activation, r.transpose(1, 2), var
    return pose, activation


_GROUP_BLOCK_ELEMENTS = 1 << 20  # vote entries per block in em_routing_blocked (4 MiB fp32)


def em_routing_blocked(
    make_votes,
    children: torch.Tensor,
    activations: torch.Tensor,
    weight: torch.Tensor,
    beta_v: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int = 3,
    final_lambda: float = EM_FINAL_LAMBDA,
    min_var: float = EM_MIN_VAR,
    eps: float = 1e-6,
    block_elements: int | None = None,
):
    """``em_routing(make_votes(children, weight).transpose(1, 2), activations, ...)``
    computed block by block over the N independent routing groups, with the same math, and
    without ever holding the votes of all groups.

    Args:
        make_votes: ``(children[s], weight) -> votes (n, n_out, n_in, P)`` (parent-major,
            contiguous) for a block s of groups; differentiable in both arguments.
        children: (N, ...) per-group inputs of make_votes (e.g. (N, n_in, 16) child poses).
        activations: (N, n_in); weight: shared by all groups (e.g. the transformation
            matrices); beta_v, beta_a, iterations, final_lambda, min_var, eps: as em_routing.
        block_elements: vote entries per block (default ``_GROUP_BLOCK_ELEMENTS``).

    Returns:
        pose (N, n_out, P), activation (N, n_out), as em_routing.

    Memory and speed: the votes of one block (a few MiB, cache-resident) are made, routed
    and dropped. The backward pass recomputes each block's votes, runs autograd only over
    the small per-(parent, child) tensors, and assembles the vote gradient in one batched
    matmul from rank-1 factors (see ``_VoteStats``). Nothing vote-sized is allocated for the
    whole batch, so the cost is cache bandwidth instead of page faults on fresh
    multi-100-MB temporaries, and memory stays far below the votes' size.
    """
    if iterations < 1:
        raise ValueError(f"routing iterations must be >= 1, got {iterations}")
    settings = (iterations, final_lambda, min_var, eps, block_elements or _GROUP_BLOCK_ELEMENTS)
    return _BlockedEM.apply(make_votes, settings, children, activations, weight, beta_v, beta_a)


class _VoteStats:
    """The centred votes of a block and their squares side by side, vv (n, J, I, 2P) =
    [v, v * v], and its transpose vv_t (n, J, 2P, I). Every use of the votes in EM routing
    is a matmul with vv: the M-step moments w @ vv and the E-step quadratic form
    vv @ [-2 mu / var, 1 / var]. Their vote gradients are rank-1 (outer products of a
    (n, J, I) and a (n, J, 2P) factor); the backward passes of _Moments and _Quadratic only
    record those factors, and ``vote_grad`` sums them all in one batched matmul."""

    def __init__(self, votes: torch.Tensor):
        pose_dim = votes.shape[-1]
        self.centre = votes.mean(dim=2, keepdim=True)  # (n, J, 1, P): a shift, no gradient
        self.vv = votes.new_empty(*votes.shape[:-1], 2 * pose_dim)  # (n, J, I, 2P)
        v = torch.sub(votes, self.centre, out=self.vv[..., :pose_dim])  # (n, J, I, P)
        torch.mul(v, v, out=self.vv[..., pose_dim:])  # (n, J, I, P)
        # vv @ x as x^T @ vv^T: a batched matrix-vector product is several times faster on
        # CPU with the long (children) axis contiguous.
        self.vv_t = self.vv.transpose(2, 3).contiguous()  # (n, J, 2P, I)
        self.left: list[torch.Tensor] = []  # (n, J, I) factors
        self.right: list[torch.Tensor] = []  # (n, J, 2P) factors

    def vote_grad(self) -> torch.Tensor:
        """d loss / d votes (n, J, I, P) from the recorded factors."""
        pose_dim = self.vv.shape[-1] // 2
        left = torch.stack(self.left, dim=3)  # (n, J, I, K)
        right = torch.stack(self.right, dim=2)  # (n, J, K, 2P)
        dvv = torch.matmul(left, right)  # (n, J, I, 2P): d/d[v, v*v]
        v = self.vv[..., :pose_dim]  # (n, J, I, P)
        return torch.addcmul(dvv[..., :pose_dim], v, dvv[..., pose_dim:], value=2.0)


class _Moments(torch.autograd.Function):
    """[mu, E[v^2]] (n, J, 2P) = w (n, J, I) @ vv; vv is a constant of the small graph."""

    @staticmethod
    def forward(ctx, w, stats):
        ctx.stats = stats
        ctx.save_for_backward(w)
        return torch.matmul(w.unsqueeze(2), stats.vv).squeeze(2)  # (n, J, 2P)

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        # detached: w's graph leads back to nodes whose ctx holds these stats (a cycle
        # through C++ autograd nodes that the garbage collector cannot break).
        ctx.stats.left.append(w.detach())
        ctx.stats.right.append(g.detach())
        return torch.matmul(g.unsqueeze(2), ctx.stats.vv_t).squeeze(2), None  # (n, J, I)


class _Quadratic(torch.autograd.Function):
    """q (n, J, I) = vv @ coef for coef (n, J, 2P); vv is a constant of the small graph."""

    @staticmethod
    def forward(ctx, coef, stats):
        ctx.stats = stats
        ctx.save_for_backward(coef)
        return torch.matmul(coef.unsqueeze(2), stats.vv_t).squeeze(2)  # (n, J, I)

    @staticmethod
    def backward(ctx, g):
        (coef,) = ctx.saved_tensors
        ctx.stats.left.append(g.detach())
        ctx.stats.right.append(coef.detach())
        return torch.matmul(g.unsqueeze(2), ctx.stats.vv).squeeze(2), None  # (n, J, 2P)


def _em_block(stats, a_in, beta_v, beta_a, iterations, final_lambda, min_var, eps):
    """The EM iterations of _em_routing on centred votes given as _VoteStats."""
    n, n_out, n_in, two_p = stats.vv.shape
    pose_dim = two_p // 2
    a_in = a_in.reshape(n, 1, n_in)  # (n, 1, I)
    beta_v = beta_v.reshape(-1, 1)  # (J or 1, 1)
    beta_a = beta_a.reshape(-1)  # (J or 1,)
    r = stats.vv.new_full((n, n_out, n_in), 1.0 / n_out)  # (n, J, I): uniform assignments
    for it, lam in enumerate(em_inverse_temperatures(iterations, final_lambda)):
        r_a = r * a_in  # (n, J, I)
        mass = r_a.sum(dim=2, keepdim=True)  # (n, J, 1)
        weights = (r_a + eps) / (mass + n_in * eps)  # (n, J, I): sums to exactly 1
        moments = _Moments.apply(weights, stats)  # (n, J, 2P)
        mu, mean_sq = moments[..., :pose_dim], moments[..., pose_dim:]  # (n, J, P) each
        var = (mean_sq - mu * mu).clamp_min(0.0) + min_var  # (n, J, P) >= min_var
        log_sigma = 0.5 * torch.log(var)  # (n, J, P)
        cost = ((beta_v + log_sigma) * mass).sum(dim=2)  # (n, J)
        logit_a = lam * (beta_a - cost)  # (n, J)
        if it == iterations - 1:
            break
        inv_var = 1.0 / var  # (n, J, P)
        coef = torch.cat([-2.0 * mu * inv_var, inv_var], dim=2)  # (n, J, 2P)
        quad = _Quadratic.apply(coef, stats)  # (n, J, I)
        quad = quad + (mu * mu * inv_var).sum(dim=2, keepdim=True)  # sum_h (v - mu)^2 / var
        log_norm = log_sigma.sum(dim=2, keepdim=True) + 0.5 * pose_dim * _LOG_2PI  # (n, J, 1)
        logits = torch.nn.functional.logsigmoid(logit_a).unsqueeze(2) - 0.5 * quad - log_norm
        r = torch.softmax(logits, dim=1)  # (n, J, I): sums to 1 over parents
    pose = mu + stats.centre.squeeze(2)  # (n, J, P)
    return pose, torch.sigmoid(logit_a)  # (n, J, P), (n, J)


def _group_blocks(make_votes, children, weight, block_elements):
    per_group = make_votes(children[:1], weight).numel()  # vote entries of one group
    step = max(1, block_elements // max(1, per_group))
    return [slice(s, s + step) for s in range(0, children.shape[0], step)]


class _BlockedEM(torch.autograd.Function):
    """Blocked EM routing with per-block recomputation in the backward pass."""

    @staticmethod
    def forward(ctx, make_votes, settings, children, activations, weight, beta_v, beta_a):
        iterations, final_lambda, min_var, eps, block_elements = settings
        routing = (iterations, final_lambda, min_var, eps)
        dtype = torch.promote_types(children.dtype, torch.float32)
        with torch.autocast(children.device.type, enabled=False):
            c, w, a = children.to(dtype), weight.to(dtype), activations.to(dtype)
            b_v, b_a = beta_v.to(dtype), beta_a.to(dtype)
            outs = [
                _em_block(_VoteStats(make_votes(c[s], w)), a[s], b_v, b_a, *routing)
                for s in _group_blocks(make_votes, c, w, block_elements)
            ]  # [(n, n_out, P), (n, n_out)] per block
        ctx.make_votes, ctx.settings = make_votes, settings
        ctx.save_for_backward(children, activations, weight, beta_v, beta_a)
        pose = torch.cat([o[0] for o in outs])  # (N, n_out, P)
        act = torch.cat([o[1] for o in outs])  # (N, n_out)
        return pose, act

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_pose, g_act):
        iterations, final_lambda, min_var, eps, block_elements = ctx.settings
        routing = (iterations, final_lambda, min_var, eps)
        saved = ctx.saved_tensors
        children = saved[0]
        needs = ctx.needs_input_grad[2:]
        dtype = torch.promote_types(children.dtype, torch.float32)
        grads = [torch.zeros(t.shape, dtype=dtype) if n else None for t, n in zip(saved, needs)]
        with torch.enable_grad(), torch.autocast(children.device.type, enabled=False):
            kids, acts, w, b_v, b_a = [t.detach().to(dtype) for t in saved]
            w.requires_grad_(needs[2])
            small = [b_v.requires_grad_(), b_a.requires_grad_()]  # always: they carry the graph
            for s in _group_blocks(ctx.make_votes, kids, w.detach(), block_elements):
                c = kids[s].detach().requires_grad_(needs[0])  # (n, ...)
                a = acts[s].detach().requires_grad_()  # (n, n_in)
                votes = ctx.make_votes(c, w)  # (n, J, I, P)
                stats = _VoteStats(votes.detach())
                pose, act = _em_block(stats, a, b_v, b_a, *routing)  # (n, J, P), (n, J)
                outs, g_outs = (pose, act), (g_pose[s], g_act[s])
                d_a, d_bv, d_ba = torch.autograd.grad(outs, [a, *small], g_outs)
                if needs[1]:
                    grads[1][s] = d_a  # (n, n_in)
                for k, g in ((3, d_bv), (4, d_ba)):
                    if needs[k]:
                        grads[k] += g
                if needs[0] or needs[2]:
                    wanted = [t for t, need in ((c, needs[0]), (w, needs[2])) if need]
                    got = iter(torch.autograd.grad(votes, wanted, stats.vote_grad()))
                    if needs[0]:
                        grads[0][s] = next(got)  # (n, ...)
                    if needs[2]:
                        grads[2] += next(got)  # shared weight: summed over blocks
        grads = [g if g is None else g.to(t.dtype) for g, t in zip(grads, saved)]
        return (None, None, *grads)


def em_routing_from_poses(
    children: torch.Tensor,
    weight: torch.Tensor,
    activations: torch.Tensor,
    beta_v: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int = 3,
    final_lambda: float = EM_FINAL_LAMBDA,
    min_var: float = EM_MIN_VAR,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EM routing of N groups whose votes are child pose @ transformation matrix, as one
    plain differentiable function: the same math as ``em_routing(votes, ...)``.

    Written for ``torch.compile``: the compiler fuses the vote products into the routing
    loops, so the votes are never stored (em_layers.ConvMatrixCaps with ``compiled``). It
    also runs eagerly (slowly, holding every vote-sized temporary).

    Args:
        children: (N, I, 16) child poses (rows x cols matrices flattened row by row).
        weight: (I, J, cols, cols) transformation matrices; rows = 16 / cols.
        activations: (N, I); beta_v, beta_a: (J,); the rest as ``em_routing``.

    Returns:
        pose (N, J, 16), activation (N, J).
    """
    if iterations < 1:
        raise ValueError(f"routing iterations must be >= 1, got {iterations}")
    n, n_in, pose_dim = children.shape
    n_out, cols = weight.shape[1], weight.shape[-1]
    m = children.reshape(n, n_in, 1, pose_dim // cols, cols, 1)  # (N, I, 1, r, c, 1)
    votes = (m * weight.reshape(1, n_in, n_out, 1, cols, cols)).sum(dim=4)  # (N, I, J, r, c)
    votes = votes.reshape(n, n_in, n_out, pose_dim)  # (N, I, J, P)
    a_in = activations.unsqueeze(2)  # (N, I, 1)
    r = votes.new_full((n, n_in, n_out), 1.0 / n_out)  # (N, I, J): uniform assignments
    for it, lam in enumerate(em_inverse_temperatures(iterations, final_lambda)):
        mu, sq_diff, var, log_sigma, logit_a = m_step_child_major(
            r * a_in, votes, beta_v, beta_a, lam, min_var, eps
        )
        if it == iterations - 1:
            break
        half_quad = (sq_diff * (0.5 / var)).sum(dim=3)  # (N, I, J): sum_h (V - mu)^2 / 2var
        log_norm = log_sigma.sum(dim=3) + 0.5 * pose_dim * _LOG_2PI  # (N, 1, J)
        logits = torch.nn.functional.logsigmoid(logit_a) - half_quad - log_norm  # (N, I, J)
        r = torch.softmax(logits, dim=2)  # (N, I, J): sums to 1 over parents
    return mu.squeeze(1), torch.sigmoid(logit_a).squeeze(1)  # (N, J, P), (N, J)


def m_step_child_major(r_a, votes, beta_v, beta_a, lam, min_var: float, eps: float = 1e-6):
    """The M-step over child-major votes (N, I, J, P) with activation-weighted assignments
    r_a (N, I, J) -> mu (N, 1, J, P), squared deviations (N, I, J, P), var (N, 1, J, P),
    log sigma (N, 1, J, P), activation logits (N, 1, J); torch.compile fuses it inline."""
    n_in, n_out = votes.shape[1], votes.shape[2]
    mass = r_a.sum(dim=1, keepdim=True)  # (N, 1, J)
    weights = ((r_a + eps) / (mass + n_in * eps)).unsqueeze(3)  # (N, I, J, 1): sum_i 1
    mu = (weights * votes).sum(dim=1, keepdim=True)  # (N, 1, J, P)
    sq_diff = (votes - mu) ** 2  # (N, I, J, P)
    var = (weights * sq_diff).sum(dim=1, keepdim=True) + min_var  # (N, 1, J, P)
    log_sigma = 0.5 * torch.log(var)  # (N, 1, J, P)
    cost = ((beta_v.reshape(1, 1, n_out, 1) + log_sigma) * mass.unsqueeze(3)).sum(3)  # (N,1,J)
    logit_a = lam * (beta_a.reshape(1, 1, n_out) - cost)  # (N, 1, J)
    return mu, sq_diff, var, log_sigma, logit_a
