"""The fused, chunked routing in capsnet.nn.layers equals capsnet.nn.routing.dynamic_routing."""

from __future__ import annotations

import pytest
import torch

from capsnet import models
from capsnet.nn.layers import DenseCapsules, fused_dynamic_routing
from capsnet.nn.routing import dynamic_routing, squash

N_IN, D_IN, N_OUT, D_OUT = 72, 8, 10, 16


def _inputs(batch: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    u = squash(torch.randn(batch, N_IN, D_IN, generator=gen))  # (B, n_in, d_in)
    weight = 0.3 * torch.randn(
        N_IN, N_OUT, D_OUT, D_IN, generator=gen
    )  # (n_in, n_out, d_out, d_in)
    return u.requires_grad_(), weight.requires_grad_()


def _reference(u, weight, iterations, detach_inner):
    u_hat = torch.einsum("bik,ijdk->bijd", u, weight)  # (B, n_in, n_out, d_out)
    return dynamic_routing(u_hat, iterations, detach_inner)


@pytest.mark.parametrize("batch, chunk", [(1, 16), (5, 2), (19, 4)])
@pytest.mark.parametrize("iterations", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("detach_inner", [True, False])
def test_fused_routing_equals_reference_with_gradients(batch, chunk, iterations, detach_inner):
    u, weight = _inputs(batch, seed=batch * 10 + iterations)
    v_ref, c_ref = _reference(u, weight, iterations, detach_inner)
    v, c = fused_dynamic_routing(u, weight, iterations, detach_inner, chunk)
    assert v.shape == (batch, N_OUT, D_OUT) and c.shape == (batch, N_IN, N_OUT)
    torch.testing.assert_close(v, v_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c, c_ref, atol=1e-5, rtol=1e-5)

    probe_v = torch.randn_like(v_ref)  # (B, n_out, d_out)
    probe_c = torch.randn_like(c_ref)  # (B, n_in, n_out)
    loss_ref = (v_ref * probe_v).sum() + (c_ref * probe_c).sum() * (not detach_inner)
    loss = (v * probe_v).sum() + (c * probe_c).sum() * (not detach_inner)
    grads_ref = torch.autograd.grad(loss_ref, (u, weight))
    grads = torch.autograd.grad(loss, (u, weight))
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-5)


def test_coupling_has_no_gradient_with_detach_inner():
    u, weight = _inputs(3)
    _, c = fused_dynamic_routing(u, weight, 3, detach_inner=True)
    assert not c.requires_grad


def test_rejects_zero_iterations():
    u, weight = _inputs(2)
    with pytest.raises(ValueError, match="iterations"):
        fused_dynamic_routing(u, weight, 0)


def test_dense_capsules_fast_and_reference_paths_agree():
    layer = DenseCapsules(N_IN, D_IN, N_OUT, D_OUT, iterations=3)
    u, _ = _inputs(7)
    fast = layer(u)
    layer.chunk_size = 0
    slow = layer(u)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert layer.votes(u).shape == (7, N_IN, N_OUT, D_OUT)


def test_capsnet_forward_is_chunk_size_independent():
    torch.manual_seed(0)
    model = models.build("capsnet-small")
    x = torch.rand(6, 1, 28, 28)  # (B, C, H, W)
    outputs = []
    for chunk in (0, 1, 4, 16):
        model.classes.chunk_size = chunk
        outputs.append(model(x))
    for out in outputs[1:]:
        for a, b in zip(out, outputs[0]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_autocast_routing_casts_the_weight_once_with_the_same_values(monkeypatch):
    """Under bf16 autocast the routing casts W once per forward: outputs bit for bit those
    of casting it at every product, as autocast would; the weight's gradient, summed over
    the products in bf16 before its one cast back, agrees to bf16's precision."""
    from capsnet.nn import layers

    torch.manual_seed(0)
    u = torch.rand(6, 16, 8)  # (B, n_in, d_in)
    weight = torch.rand(16, 3, 4, 8) / 8  # (n_in, n_out, d_out, d_in)

    def run():
        w = weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            v, c = layers.fused_dynamic_routing(u, w, 3, True, 4)
        v.square().sum().backward()
        return v, c, w.grad

    cast_once = run()
    monkeypatch.setattr(layers, "_autocast_once", lambda w: w)
    cast_each_time = run()
    assert torch.equal(cast_once[0], cast_each_time[0])  # v (B, n_out, d_out)
    assert torch.equal(cast_once[1], cast_each_time[1])  # c (B, n_in, n_out)
    assert cast_once[0].dtype == cast_once[2].dtype == torch.float32  # squash, W's gradient
    torch.testing.assert_close(cast_once[2], cast_each_time[2], rtol=1e-2, atol=2e-3)
