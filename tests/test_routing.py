import pytest
import torch

from capsnet.nn.routing import dynamic_routing, safe_norm, squash


def loop_routing(u_hat: torch.Tensor, iterations: int, detach_inner: bool = True):
    """Slow, readable reference: explicit loops over examples, children and parents."""
    batch, n_in, n_out, _ = u_hat.shape
    vs, cs = [], []
    for b in range(batch):
        logits = [[torch.zeros(()) for _ in range(n_out)] for _ in range(n_in)]
        for it in range(iterations):
            last = it == iterations - 1
            votes = u_hat[b] if (last or not detach_inner) else u_hat[b].detach()
            coupling = []
            for i in range(n_in):
                row = torch.stack(logits[i])
                coupling.append(torch.exp(row) / torch.exp(row).sum())
            parents = []
            for j in range(n_out):
                s = sum(coupling[i][j] * votes[i, j] for i in range(n_in))
                norm2 = (s * s).sum()
                parents.append(norm2 / (1 + norm2) * s / torch.sqrt(norm2 + 1e-8))
            if not last:
                for i in range(n_in):
                    for j in range(n_out):
                        logits[i][j] = logits[i][j] + (votes[i, j] * parents[j]).sum()
        vs.append(torch.stack(parents))
        cs.append(torch.stack(coupling))
    return torch.stack(vs), torch.stack(cs)


@pytest.mark.parametrize("iterations", [1, 2, 3, 5])
def test_coupling_sums_to_one_over_parents_and_lengths_below_one(iterations):
    torch.manual_seed(0)
    u_hat = torch.randn(4, 30, 10, 16)
    v, c = dynamic_routing(u_hat, iterations)
    assert v.shape == (4, 10, 16)
    assert c.shape == (4, 30, 10)
    torch.testing.assert_close(c.sum(dim=2), torch.ones(4, 30))
    assert (v.norm(dim=-1) < 1).all()


def test_one_iteration_equals_uniform_coupling():
    torch.manual_seed(1)
    u_hat = torch.randn(3, 20, 5, 8)
    v, c = dynamic_routing(u_hat, 1)
    expected = squash(u_hat.sum(dim=1) / 5)  # c_ij = 1 / n_out for every child
    torch.testing.assert_close(v, expected)
    torch.testing.assert_close(c, torch.full((3, 20, 5), 0.2))


@pytest.mark.parametrize("iterations", [1, 3, 4])
@pytest.mark.parametrize("detach_inner", [True, False])
def test_fast_routing_matches_loop_reference_values_and_gradients(iterations, detach_inner):
    torch.manual_seed(2)
    u_hat = torch.randn(2, 6, 3, 4, dtype=torch.float64)
    fast_in = u_hat.clone().float().requires_grad_(True)
    slow_in = u_hat.clone().float().requires_grad_(True)
    v_fast, c_fast = dynamic_routing(fast_in, iterations, detach_inner)
    v_slow, c_slow = loop_routing(slow_in, iterations, detach_inner)
    torch.testing.assert_close(v_fast, v_slow, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c_fast, c_slow, rtol=1e-5, atol=1e-6)
    weights = torch.randn_like(v_fast)
    (v_fast * weights).sum().backward()
    (v_slow * weights).sum().backward()
    torch.testing.assert_close(fast_in.grad, slow_in.grad, rtol=1e-4, atol=1e-6)


def test_detach_inner_changes_gradients_only_beyond_one_iteration():
    torch.manual_seed(3)
    u_hat = torch.randn(2, 8, 4, 6)
    grads = {}
    for detach in (True, False):
        x = u_hat.clone().requires_grad_(True)
        v, _ = dynamic_routing(x, 3, detach)
        v.pow(2).sum().backward()
        grads[detach] = x.grad
    assert not torch.allclose(grads[True], grads[False])


def test_routing_logits_are_per_example():
    torch.manual_seed(4)
    u_hat = torch.randn(5, 12, 4, 6)
    v_batch, _ = dynamic_routing(u_hat, 3)
    v_single = torch.cat([dynamic_routing(u_hat[i : i + 1], 3)[0] for i in range(5)])
    torch.testing.assert_close(v_batch, v_single)


def test_squash_length_and_direction():
    s = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]])
    out = squash(s)
    torch.testing.assert_close(out[0].norm(), torch.tensor(25 / 26), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[0] / out[0].norm(), torch.tensor([0.6, 0.8]))
    assert torch.equal(out[1], torch.zeros(2))


def test_squash_and_norm_gradients_finite_at_zero():
    s = torch.zeros(2, 5, requires_grad=True)
    (squash(s).sum() + safe_norm(s).sum()).backward()
    assert torch.isfinite(s.grad).all()


def test_squash_is_fp32_under_bf16_input():
    s = torch.randn(4, 16).bfloat16()
    assert squash(s).dtype == torch.float32
    assert safe_norm(s).dtype == torch.float32


def test_zero_iterations_rejected():
    with pytest.raises(ValueError, match="iterations"):
        dynamic_routing(torch.randn(1, 2, 2, 2), 0)


@pytest.mark.parametrize("amp", [False, True])
def test_fused_dynamic_routing_compiles_without_a_graph_break(amp, monkeypatch):
    """The compiled training step traces the routing whole (``fullgraph``), with bf16
    autocast on or off. It never asks ``torch.amp.is_autocast_available``, which Dynamo
    cannot trace in torch 2.11 (the graph split there on every step on an H200)."""
    from capsnet.nn.layers import fused_dynamic_routing

    def untraceable(device_type):
        raise AssertionError(f"is_autocast_available({device_type!r}) called in a forward")

    monkeypatch.setattr(torch.amp, "is_autocast_available", untraceable)
    torch._dynamo.reset()
    u = torch.randn(4, 32, 8)  # (B, I, K)
    weight = torch.randn(32, 10, 16, 8, requires_grad=True)  # (I, J, D, K)
    routed = torch.compile(
        lambda u, w: fused_dynamic_routing(u, w, 3), fullgraph=True, backend="eager"
    )
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        v, c = routed(u, weight)
        eager_v, _ = fused_dynamic_routing(u, weight, 3)
    assert v.shape == (4, 10, 16) and c.shape == (4, 32, 10)
    torch.testing.assert_close(v, eager_v)
    v.sum().backward()
    assert weight.grad is not None and weight.grad.dtype == torch.float32
