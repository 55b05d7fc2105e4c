"""Matrix capsules with EM routing: routing invariants, numerics, reference match, models."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from capsnet import checkpoint, losses, models
from capsnet.em_layers import (
    ClassCaps,
    ConvMatrixCaps,
    GlobalScope,
    child_index,
    coordinate_offsets,
)
from capsnet.errors import ConfigError
from capsnet.routing import (
    EM_MIN_VAR,
    em_inverse_temperatures,
    em_routing,
    em_routing_blocked,
    em_routing_from_poses,
)
from capsnet.train import TrainConfig, spread_margin

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.em_reference import (
    ReferenceEMCapsNet,
    conv_caps_global_reference,
    conv_caps_reference,
    em_routing_reference,
)

SMALLNORB = {"in_channels": 1, "input_size": 32, "num_classes": 5}
SMALLNORB_STEREO = {"in_channels": 2, "input_size": 32, "num_classes": 5}
OVERFIT_IMAGES, OVERFIT_EPOCHS = 10, 100
TINY = {"A": 8, "B": 4, "C": 4, "D": 4, "input_size": 24, "num_classes": 5}


def _routing_inputs(batch=3, n_in=12, n_out=4, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    votes = torch.randn(batch, n_in, n_out, 16, generator=g, dtype=dtype)
    activations = torch.rand(batch, n_in, generator=g, dtype=dtype)
    beta_v = 0.1 * torch.randn(n_out, generator=g, dtype=dtype)
    beta_a = 0.1 * torch.randn(n_out, generator=g, dtype=dtype)
    return votes, activations, beta_v, beta_a


# ---- parameter counts ---------------------------------------------------------------------


def _em_count(in_channels, a, b, c, d, e, kernel=3):
    conv1 = in_channels * 25 * a + a
    primary = a * b * 17 + b * 17
    caps1 = kernel * kernel * b * c * 16 + 2 * c  # 4x4 matrices + beta_v, beta_a per type
    caps2 = kernel * kernel * c * d * 16 + 2 * d
    classes = d * e * 16 + 2 * e
    return conv1 + primary + caps1 + caps2 + classes


@pytest.mark.parametrize(
    ("name", "overrides", "expected"),
    [
        # SPEC 1.3 "about 310K": the 4x4 matrices of ConvCaps1/2 alone are 2 x 147,456.
        ("em-capsnet", SMALLNORB, 316_394),
        ("em-capsnet", SMALLNORB_STEREO, 317_194),
        ("em-capsnet", {}, 318_964),  # MNIST 28x28, E = 10
        # SPEC 1.3 "about 68K"
        ("em-capsnet-small", SMALLNORB, 67_154),
        ("em-capsnet-small", SMALLNORB_STEREO, 68_754),
        ("em-capsnet-small", {}, 68_444),
        # SPEC 1.3 "about 4.2M at 32x32"
        ("smallnorb-cnn", SMALLNORB, 4_252_549),
        ("smallnorb-cnn", SMALLNORB_STEREO, 4_253_349),
        ("smallnorb-cnn", {}, 3_274_634),
    ],
)
def test_parameter_counts(name, overrides, expected):
    assert models.count_parameters(models.build(name, **overrides)) == expected


def test_parameter_count_formula():
    model = models.build("em-capsnet", **SMALLNORB)
    assert models.count_parameters(model) == _em_count(1, 32, 32, 32, 32, 5)
    small = models.build("em-capsnet-small", **SMALLNORB_STEREO)
    assert models.count_parameters(small) == _em_count(2, 64, 8, 16, 16, 5)


def test_pose_vector_ablation_has_16x16_transforms():
    model = models.build("em-capsnet", pose="vector", **SMALLNORB)
    assert model.caps1.weight.shape == (9 * 32, 32, 16, 16)
    out = models.build("em-capsnet-small", pose="vector", **TINY)(torch.rand(2, 1, 24, 24))
    assert out.scores.shape == (2, 5) and torch.isfinite(out.scores).all()


# ---- routing invariants and numerics --------------------------------------------------------


def test_inverse_temperature_schedule():
    lams = em_inverse_temperatures(3, 0.01)
    assert lams == pytest.approx([0.01 * (1 - 0.95**1), 0.01 * (1 - 0.95**2), 0.01 * (1 - 0.95**3)])


@pytest.mark.parametrize("iterations", [1, 2, 3, 5])
def test_em_invariants(iterations):
    votes, act, beta_v, beta_a = _routing_inputs()
    pose, a, r, var = em_routing(votes, act, beta_v, beta_a, iterations, return_assignments=True)
    assert pose.shape == (3, 4, 16) and a.shape == (3, 4) and r.shape == (3, 12, 4)
    torch.testing.assert_close(r.sum(dim=2), torch.ones(3, 12))
    assert (r >= 0).all()
    assert ((a > 0) & (a < 1)).all()
    assert (var >= EM_MIN_VAR).all()


def _finite_everywhere(votes, act, iterations):
    votes = votes.clone().requires_grad_(True)
    act = act.clone().requires_grad_(True)
    beta_v = torch.zeros(votes.shape[2], requires_grad=True)
    beta_a = torch.zeros(votes.shape[2], requires_grad=True)
    pose, a = em_routing(votes, act, beta_v, beta_a, iterations)
    (pose.square().sum() + a.sum()).backward()
    for t in (pose, a, votes.grad, act.grad, beta_v.grad, beta_a.grad):
        assert torch.isfinite(t).all()


@pytest.mark.parametrize("iterations", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("case", ["zeros", "zero-activations", "saturated", "identical", "huge"])
def test_em_no_nan_or_inf(iterations, case):
    votes, act, _, _ = _routing_inputs(batch=2, n_in=18, n_out=5)
    if case == "zeros":
        votes, act = torch.zeros_like(votes), torch.zeros_like(act)
    elif case == "zero-activations":
        act = torch.zeros_like(act)
    elif case == "saturated":
        votes, act = 100.0 * votes, torch.ones_like(act)
    elif case == "identical":
        votes = votes[:, :1, :1].expand_as(votes).contiguous()
    elif case == "huge":
        votes = 1e4 * votes
    _finite_everywhere(votes, act, iterations)


def test_identical_votes_hit_the_variance_floor():
    votes = torch.randn(1, 1, 1, 16).expand(2, 10, 3, 16).contiguous()
    pose, _, _, var = em_routing(
        votes, torch.ones(2, 10), torch.zeros(3), torch.zeros(3), 3, return_assignments=True
    )
    torch.testing.assert_close(var, torch.full_like(var, EM_MIN_VAR))
    torch.testing.assert_close(pose, votes[:, 0])


@pytest.mark.parametrize("iterations", [1, 2, 3, 5])
def test_em_matches_reference(iterations):
    votes, act, beta_v, beta_a = _routing_inputs(batch=4, n_in=20, n_out=6, dtype=torch.float64)
    pose, a, r, var = em_routing(votes, act, beta_v, beta_a, iterations, return_assignments=True)
    ref_pose, ref_a, ref_r, ref_var = em_routing_reference(votes, act, beta_v, beta_a, iterations)
    torch.testing.assert_close(pose, ref_pose)
    torch.testing.assert_close(a, ref_a)
    torch.testing.assert_close(var, ref_var)
    if iterations > 1:
        torch.testing.assert_close(r, ref_r)


def test_em_routing_ignores_autocast():
    votes, act, beta_v, beta_a = _routing_inputs()
    expected = em_routing(votes, act, beta_v, beta_a, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = em_routing(votes, act, beta_v, beta_a, 3)
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got, expected)


def test_em_gradients_match_reference():
    votes, act, beta_v, beta_a = _routing_inputs(batch=2, n_in=9, n_out=3, dtype=torch.float64)
    inputs = [t.clone().requires_grad_(True) for t in (votes, act, beta_v, beta_a)]
    ref_inputs = [t.clone().requires_grad_(True) for t in (votes, act, beta_v, beta_a)]
    pose, a = em_routing(*inputs, iterations=3)
    ref_pose, ref_a, _, _ = em_routing_reference(*ref_inputs, iterations=3)
    weight = torch.randn_like(pose, dtype=torch.float64)
    ((pose * weight).sum() + 3 * a.sum()).backward()
    ((ref_pose * weight).sum() + 3 * ref_a.sum()).backward()
    for fast, ref in zip(inputs, ref_inputs):
        torch.testing.assert_close(fast.grad, ref.grad)


def _make_votes(children, weight):
    # children (n, I, 4), weight (I, J, 4, 16) -> votes (n, J, I, 16), parent-major
    return torch.einsum("nic,ijcp->njip", children, weight)


@pytest.mark.parametrize("iterations", [1, 2, 3, 5])
@pytest.mark.parametrize("block_elements", [1, 7 * 16 * 5, 1 << 20])
def test_blocked_em_matches_em_routing(iterations, block_elements):
    """Blocked routing with per-block recomputation == em_routing on the full votes, values
    and gradients of every input, whatever the block size (1 group, 7 groups, all)."""
    g = torch.Generator().manual_seed(iterations)
    n, n_in, n_out = 10, 7, 5
    kids = torch.randn(n, n_in, 4, generator=g, dtype=torch.float64)
    weight = torch.randn(n_in, n_out, 4, 16, generator=g, dtype=torch.float64)
    act = torch.rand(n, n_in, generator=g, dtype=torch.float64)
    beta_v = 0.1 * torch.randn(n_out, generator=g, dtype=torch.float64)
    beta_a = 0.1 * torch.randn(n_out, generator=g, dtype=torch.float64)
    inputs = [t.clone().requires_grad_(True) for t in (kids, weight, act, beta_v, beta_a)]
    ref_inputs = [t.clone().requires_grad_(True) for t in (kids, weight, act, beta_v, beta_a)]
    c, w, a, bv, ba = inputs
    pose, act_out = em_routing_blocked(
        _make_votes, c, a, w, bv, ba, iterations, block_elements=block_elements
    )
    rc, rw, ra, rbv, rba = ref_inputs
    votes = _make_votes(rc, rw).transpose(1, 2)  # (n, I, J, 16)
    ref_pose, ref_act = em_routing(votes, ra, rbv, rba, iterations)
    torch.testing.assert_close(pose, ref_pose)
    torch.testing.assert_close(act_out, ref_act)
    weight_pose = torch.randn(pose.shape, generator=g, dtype=torch.float64)
    ((pose * weight_pose).sum() + 3 * act_out.sum()).backward()
    ((ref_pose * weight_pose).sum() + 3 * ref_act.sum()).backward()
    for fast, ref in zip(inputs, ref_inputs):
        torch.testing.assert_close(fast.grad, ref.grad)


def test_blocked_em_gradcheck():
    g = torch.Generator().manual_seed(0)
    kids = torch.randn(3, 4, 4, generator=g, dtype=torch.float64)
    weight = torch.randn(4, 3, 4, 16, generator=g, dtype=torch.float64)
    act = torch.rand(3, 4, generator=g, dtype=torch.float64)
    betas = [0.1 * torch.randn(3, generator=g, dtype=torch.float64) for _ in range(2)]
    inputs = tuple(t.requires_grad_(True) for t in (kids, act, weight, *betas))

    def fn(c, a, w, bv, ba):
        return em_routing_blocked(_make_votes, c, a, w, bv, ba, 2, final_lambda=1.0,
                                  block_elements=64 * 3)  # fmt: skip

    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


def test_conv_votes_transform_matches_einsum():
    from capsnet.em_layers import transform

    g = torch.Generator().manual_seed(0)
    for rows in (4, 1):  # 4x4 matrices and the 16-vector ablation (16x16 transforms)
        cols = 16 // rows
        kids = torch.randn(5, 6, 16, generator=g, dtype=torch.float64, requires_grad=True)
        weight = torch.randn(6, 3, cols, cols, generator=g, dtype=torch.float64)
        weight.requires_grad_(True)
        m = kids.reshape(5, 6, rows, cols)
        expected = torch.einsum("nirc,ijcd->njird", m, weight).reshape(5, 3, 6, 16)
        got = transform(kids, weight, rows)  # (N, J, I, 16)
        torch.testing.assert_close(got, expected)
        grad = torch.randn(got.shape, generator=g, dtype=torch.float64)
        torch.testing.assert_close(
            torch.autograd.grad(got, (kids, weight), grad),
            torch.autograd.grad(expected, (kids, weight), grad),
        )


@pytest.mark.parametrize("rows", [4, 1])
@pytest.mark.parametrize("iterations", [1, 3])
def test_em_routing_from_poses_matches_em_routing(rows, iterations):
    """The compile-friendly path (votes made inside) == em_routing on einsum votes: values
    and gradients of every input, for 4x4 matrices and the 16-vector ablation."""
    g = torch.Generator().manual_seed(rows + iterations)
    cols = 16 // rows
    n, n_in, n_out = 4, 9, 5
    tensors = (
        torch.randn(n, n_in, 16, generator=g, dtype=torch.float64),
        torch.randn(n_in, n_out, cols, cols, generator=g, dtype=torch.float64) / cols,
        torch.rand(n, n_in, generator=g, dtype=torch.float64),
        0.1 * torch.randn(n_out, generator=g, dtype=torch.float64),
        0.1 * torch.randn(n_out, generator=g, dtype=torch.float64),
    )
    inputs = [t.clone().requires_grad_(True) for t in tensors]
    ref_inputs = [t.clone().requires_grad_(True) for t in tensors]
    pose, act = em_routing_from_poses(*inputs, iterations=iterations)
    kids, weight, a, bv, ba = ref_inputs
    m = kids.reshape(n, n_in, rows, cols)
    votes = torch.einsum("nirc,ijcd->nijrd", m, weight).reshape(n, n_in, n_out, 16)
    ref_pose, ref_act = em_routing(votes, a, bv, ba, iterations)
    torch.testing.assert_close(pose, ref_pose)
    torch.testing.assert_close(act, ref_act)
    grad_pose = torch.randn(pose.shape, generator=g, dtype=torch.float64)
    ((pose * grad_pose).sum() + 3 * act.sum()).backward()
    ((ref_pose * grad_pose).sum() + 3 * ref_act.sum()).backward()
    for fast, ref in zip(inputs, ref_inputs):
        torch.testing.assert_close(fast.grad, ref.grad)


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["window", "global"])
def test_compiled_routing_matches_eager_model(scope):
    """EMCapsNet.compile_routing: same outputs and parameter gradients as the eager layers
    (fp32 tolerance); per window including a padded last block (7 windows of 8 per call),
    globally with all windows routed in one call."""
    torch.manual_seed(0)
    config = {**TINY, "input_size": 28, "routing_scope": scope}  # grids 12 -> 5 -> 3
    eager = models.build("em-capsnet-small", **config)
    compiled = models.build("em-capsnet-small", **config)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile_routing()
    x = torch.rand(3, 1, 28, 28)
    target = torch.tensor([0, 3, 4])
    outs = []
    for model in (eager, compiled):
        out = model(x)
        losses.spread_loss(out.scores, target, 0.5).backward()
        outs.append(out)
    torch.testing.assert_close(outs[1].scores, outs[0].scores, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outs[1].poses, outs[0].poses, rtol=1e-4, atol=1e-4)
    for (name, p_eager), p_compiled in zip(eager.named_parameters(), compiled.parameters()):
        scale = p_eager.grad.abs().max().clamp_min(1e-6)
        err = (p_compiled.grad - p_eager.grad).abs().max() / scale
        assert err < 1e-3, f"{name}: relative gradient error {err:.2e}"
    with torch.no_grad():
        torch.testing.assert_close(compiled(x).scores, outs[0].scores, rtol=1e-4, atol=1e-5)
    assert compiled.caps1.compiled and compiled.caps2.compiled  # no fallback to eager


def test_em_gradcheck():
    votes, act, beta_v, beta_a = _routing_inputs(batch=1, n_in=4, n_out=3, dtype=torch.float64)
    inputs = tuple(t.requires_grad_(True) for t in (votes, act, beta_v, beta_a))

    def fn(*args):
        pose, a = em_routing(*args, iterations=2, final_lambda=1.0)
        return pose, a

    assert torch.autograd.gradcheck(fn, inputs, fast_mode=True)


# ---- layers and models ----------------------------------------------------------------------


@pytest.mark.parametrize("scope", ["global", "window"])
def test_model_matches_loop_reference(scope):
    torch.manual_seed(0)
    model = models.build("em-capsnet-small", routing_scope=scope, **TINY)
    x = torch.rand(3, 1, 24, 24)
    out = model(x)
    out.scores.sum().backward()
    fast_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = ReferenceEMCapsNet(model)(x)
    ref.scores.sum().backward()
    torch.testing.assert_close(out.scores, ref.scores, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.poses, ref.poses, rtol=1e-4, atol=1e-4)
    for fast, p in zip(fast_grads, model.parameters()):
        torch.testing.assert_close(fast, p.grad, rtol=1e-3, atol=1e-5)


def _conv_layer_inputs(stride, iterations, seed=0, size=(7, 6), scope="global"):
    torch.manual_seed(seed)
    layer = ConvMatrixCaps(2, 3, kernel=3, stride=stride, iterations=iterations)
    layer.routing_scope = scope
    layer = layer.double()
    with torch.no_grad():
        layer.beta_v.normal_()
        layer.beta_a.normal_()
    poses = torch.randn(2, *size, 2, 16, dtype=torch.float64, requires_grad=True)
    acts = torch.rand(2, *size, 2, dtype=torch.float64, requires_grad=True)
    return layer, poses, acts


def _assert_matches_global_reference(layer, poses, acts, fast) -> None:
    """``fast`` (the layer's (poses, activations)) equals the loop reference over the
    convolution geometry in values and in the gradients of every input and parameter."""
    ref_poses, ref_acts, _ = conv_caps_global_reference(layer, poses, acts)
    torch.testing.assert_close(fast[0], ref_poses, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(fast[1], ref_acts, rtol=1e-10, atol=1e-12)
    g_pose, g_act = torch.randn_like(ref_poses), torch.randn_like(ref_acts)
    wrt = (poses, acts, layer.weight, layer.beta_v, layer.beta_a)
    fast_grads = torch.autograd.grad(fast, wrt, (g_pose, g_act))
    ref_grads = torch.autograd.grad((ref_poses, ref_acts), wrt, (g_pose, g_act))
    for name, got, want in zip(
        ("poses", "acts", "weight", "beta_v", "beta_a"), fast_grads, ref_grads
    ):
        torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-10, msg=name)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("iterations", [1, 2, 3, 5])
def test_global_routing_matches_loop_reference(stride, iterations):
    """Global-scope ConvMatrixCaps == the loop reference over the convolution geometry, in
    values and in the gradients of every input and parameter (fp64)."""
    layer, poses, acts = _conv_layer_inputs(stride, iterations)
    fast = layer(poses, acts)  # (B, H', W', J, 16), (B, H', W', J)
    _assert_matches_global_reference(layer, poses, acts, fast)


def test_global_and_window_routing_differ_where_windows_overlap():
    layer, poses, acts = _conv_layer_inputs(stride=2, iterations=3)
    global_acts = layer(poses, acts)[1]  # (B, 3, 2, J)
    layer.routing_scope = "window"
    window_acts = layer(poses, acts)[1]
    torch.testing.assert_close(window_acts, conv_caps_reference(layer, poses, acts)[1])
    assert (global_acts - window_acts).abs().max() > 1e-3


@pytest.mark.parametrize("stride", [1, 2])
def test_global_assignments_total_one_per_child(stride):
    """Each child's last assignments sum to 1 over all its parents in all windows (and to
    the number of covering windows under per-window routing); the fast normaliser agrees."""
    layer, poses, acts = _conv_layer_inputs(stride, iterations=3, size=(7, 7))
    _, _, r = conv_caps_global_reference(layer, poses.detach(), acts.detach())
    total = torch.zeros(2, 7, 7, dtype=torch.float64)  # (B, H, W): summed over T and windows
    for (y, x), assign in r.items():  # (B, KKT, J)
        per_slot = assign.sum(dim=2).reshape(2, 3, 3, 2).sum(dim=3)  # (B, K, K)
        total[:, y * stride : y * stride + 3, x * stride : x * stride + 3] += per_slot
    torch.testing.assert_close(total, torch.full_like(total, 2.0))  # T = 2 children a cell
    index = child_index(2, 7, 7, 2, kernel=3, stride=stride)  # (N, 18)
    scope = GlobalScope(index, 2 * 7 * 7 * 2)
    for r0 in (scope.initial(3), scope.softmax(100 * torch.randn(index.shape[0], 3, 18))):
        child_total = torch.zeros(2 * 7 * 7 * 2, dtype=r0.dtype).index_add(
            0, index.reshape(-1), r0.sum(dim=1).reshape(-1)
        )  # (children,)
        torch.testing.assert_close(child_total, torch.ones_like(child_total))


def test_global_log_total_normalises_each_child_across_windows():
    """GlobalScope.log_total from per-slot maxima and sums of exponentials: exp(logits -
    log_total) is the cross-window softmax, and gradients agree with it too."""
    index = child_index(2, 5, 5, 2, kernel=3, stride=1)  # (N, 18)
    scope = GlobalScope(index, 2 * 5 * 5 * 2)
    g = torch.Generator().manual_seed(0)
    logits = 30 * torch.randn(index.shape[0], 18, 4, generator=g, dtype=torch.float64)
    logits.requires_grad_()  # (N, I, J): slot-major as the compiled routing keeps them
    peak = logits.detach().amax(dim=2)  # (N, I)
    sumexp = torch.exp(logits - peak.unsqueeze(2)).sum(dim=2)  # (N, I)
    r = torch.exp(logits - scope.log_total(peak, sumexp).unsqueeze(2))  # (N, I, J)
    want = scope.softmax(logits.transpose(1, 2)).transpose(1, 2)  # (N, I, J)
    torch.testing.assert_close(r, want, rtol=1e-12, atol=1e-15)
    weights = torch.randn(r.shape, generator=g, dtype=torch.float64)
    got_grad = torch.autograd.grad((r * weights).sum(), logits)[0]
    want_grad = torch.autograd.grad((want * weights).sum(), logits)[0]
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-10, atol=1e-12)
    uniform = torch.exp(-scope.log_uniform_total(4)).unsqueeze(1).expand(-1, 4, -1)
    torch.testing.assert_close(uniform, scope.initial(4))  # (N, J, I)


@pytest.mark.slow
@pytest.mark.parametrize(("stride", "iterations"), [(1, 1), (1, 3), (2, 4)])
def test_compiled_global_routing_matches_loop_reference(stride, iterations):
    """The compiled global path (capsnet.em_compiled) == the loop reference over the
    convolution geometry in values and all gradients, in fp64 (40 windows at stride 1, 12 at
    stride 2: the last block of 8 padded)."""
    layer, poses, acts = _conv_layer_inputs(stride, iterations)
    layer.compiled = True
    fast = layer(poses, acts)  # (B, H', W', J, 16), (B, H', W', J)
    assert layer.compiled  # no fallback to eager
    _assert_matches_global_reference(layer, poses, acts, fast)


@pytest.mark.parametrize("iterations", [1, 2, 3, 4, 5])
def test_global_routing_model_is_nan_free(iterations):
    torch.manual_seed(iterations)
    model = models.build("em-capsnet-small", routing_iterations=iterations, **TINY)
    for x in (torch.rand(2, 1, 24, 24), torch.zeros(2, 1, 24, 24), torch.ones(2, 1, 24, 24)):
        out = model(x)
        losses.spread_loss(out.scores, torch.tensor([0, 1]), 0.9).backward()
        assert torch.isfinite(out.scores).all() and torch.isfinite(out.poses).all()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_routing_scope_setting():
    assert models.build("em-capsnet-small", **TINY).caps1.routing_scope == "global"
    window = models.build("em-capsnet-small", routing_scope="window", **TINY)
    assert window.caps1.routing_scope == window.caps2.routing_scope == "window"
    with pytest.raises(ConfigError, match="routing_scope must be one of global, window"):
        models.build("em-capsnet-small", routing_scope="layer", **TINY)


@pytest.mark.parametrize("scope", ["window", "global"])
def test_compiled_routing_falls_back_to_eager_where_compilation_fails(monkeypatch, scope):
    import capsnet.em_compiled as em_compiled
    import capsnet.em_layers as em_layers

    def no_compiler(*args, **kwargs):
        raise OSError("no C++ compiler")

    monkeypatch.setattr(em_layers, "_compiled_routing", no_compiler)
    monkeypatch.setattr(em_compiled, "_compiled_step", no_compiler)
    monkeypatch.setattr(em_compiled, "_compiled_last", no_compiler)
    torch.manual_seed(0)
    eager = models.build("em-capsnet-small", routing_scope=scope, **TINY)
    compiled = models.build("em-capsnet-small", routing_scope=scope, **TINY).compile_routing()
    compiled.load_state_dict(eager.state_dict())
    x = torch.rand(2, 1, 24, 24)
    with pytest.warns(RuntimeWarning, match="compiled EM routing unavailable"):
        scores = compiled(x).scores
    torch.testing.assert_close(scores, eager(x).scores)
    assert not compiled.caps1.compiled and not compiled.caps2.compiled


def test_checkpoint_without_routing_scope_loads_as_window(tmp_path):
    """A checkpoint saved before routing_scope existed was trained per window."""
    model = models.build("em-capsnet-small", routing_scope="window", **TINY)
    path = tmp_path / "old.pt"
    checkpoint.save(path, model)
    payload = torch.load(path, weights_only=False)
    del payload["model_config"]["routing_scope"]
    torch.save(payload, path)
    loaded, meta = checkpoint.load(path)
    assert loaded.config.routing_scope == "window" == loaded.caps1.routing_scope
    assert meta["model_config"]["routing_scope"] == "window"
    checkpoint.save(path, models.build("em-capsnet-small", **TINY))
    assert checkpoint.load(path)[0].caps2.routing_scope == "global"


def test_coordinate_addition_changes_only_the_first_two_vote_entries():
    torch.manual_seed(0)
    layer = ClassCaps(in_types=3, num_classes=4)
    poses = torch.randn(2, 4, 4, 3, 16)
    offsets = coordinate_offsets(4, 4, first=8.0, step=4.0, image_h=32, image_w=32)
    plain = layer.votes(poses)  # (B, E, HWT, 16)
    added = layer.votes(poses, offsets)
    diff = (added - plain).reshape(2, 4, 4, 4, 3, 16)  # (B, E, H, W, T, 16)
    expected_rows = offsets[..., 0][None, None, :, :, None].expand(2, 4, 4, 4, 3)
    expected_cols = offsets[..., 1][None, None, :, :, None].expand(2, 4, 4, 4, 3)
    torch.testing.assert_close(diff[..., 0], expected_rows)
    torch.testing.assert_close(diff[..., 1], expected_cols)
    assert (diff[..., 2:] == 0).all()


def test_coordinate_offsets_are_receptive_field_centres():
    offsets = coordinate_offsets(4, 4, first=8.0, step=4.0, image_h=32, image_w=32)
    centres = torch.tensor([8.5, 12.5, 16.5, 20.5]) / 32
    torch.testing.assert_close(offsets[:, 0, 0], centres)
    torch.testing.assert_close(offsets[0, :, 1], centres)


def test_coordinate_addition_is_a_setting():
    torch.manual_seed(0)
    x = torch.rand(2, 1, 24, 24)
    on = models.build("em-capsnet-small", **TINY)
    off = models.build("em-capsnet-small", coordinate_addition=False, **TINY)
    off.load_state_dict(on.state_dict())
    assert not torch.allclose(on(x).poses, off(x).poses)


@pytest.mark.parametrize("name", ["em-capsnet", "em-capsnet-small", "smallnorb-cnn"])
def test_models_forward_shapes_and_defaults(name):
    model = models.build(name)  # MNIST shape by default
    out = model(torch.rand(2, 1, 28, 28))
    assert out.scores.shape == (2, 10) and out.reconstruction is None
    if name.startswith("em"):
        assert model.default_loss == "spread" and out.poses.shape == (2, 10, 16)
        assert ((out.scores > 0) & (out.scores < 1)).all()
    else:
        assert model.default_loss == "cross-entropy"


@pytest.mark.parametrize("iterations", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("fill", [0.0, 1.0, None])
def test_model_no_nan_for_extreme_images(iterations, fill):
    torch.manual_seed(iterations)
    model = models.build("em-capsnet-small", routing_iterations=iterations, **TINY)
    x = torch.rand(2, 1, 24, 24) if fill is None else torch.full((2, 1, 24, 24), fill)
    out = model(x)
    losses.spread_loss(out.scores, torch.tensor([0, 3]), 0.9).backward()
    assert torch.isfinite(out.scores).all() and torch.isfinite(out.poses).all()
    for p in model.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()


def test_stereo_smallnorb_shapes():
    model = models.build("em-capsnet-small", **{**TINY, "in_channels": 2})
    assert model(torch.rand(2, 2, 24, 24)).scores.shape == (2, 5)
    cnn = models.build("smallnorb-cnn", **SMALLNORB_STEREO)
    assert cnn(torch.rand(2, 2, 32, 32)).scores.shape == (2, 5)


def test_config_validation():
    with pytest.raises(Exception, match="pose"):
        models.build("em-capsnet", pose="quaternion")
    with pytest.raises(Exception, match="too small"):
        models.build("em-capsnet", input_size=12)


# ---- spread loss --------------------------------------------------------------------------


def test_spread_loss_hand_computed():
    a = torch.tensor([[0.2, 0.5, 0.9], [0.6, 0.1, 0.3]])
    target = torch.tensor([2, 0])
    # row 0 (m=0.5): max(0, 0.5-0.7)^2 + max(0, 0.5-0.4)^2 = 0.01
    # row 1 (m=0.5): max(0, 0.5-0.5)^2 + max(0, 0.5-0.3)^2 = 0.04
    assert losses.spread_loss(a, target, 0.5).item() == pytest.approx((0.01 + 0.04) / 2)
    # m=0.9: row 0: 0.2^2 + 0.5^2 = 0.29; row 1: 0.4^2 + 0.6^2 = 0.52
    assert losses.spread_loss(a, target, 0.9).item() == pytest.approx((0.29 + 0.52) / 2)


def test_spread_margin_schedules():
    linear = TrainConfig(spread_schedule="linear")
    assert spread_margin(linear, 0, 101) == pytest.approx(0.2)
    assert spread_margin(linear, 50, 101) == pytest.approx(0.55)
    assert spread_margin(linear, 100, 101) == pytest.approx(0.9)
    official = TrainConfig(spread_schedule="sigmoid")

    def sig(z):
        return 1.0 / (1.0 + math.exp(-z))

    assert spread_margin(official, 0, 10) == pytest.approx(0.2 + 0.79 * sig(-4))
    assert spread_margin(official, 200_000, 10) == pytest.approx(0.2 + 0.79 * 0.5)
    assert spread_margin(official, 10**9, 10) == pytest.approx(0.2 + 0.79 * sig(10))


# ---- training -----------------------------------------------------------------------------


def _smallnorb_like(n, seed=0):
    """n random stereo images in the prepared smallNORB format (uint8 (n, 2, 32, 32), 5 classes)."""
    from capsnet.data.datasets import TensorImageDataset

    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 2, 32, 32), generator=g, dtype=torch.uint8)
    return TensorImageDataset(images, torch.arange(n) % 5, "smallnorb-like")


def test_fit_trains_em_capsnet_with_spread_loss():
    from capsnet.train import fit

    torch.manual_seed(0)
    model = models.build("em-capsnet-small", A=8, B=4, C=4, D=4, **SMALLNORB_STEREO)
    config = TrainConfig(epochs=1, batch_size=8, lr=1e-2, device="cpu", progress=False)
    history = fit(model, _smallnorb_like(8), _smallnorb_like(4, seed=1), config)
    assert all(math.isfinite(r["train_loss"]) for r in history)
    assert 0.0 <= history[-1]["val_accuracy"] <= 1.0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_overfits_a_small_smallnorb_batch(seed):
    """Ten noise images are separated by the margin: the loss reaches zero and every image is
    classified right. With the official margin schedule the margin stays near 0.2 over these
    100 steps, a gap this model reaches (global routing, which splits a child's mass over the
    windows covering it, needs more than 60 of them for some seeds), so the run converges and
    ends at a minimum. A linear ramp to 0.9 outgrows the gap it can make (an unvoted class
    sits at sigmoid(lambda beta_a), about 0.5), the loss never settles and the end state
    depends on rounding (the CPU kernel)."""
    from capsnet.evaluate import accuracy
    from capsnet.train import fit

    data = _smallnorb_like(OVERFIT_IMAGES)
    torch.manual_seed(seed)
    model = models.build("em-capsnet-small", A=8, B=4, C=4, D=4, **SMALLNORB_STEREO)
    config = TrainConfig(
        epochs=OVERFIT_EPOCHS,
        batch_size=32,
        lr=3e-3,  # the smallNORB sweep's and final training's
        spread_schedule="sigmoid",
        device="cpu",
        progress=False,
    )
    history = fit(model, data, None, config)
    assert history[-1]["train_loss"] < 0.01
    assert accuracy(model, data, 32, "cpu")["accuracy"] == 1.0


def test_compiled_routing_keeps_an_inductor_cache_per_cpu_capability(monkeypatch):
    """Inductor's cache does not key CPU kernels on ATEN_CPU_CAPABILITY (kernels built for
    AVX-512 loaded under avx2 gave NaN): each setting gets its own directory, unless the
    user chose one."""
    import os

    from capsnet.em_compiled import compile_routing_function

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    compile_routing_function(torch.sigmoid)
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir() + "_avx2"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/chosen")
    compile_routing_function(torch.sigmoid)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/chosen"
