"""Device correctness without a GPU: models, losses, routing and the training step with
model and inputs on the meta device. A tensor made without ``device=`` lands on the CPU, and
the op mixing it with a meta tensor fails, so each test finds what would fail on CUDA."""

from __future__ import annotations

import pytest
import torch

from capsnet import models
from capsnet.data.batches import as_renderable, to_device
from capsnet.data.datasets import TensorImageDataset
from capsnet.nn.layers import fused_dynamic_routing
from capsnet.nn.routing import dynamic_routing, safe_norm, squash
from capsnet.training.fit import TrainConfig, _optimiser, augment, compute_loss, train_step

META = torch.device("meta")
CONFIG = TrainConfig(progress=False, amp="fp32")


def meta_model(name: str, **overrides) -> torch.nn.Module:
    """Model ``name`` built on the CPU (as training does) and moved to the meta device."""
    return models.build(name, **overrides).to(META)


def meta_batch(model, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    config = model.config
    channels = getattr(config, "in_channels", 1)
    images = torch.rand(batch, channels, config.input_size, config.input_size, device=META)
    targets = torch.randint(0, config.num_classes, (batch,), device=META)  # (B,)
    return images, targets


@pytest.mark.parametrize("name", models.names())
def test_forward_loss_and_backward_run_on_the_meta_device(name):
    model = meta_model(name)
    images, targets = meta_batch(model)
    output = model(images, targets)
    assert output.scores.device == META and output.scores.shape == (3, model.config.num_classes)
    loss = compute_loss(model, output, images, targets, CONFIG)
    assert loss.device == META and loss.dim() == 0
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing
    assert all(p.grad.device == META for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad():
        assert model(images).scores.device == META  # masked by the prediction


@pytest.mark.parametrize("name", models.names())
def test_the_training_step_of_fit_runs_on_the_meta_device(name):
    """What fit runs per batch: render from resident tensors, augment (none: the draws
    need a device generator, which meta has not), one optimisation step."""
    model = meta_model(name)
    config = model.config
    channels = getattr(config, "in_channels", 1)
    size = config.input_size
    data = TensorImageDataset(
        torch.zeros(6, channels, size, size, dtype=torch.uint8), torch.arange(6) % 2, name
    )
    source = as_renderable(data)
    tensors = to_device(source.resident_tensors(), META)
    index = torch.arange(4, device=META)  # (B,)
    batch = augment(source.render_batch(tensors, index, 0, None), CONFIG, None)
    optimizer, scheduler = _optimiser(model, CONFIG, _state())
    loss, correct = train_step(model, batch, optimizer, scheduler, CONFIG, 0, 1)
    assert loss.device == META and correct.device == META
    assert all(p.device == META for p in model.parameters())
    state = optimizer.state[next(iter(model.parameters()))]
    assert state["exp_avg"].device == META


def _state():
    from capsnet.training.fit import TrainState

    return TrainState()


def test_multimnist_renders_a_batch_with_its_digits_on_the_meta_device():
    from capsnet.data.multimnist import MultiMNIST, make_recipe

    labels = torch.arange(20) % 10
    images = torch.zeros(20, 28, 28, dtype=torch.uint8)
    recipe = make_recipe(labels, 1, 2, 4, seed=0)
    data = MultiMNIST(images, labels, recipe, redraw=False, components=True)
    tensors = to_device(as_renderable(data).resident_tensors(), META)
    rendered = data.render_batch(tensors, torch.arange(5, device=META), 0, None)
    shapes = [tuple(t.shape) for t in rendered]
    assert shapes == [(5, 1, 36, 36), (5, 10), (5, 2, 1, 36, 36), (5, 2)]
    assert all(t.device == META for t in rendered)
    model = meta_model("capsnet-small", input_size=36)
    optimizer, scheduler = _optimiser(model, CONFIG, _state())
    loss, _ = train_step(model, rendered, optimizer, scheduler, CONFIG)
    assert loss.device == META


@pytest.mark.parametrize("detach_inner", [True, False])
def test_dynamic_routing_functions_run_on_the_meta_device(detach_inner):
    u = torch.rand(4, 12, 8, device=META, requires_grad=True)  # (B, n_in, d_in)
    weight = torch.rand(12, 3, 16, 8, device=META, requires_grad=True)  # (n_in, n_out, d_out, d_in)
    for chunk in (1, 4):
        v, c = fused_dynamic_routing(u, weight, 3, detach_inner, chunk)
        assert v.shape == (4, 3, 16) and c.shape == (4, 12, 3) and v.device == META
        safe_norm(v).sum().backward()
    u_hat = torch.einsum("bik,ijdk->bijd", u, weight)  # (B, n_in, n_out, d_out)
    v, c = dynamic_routing(u_hat, 3, detach_inner)
    assert v.device == c.device == META
    (squash(v).sum() + c.sum()).backward()
    assert u.grad.device == META and weight.grad.device == META
