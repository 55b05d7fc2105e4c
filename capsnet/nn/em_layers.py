"""Matrix-capsule layers for EM routing (Hinton, Sabour, Frosst 2018).

Capsule grids are carried as ``poses (B, H, W, T, 16)`` (a 4x4 pose matrix flattened row by
row, or a 16-vector in the "vector" ablation) and ``activations (B, H, W, T)``.
Votes are V_ij = M_i W_ij with one transformation matrix per (kernel offset, input type,
output type), shared across positions; windows are gathered with strided views, never with
Python loops over positions (benchmarks/em_reference.py holds the readable loop version),
and every layer routes with the one ``capsnet.nn.routing.em_routing``.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from capsnet.nn.routing import EM_FINAL_LAMBDA, EM_MIN_VAR, conv_scope, em_routing
from capsnet.nn.routing.em import device_cache

POSE_SHAPES = {"matrix": (4, 4), "vector": (1, 16)}
ROUTING_SCOPES = ("global", "window")  # a child's assignments sum to 1 over all / per window
# Vote entries that receive the scaled (row, col) position of the voting capsule:
# "paper": the first two entries of the right-hand column of the 4x4 vote (Hinton et al. 2018);
# "first-entries": entries 0 and 1 (what configs without ``coordinate_form`` trained with).
COORDINATE_ENTRIES = {"paper": (3, 7), "first-entries": (0, 1)}


def pose_shape(pose: str) -> tuple[int, int]:
    """(rows, cols) of a pose: 4x4 matrices, or 1x16 vectors (transforms become 16x16)."""
    if pose not in POSE_SHAPES:
        raise ValueError(f"pose must be one of {', '.join(POSE_SHAPES)}, got {pose!r}")
    return POSE_SHAPES[pose]


def _init_transforms(weight: torch.Tensor) -> None:
    # Entries ~ N(0, 1/c): a vote entry is a sum of c products, so it keeps the pose's scale.
    nn.init.normal_(weight, std=weight.shape[-1] ** -0.5)


class _EMRoutingLayer(nn.Module):
    """Routing settings shared by the capsule layers that route with EM, and the compiled
    routing with its fallback to eager."""

    def __init__(
        self,
        iterations: int,
        final_lambda: float,
        min_var: float,
        beta_a_scale: float = 1.0,
        normalise_cost: bool = False,
    ):
        super().__init__()
        self.iterations, self.final_lambda, self.min_var = iterations, final_lambda, min_var
        self.beta_a_scale = beta_a_scale
        self.normalise_cost = normalise_cost  # em_routing's normalise_cost
        self.compiled = False  # torch.compile the routing steps (EMCapsNet.compile_routing)
        self.fallback: str | None = None  # why compiled routing fell back to eager, if it did
        self._backward_built = False  # the compiled backward ran once (``_probe_backward``)

    def activation_bias(self) -> torch.Tensor:
        """(J,) the beta_a of the routing, ``beta_a_scale * beta_a``: the activation logit
        is ``lambda (beta_a - cost)`` with lambda about 1e-3, so an unscaled beta_a moves an
        activation by about 1e-3 per unit and learns a thousand times slower than the rest."""
        return self.beta_a * self.beta_a_scale

    def route(self, children, activations, weight, vote_bias=None, scope=None):
        """``em_routing`` with this layer's settings, beta_v and ``activation_bias``; compiled
        when ``compiled``, eager (with a warning naming the error, ``compiled`` switched off,
        the error kept in ``fallback``) where torch.compile cannot build kernels here (no C++
        compiler). An error of the
        compiler's own machinery is tried once more first: another process writing the same
        Inductor cache entry at that moment fails one compile, not the next. The backward
        is compiled at its first run, so with autograd on the first compiled call also runs
        one backward (``_probe_backward``) inside this fallback."""
        args = (children, activations, weight, self.beta_v, self.activation_bias(), self.iterations,
                self.final_lambda, self.min_var)  # fmt: skip
        options = {"vote_bias": vote_bias, "scope": scope, "normalise_cost": self.normalise_cost}
        for attempt in range(2 if self.compiled else 0):
            try:
                if torch.is_grad_enabled() and not self._backward_built:
                    _probe_backward(args, options)
                    self._backward_built = True
                return em_routing(*args, compiled=True, **options)
            except Exception as exc:
                if not _is_compile_failure(exc):
                    raise
                if attempt == 0 and not isinstance(exc, (OSError, ImportError)):
                    continue
                reason = (str(exc).strip().splitlines() or [""])[0][:200]
                self.fallback = f"{type(exc).__name__}: {reason}"
                warnings.warn(
                    f"compiled EM routing unavailable ({self.fallback}); using eager",
                    RuntimeWarning,
                    stacklevel=3,
                )
                self.compiled = False
        return em_routing(*args, **options)


def _probe_backward(args: tuple, options: dict) -> None:
    """The compiled ``em_routing`` forward and backward once, on detached copies of its
    inputs (the same shapes and grad modes, so the same graphs): Inductor compiles a
    backward graph when it first runs, and a failure there would escape the fallback."""

    def copy(value):
        if not isinstance(value, torch.Tensor):
            return value
        return value.detach().requires_grad_(value.requires_grad)

    args, options = tuple(map(copy, args)), {k: copy(v) for k, v in options.items()}
    leaves = [t for t in (*args, *options.values()) if isinstance(t, torch.Tensor)]
    leaves = [t for t in leaves if t.requires_grad]
    if leaves:
        pose, activation = em_routing(*args, compiled=True, **options)
        torch.autograd.grad(pose.sum() + activation.sum(), leaves, allow_unused=True)


def _is_compile_failure(exc: Exception) -> bool:
    """True for errors raised by torch.compile's machinery (not by the math)."""
    module = type(exc).__module__ or ""
    return module.startswith(("torch._dynamo", "torch._inductor")) or isinstance(
        exc, (OSError, ImportError)
    )


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


