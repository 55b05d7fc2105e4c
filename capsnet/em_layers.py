"""Matrix-capsule layers for EM routing (Hinton, Sabour, Frosst 2018).

Capsule grids are carried as ``poses (B, H, W, T, 16)`` (a 4x4 pose matrix flattened row by
row, or a 16-vector in the "vector" ablation) and ``activations (B, H, W, T)``.
Votes are V_ij = M_i W_ij with one transformation matrix per (kernel offset, input type,
output type), shared across positions; they are gathered with strided views, never with
Python loops over positions (benchmarks/em_reference.py holds the readable loop version).
"""

from __future__ import annotations

import warnings
from functools import partial

import torch
from torch import nn

from capsnet.em_compiled import compile_routing_function, compiled_global_routing
from capsnet.routing import (
    EM_FINAL_LAMBDA,
    EM_MIN_VAR,
    em_routing,
    em_routing_blocked,
    em_routing_from_poses,
)

POSE_SHAPES = {"matrix": (4, 4), "vector": (1, 16)}
ROUTING_SCOPES = ("global", "window")  # a child's assignments sum to 1 over all / per window
COORD_ENTRIES = (0, 1)  # vote entries that receive the scaled (row, col) position (SPEC 1.3)


def pose_shape(pose: str) -> tuple[int, int]:
    """(rows, cols) of a pose: 4x4 matrices, or 1x16 vectors (transforms become 16x16)."""
    if pose not in POSE_SHAPES:
        raise ValueError(f"pose must be one of {', '.join(POSE_SHAPES)}, got {pose!r}")
    return POSE_SHAPES[pose]