class ConvMatrixCaps(_EMRoutingLayer):
    """Convolutional capsule layer: each output position routes the K x K x T_in capsules of
    its window to T_out parent types with EM. ``routing_scope`` "global" normalises a child's
    assignments over the parents of every window covering it (Hinton et al.); "window" routes each
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
        beta_a_scale: float = 1.0,
        normalise_cost: bool = False,
    ):
        super().__init__(iterations, final_lambda, min_var, beta_a_scale, normalise_cost)
        if routing_scope not in ROUTING_SCOPES:
            raise ValueError(
                f"routing_scope must be one of {', '.join(ROUTING_SCOPES)}, got {routing_scope!r}"
            )
        self.routing_scope = routing_scope
        self.kernel, self.stride = kernel, stride
        self.rows, cols = pose_shape(pose)
        self.weight = nn.Parameter(torch.empty(kernel * kernel * in_types, out_types, cols, cols))
        self.beta_v = nn.Parameter(torch.zeros(out_types))
        self.beta_a = nn.Parameter(torch.zeros(out_types))
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
        batch, h, w, t_in, _ = poses.shape
        children, a_in, (h_out, w_out) = self.windows(poses, activations)
        scope = None
        if self.routing_scope == "global":
            scope = conv_scope(batch, h, w, t_in, self.kernel, self.stride, poses.device)
        pose, act = self.route(children, a_in, self.weight, scope=scope)  # (N,T_out,16), (N,T_out)
        out_types = self.weight.shape[1]
        return (
            pose.reshape(batch, h_out, w_out, out_types, 16),  # (B, H', W', T_out, 16)
            act.reshape(batch, h_out, w_out, out_types),  # (B, H', W', T_out)
        )


@device_cache
def coordinate_offsets(
    h: int, w: int, first: float, step: float, image_h: int, image_w: int, device=None
) -> torch.Tensor:
    """Scaled centres of an h x w capsule grid, (h, w, 2) as (row, col), on ``device``:
    cell i is centred on ``first + step * i`` of an axis ``image_h`` (``image_w``) long, and
    the centre (that index + 0.5) is divided by the length, so it lies in (0, 1). The
    paper's form is the grid's own (0, 1, h, w); input pixels are (first, step, image size)."""
    rows = (first + step * torch.arange(h, dtype=torch.float32) + 0.5) / image_h  # (h,)
    cols = (first + step * torch.arange(w, dtype=torch.float32) + 0.5) / image_w  # (w,)
    grid = torch.stack(torch.broadcast_tensors(rows[:, None], cols[None, :]), dim=-1)
    return grid.to(device)  # (h, w, 2)


def coordinate_bias(offsets: torch.Tensor, types: int, entries: tuple[int, int]) -> torch.Tensor:
    """The coordinate addition as a vote bias: offsets (H, W, 2) -> (H*W*T, 1, 16) with
    offset (row, col) of each child's position at vote entries ``entries``, zero elsewhere;
    children ordered (row, col, type) as ``ClassCaps``'s. Stacked, not index-assigned: no
    index tensor is copied to the device."""
    h, w, _ = offsets.shape
    zero = offsets.new_zeros(h, w)  # (H, W)
    per_entry = {entries[0]: offsets[..., 0], entries[1]: offsets[..., 1]}
    bias = torch.stack([per_entry.get(e, zero) for e in range(16)], dim=-1)  # (H, W, 16)
    return bias.unsqueeze(2).expand(h, w, types, 16).reshape(h * w * types, 1, 16)


class ClassCaps(_EMRoutingLayer):
    """Class capsules: every capsule of the last grid votes for every class with a matrix
    per (input type, class), shared across positions. With coordinate addition the scaled
    position (row, col) of the voting capsule is added to vote entries ``coordinate_entries``
    (the paper's: 3 and 7, the first two entries of the vote's right-hand column)."""

    def __init__(
        self,
        in_types: int,
        num_classes: int,
        iterations: int = 3,
        final_lambda: float = EM_FINAL_LAMBDA,
        min_var: float = EM_MIN_VAR,
        coordinate_addition: bool = True,
        pose: str = "matrix",
        coordinate_entries: tuple[int, int] = COORDINATE_ENTRIES["paper"],
        beta_a_scale: float = 1.0,
        normalise_cost: bool = False,
    ):
        super().__init__(iterations, final_lambda, min_var, beta_a_scale, normalise_cost)
        self.coordinate_addition = coordinate_addition
        self.coordinate_entries = tuple(coordinate_entries)
        self.rows, cols = pose_shape(pose)
        self.weight = nn.Parameter(torch.empty(in_types, num_classes, cols, cols))
        self.beta_v = nn.Parameter(torch.zeros(num_classes))
        self.beta_a = nn.Parameter(torch.zeros(num_classes))
        _init_transforms(self.weight)

    def forward(
        self, poses: torch.Tensor, activations: torch.Tensor, offsets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """poses (B, H, W, T, 16), activations (B, H, W, T), offsets (H, W, 2) used when
        coordinate addition is on -> class poses (B, E, 16), class activations (B, E).
        Each image is one routing group of its H*W*T capsules."""
        batch, h, w, t, _ = poses.shape
        weight = self.weight.expand(h * w, *self.weight.shape)  # (HW, T, E, c, c)
        weight = weight.reshape(h * w * t, *self.weight.shape[1:])  # (HWT, E, c, c)
        bias = None
        if self.coordinate_addition and offsets is not None:
            bias = coordinate_bias(offsets, t, self.coordinate_entries)  # (HWT, 1, 16)
        return self.route(
            poses.reshape(batch, h * w * t, 16),  # (B, HWT, 16)
            activations.reshape(batch, h * w * t),  # (B, HWT)
            weight,
            vote_bias=bias,
        )  # (B, E, 16), (B, E)