def transform(children: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor:
    """Votes of every child for every parent type, laid out parent-major for em_routing.

    children (N, I, 16), weight (I, J, c, c) with c = 16 / rows -> votes (N, J, I, 16)
    (contiguous), vote_ij = pose_i (rows x c) @ W_ij (c x c).
    """
    return expanded_transform(children, _expand_weight(weight, rows))  # (N, J, I, 16)


def expanded_transform(children: torch.Tensor, weight_expanded: torch.Tensor) -> torch.Tensor:
    """``transform`` with the weight already expanded by ``_expand_weight`` (done once per
    layer call, not once per block of groups): children (N, I, 16), weight_expanded
    (c, J, I, 16) -> votes (N, J, I, 16)."""
    n, n_in, _ = children.shape
    cols = weight_expanded.shape[0]
    return _Transform.apply(children.reshape(n, n_in, -1, cols), weight_expanded)


def _expand_poses(m: torch.Tensor) -> torch.Tensor:
    """m (N, I, r, c) -> (N, c, I, r*c) with [n, k, i, (r, d)] = m[n, i, r, k]."""
    n, n_in, rows, cols = m.shape
    xe = m.permute(0, 3, 1, 2).unsqueeze(4)  # (N, c, I, r, 1)
    return xe.expand(n, cols, n_in, rows, cols).reshape(n, cols, n_in, rows * cols)


def _expand_weight(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """weight (I, J, c, c) -> (c, J, I, r*c) with [k, j, i, (r, d)] = W[i, j, k, d]."""
    n_in, n_out, cols, _ = weight.shape
    we = weight.permute(2, 1, 0, 3).unsqueeze(3)  # (c, J, I, 1, c)
    return we.expand(cols, n_out, n_in, rows, cols).reshape(cols, n_out, n_in, rows * cols)


class _Transform(torch.autograd.Function):
    """votes[n, j, i, (r, d)] = sum_k m[n, i, r, k] W[i, j, k, d] for m (N, I, r, c), with
    the weight given expanded, we[k, j, i, (r, d)] = W[i, j, k, d] (``_expand_weight``).

    Written as c broadcast multiply-adds over contiguous (i, r, d) rows of the output: the
    contraction is only c = 4 long, so a batched matmul (or einsum, which also permutes its
    result) is several times slower on CPU.
    """

    @staticmethod
    def forward(ctx, m, we):
        cols = m.shape[3]
        xe = _expand_poses(m)  # (N, c, I, 16)
        out = xe[:, 0].unsqueeze(1) * we[0]  # (N, J, I, 16)
        for k in range(1, cols):
            out.addcmul_(xe[:, k].unsqueeze(1), we[k])  # (N, J, I, 16)
        ctx.save_for_backward(m, we)
        return out

    @staticmethod
    def backward(ctx, g):
        m, we = ctx.saved_tensors
        n, n_in, rows, cols = m.shape
        dm = dwe = None
        if ctx.needs_input_grad[0]:
            dxe = torch.stack([(g * we[k]).sum(dim=1) for k in range(cols)], dim=1)  # (N,c,I,16)
            dxe = dxe.reshape(n, cols, n_in, rows, cols).sum(dim=4)  # (N, c, I, r)
            dm = dxe.permute(0, 2, 3, 1)  # (N, I, r, c)
        if ctx.needs_input_grad[1]:
            xe = _expand_poses(m)  # (N, c, I, 16)
            dwe = torch.stack([(g * xe[:, k].unsqueeze(1)).sum(dim=0) for k in range(cols)])
        return dm, dwe  # (N, I, r, c), (c, J, I, 16)


COMPILED_BLOCK = 8  # windows per call of the compiled routing (best of 2..16 on a CPU core)
_compiled_routing = None


def compiled_em_routing(
    children: torch.Tensor,
    activations: torch.Tensor,
    weight: torch.Tensor,
    beta_v: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int,
    final_lambda: float,
    min_var: float,
    block: int = COMPILED_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``em_routing_from_poses`` compiled with torch.compile, ``block`` windows per call.

    children (N, I, 16), activations (N, I), weight (I, J, c, c) -> pose (N, J, 16),
    activation (N, J). The last block is padded with inactive all-zero children (their
    routing is finite and dropped), so every call has the same shape and compiles once.
    Autograd saves each block's few tensors; the votes are recomputed inside the kernels.
    """
    global _compiled_routing
    if _compiled_routing is None:
        _compiled_routing = compile_routing_function(em_routing_from_poses)
    n = children.shape[0]
    pad = (-n) % block
    with torch.autocast(children.device.type, enabled=False):  # routing in fp32
        kids = torch.nn.functional.pad(children.float(), (0, 0, 0, 0, 0, pad))  # (N+pad, I, 16)
        acts = torch.nn.functional.pad(activations.float(), (0, 0, 0, pad))  # (N+pad, I)
        w, b_v, b_a = weight.float(), beta_v.float(), beta_a.float()
        outs = [
            _compiled_routing(c, w, a, b_v, b_a, iterations, final_lambda, min_var)
            for c, a in zip(kids.split(block), acts.split(block))
        ]  # [(block, J, 16), (block, J)] per block
    pose = torch.cat([o[0] for o in outs])[:n]  # (N, J, 16)
    act = torch.cat([o[1] for o in outs])[:n]  # (N, J)
    return pose, act


def _init_transforms(weight: torch.Tensor) -> None:
    # Entries ~ N(0, 1/c): a vote entry is a sum of c products, so it keeps the pose's scale.
    nn.init.normal_(weight, std=weight.shape[-1] ** -0.5)


class GlobalScope:
    """Assignment normalisation of children shared by overlapping windows (SPEC 1.3): a
    child's assignments sum to 1 over every (window, parent type) it votes for.

    ``index`` (N, I) names the child in slot i of window n (``child_index``); the window
    axis N and the slot axis I are those of em_routing's groups and children.
    """

    def __init__(self, index: torch.Tensor, n_children: int):
        self.index = index  # (N, I)
        self.flat = index.reshape(-1)  # (N*I,)
        self.n_children = n_children

    def _per_child_sum(self, values: torch.Tensor) -> torch.Tensor:
        """values (N, I) -> sums over each child's slots, read back at every slot (N, I)."""
        total = values.new_zeros(self.n_children).index_add(0, self.flat, values.reshape(-1))
        return total[self.index]  # (N, I)

    def initial(self, n_out: int) -> torch.Tensor:
        """Uniform assignments over a child's parents: (N, n_out, n_in) of 1 / (windows * n_out)."""
        ones = torch.ones(self.index.shape, dtype=torch.float64, device=self.index.device)
        count = self._per_child_sum(ones)  # (N, I): windows holding each slot's child
        return (1.0 / (count * n_out)).unsqueeze(1).expand(-1, n_out, -1)  # (N, n_out, I)

    def log_uniform_total(self, n_out: int) -> torch.Tensor:
        """(N, I) log(windows * n_out) per slot: with logits 0, exp(logits - this) is the
        uniform first assignment of ``initial``."""
        ones = torch.ones(self.index.shape, dtype=torch.float64, device=self.index.device)
        return torch.log(self._per_child_sum(ones) * n_out)  # (N, I)

    def log_total(self, peak: torch.Tensor, sumexp: torch.Tensor) -> torch.Tensor:
        """Log of each child's sum of exp(logits) over all its parents, read back per slot
        (N, I), from per slot maxima ``peak`` (N, I) (no gradient) and sums of
        exp(logits - peak) ``sumexp`` (N, I) over the slot's parents."""
        child_peak = peak.new_full((self.n_children,), -torch.inf)  # (children,)
        child_peak = child_peak.scatter_reduce(0, self.flat, peak.reshape(-1), "amax")
        shift = child_peak[self.index]  # (N, I): the child's maximum logit
        return shift + torch.log(self._per_child_sum(sumexp * torch.exp(peak - shift)))

    def softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (N, n_out, n_in) -> assignments normalised per child across windows."""
        peak = logits.detach().amax(dim=1).reshape(-1)  # (N*I,)
        child_peak = peak.new_full((self.n_children,), -torch.inf)  # (children,)
        child_peak = child_peak.scatter_reduce(0, self.flat, peak, "amax")  # (children,)
        e = torch.exp(logits - child_peak[self.index].unsqueeze(1))  # (N, n_out, I), <= 1
        return e / self._per_child_sum(e.sum(dim=1)).unsqueeze(1)  # (N, n_out, I)


def child_index(batch: int, h: int, w: int, types: int, kernel: int, stride: int) -> torch.Tensor:
    """Child of every window slot, (B*H'*W', K*K*T), in ``ConvMatrixCaps.windows`` order;
    children are numbered row-major over (B, H, W, T)."""
    idx = torch.arange(batch * h * w * types).reshape(batch, h, w, types)  # (B, H, W, T)
    idx = idx.unfold(1, kernel, stride).unfold(2, kernel, stride)  # (B, H', W', T, K, K)
    return idx.permute(0, 1, 2, 4, 5, 3).reshape(-1, kernel * kernel * types)  # (N, KKT)


class PrimaryMatrixCaps(nn.Module):
    """1x1 convolution -> per position ``types`` capsules: a 16-entry pose and a sigmoid
    activation. Pose channel index = type * 16 + entry (a capsule lives at one position)."""

    def __init__(self, in_channels: int, types: int):
        super().__init__()
        self.types = types
        self.conv = nn.Conv2d(in_channels, types * 17, kernel_size=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.conv(x)  # (B, T*17, H, W)
        batch, _, h, w = out.shape
        t = self.types
        poses = out[:, : t * 16].reshape(batch, t, 16, h, w).permute(0, 3, 4, 1, 2)  # (B,H,W,T,16)
        activations = torch.sigmoid(out[:, t * 16 :]).permute(0, 2, 3, 1)  # (B, H, W, T)
        return poses.contiguous(), activations.contiguous()


class ConvMatrixCaps(nn.Module):
    """Convolutional capsule layer: each output position routes the K x K x T_in capsules of
    its window to T_out parent types with EM. ``routing_scope`` "global" normalises a child's
    assignments over the parents of every window covering it (SPEC 1.3); "window" routes each
    window as an independent group (a child's assignments then total 1 per window)."""

    def __init__(
        self,
        in_types: int,
        out_types: int,
        kernel: int,
        stride: int,
        iterations: int = 3,
        final_lambda: float = EM_FINAL_LAMBDA,
        min_var: float = EM_MIN_VAR,
        pose: str = "matrix",
        routing_scope: str = "global",
    ):
        super().__init__()
        if routing_scope not in ROUTING_SCOPES:
            raise ValueError(
                f"routing_scope must be one of {', '.join(ROUTING_SCOPES)}, got {routing_scope!r}"
            )
        self.routing_scope = routing_scope
        self.kernel, self.stride = kernel, stride
        self.iterations, self.final_lambda, self.min_var = iterations, final_lambda, min_var
        self.rows, cols = pose_shape(pose)
        self.weight = nn.Parameter(torch.empty(kernel * kernel * in_types, out_types, cols, cols))
        self.beta_v = nn.Parameter(torch.zeros(out_types))
        self.beta_a = nn.Parameter(torch.zeros(out_types))
        self.compiled = False  # route with compiled_em_routing (EMCapsNet.compile_routing)
        _init_transforms(self.weight)

    def windows(
        self, poses: torch.Tensor, activations: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """Children of every output position: (B*H'*W', K*K*T, 16), (B*H'*W', K*K*T), (H', W').

        Child order within a window is (kernel row, kernel col, type), matching ``weight``.
        """
        k, s = self.kernel, self.stride
        batch = poses.shape[0]
        p = poses.unfold(1, k, s).unfold(2, k, s)  # (B, H', W', T, 16, K, K) strided view
        a = activations.unfold(1, k, s).unfold(2, k, s)  # (B, H', W', T, K, K) strided view
        h_out, w_out = p.shape[1], p.shape[2]
        p = p.permute(0, 1, 2, 5, 6, 3, 4).reshape(batch * h_out * w_out, -1, 16)  # (N, KKT, 16)
        a = a.permute(0, 1, 2, 4, 5, 3).reshape(batch * h_out * w_out, -1)  # (N, KKT)
        return p, a, (h_out, w_out)

    def forward(
        self, poses: torch.Tensor, activations: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """poses (B, H, W, T_in, 16), activations (B, H, W, T_in) -> same with H', W', T_out."""
        batch = poses.shape[0]
        children, a_in, (h_out, w_out) = self.windows(poses, activations)
        if self.routing_scope == "global":
            pose, act = self._global_forward(poses.shape, children, a_in)
        else:
            settings = (self.iterations, self.final_lambda, self.min_var)
            found = None
            if self.compiled:
                weights = (self.weight, self.beta_v, self.beta_a)
                found = self._try_compiled(compiled_em_routing, children, a_in, *weights, *settings)
            pose, act = found or em_routing_blocked(
                expanded_transform,  # votes of a block of windows: (n, T_out, KKT, 16)
                children,
                a_in,
                _expand_weight(self.weight, self.rows),  # (c, T_out, KKT, 16), once per call
                self.beta_v,
                self.beta_a,
                *settings,
            )  # (N, T_out, 16), (N, T_out)
        out_types = self.weight.shape[1]
        return (
            pose.reshape(batch, h_out, w_out, out_types, 16),  # (B, H', W', T_out, 16)
            act.reshape(batch, h_out, w_out, out_types),  # (B, H', W', T_out)
        )

    def _global_forward(self, shape, children, a_in):
        """Routing of all windows at once, assignments normalised per child (GlobalScope)."""
        batch, h, w, t_in, _ = shape
        index = child_index(batch, h, w, t_in, self.kernel, self.stride).to(children.device)
        scope = GlobalScope(index, batch * h * w * t_in)
        settings = (self.iterations, self.final_lambda, self.min_var)
        if self.compiled:
            weights = (self.weight, self.beta_v, self.beta_a)
            found = self._try_compiled(
                compiled_global_routing, children, a_in, *weights, scope, *settings
            )
            if found is not None:
                return found
        votes = expanded_transform(children, _expand_weight(self.weight, self.rows))  # (N,J,I,16)
        return em_routing(
            votes.transpose(1, 2),  # (N, I, J, 16) view of parent-major votes
            a_in,
            self.beta_v,
            self.beta_a,
            *settings,
            scope=scope,
        )  # (N, T_out, 16), (N, T_out)

    def _try_compiled(self, function, *args):
        """``function(*args)``; None, with a warning and ``compiled`` switched off, where
        torch.compile cannot run here (no C++ compiler): the caller routes eagerly."""
        try:
            return function(*args)
        except Exception as exc:
            if not _is_compile_failure(exc):
                raise
            warnings.warn(
                f"compiled EM routing unavailable ({type(exc).__name__}); using eager",
                RuntimeWarning,
                stacklevel=4,
            )
            self.compiled = False
            return None


def _is_compile_failure(exc: Exception) -> bool:
    """True for errors raised by torch.compile's machinery (not by the math)."""
    module = type(exc).__module__ or ""
    return module.startswith(("torch._dynamo", "torch._inductor")) or isinstance(
        exc, (OSError, ImportError)
    )


def coordinate_offsets(
    h: int, w: int, first: float, step: float, image_h: int, image_w: int
) -> torch.Tensor:
    """Scaled receptive-field centres of an h x w capsule grid, (h, w, 2) as (row, col).

    Grid cell i has its receptive field centred on input pixel ``first + step * i``; the
    centre (pixel index + 0.5) is divided by the image size, so it lies in (0, 1).
    """
    rows = (first + step * torch.arange(h, dtype=torch.float32) + 0.5) / image_h  # (h,)
    cols = (first + step * torch.arange(w, dtype=torch.float32) + 0.5) / image_w  # (w,)
    return torch.stack(torch.broadcast_tensors(rows[:, None], cols[None, :]), dim=-1)  # (h,w,2)


class ClassCaps(nn.Module):
    """Class capsules: every capsule of the last grid votes for every class with a matrix
    per (input type, class), shared across positions. With coordinate addition the scaled
    receptive-field centre (row, col) of the voting capsule is added to vote entries
    ``COORD_ENTRIES`` (the paper adds it to the first two entries of the vote)."""

    def __init__(
        self,
        in_types: int,
        num_classes: int,
        iterations: int = 3,
        final_lambda: float = EM_FINAL_LAMBDA,
        min_var: float = EM_MIN_VAR,
        coordinate_addition: bool = True,
        pose: str = "matrix",
    ):
        super().__init__()
        self.iterations, self.final_lambda, self.min_var = iterations, final_lambda, min_var
        self.coordinate_addition = coordinate_addition
        self.rows, cols = pose_shape(pose)
        self.weight = nn.Parameter(torch.empty(in_types, num_classes, cols, cols))
        self.beta_v = nn.Parameter(torch.zeros(num_classes))
        self.beta_a = nn.Parameter(torch.zeros(num_classes))
        _init_transforms(self.weight)

    def votes(self, poses: torch.Tensor, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """poses (B, H, W, T, 16), offsets (H, W, 2) or None -> votes (B, E, H*W*T, 16)."""
        return class_votes(poses, self.weight, self.rows, offsets)

    def forward(
        self, poses: torch.Tensor, activations: torch.Tensor, offsets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """poses (B, H, W, T, 16), activations (B, H, W, T), offsets (H, W, 2) used when
        coordinate addition is on -> class poses (B, E, 16), class activations (B, E)."""
        batch = poses.shape[0]
        offsets = offsets if self.coordinate_addition else None
        return em_routing_blocked(
            partial(class_votes, rows=self.rows, offsets=offsets),  # (b, E, HWT, 16)
            poses,
            activations.reshape(batch, -1),  # (B, HWT)
            self.weight,
            self.beta_v,
            self.beta_a,
            self.iterations,
            self.final_lambda,
            self.min_var,
        )  # (B, E, 16), (B, E)


def class_votes(
    poses: torch.Tensor, weight: torch.Tensor, rows: int, offsets: torch.Tensor | None = None
) -> torch.Tensor:
    """Class-capsule votes: poses (B, H, W, T, 16), weight (T, E, c, c), offsets (H, W, 2) or
    None -> votes (B, E, H*W*T, 16), child order (row, col, type)."""
    batch, h, w, t, _ = poses.shape
    m = poses.reshape(batch, h * w, t, rows, -1)  # (B, HW, T, r, c)
    votes = torch.einsum("bstrc,tecd->bestrd", m, weight)  # (B, E, HW, T, r, c)
    votes = votes.reshape(batch, -1, h * w, t, 16)  # (B, E, HW, T, 16)
    if offsets is not None:
        coord = votes.new_zeros(h * w, 1, 16)  # (HW, 1, 16)
        coord[:, 0, list(COORD_ENTRIES)] = offsets.reshape(h * w, 2).to(coord.dtype)
        votes = votes + coord  # (B, E, HW, T, 16)
    return votes.reshape(batch, votes.shape[1], h * w * t, 16)  # (B, E, HWT, 16)
