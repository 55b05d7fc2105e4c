import pytest
import torch

from capsnet import models
from capsnet.io.errors import ConfigError
from capsnet.nn.layers import PrimaryCapsules
from capsnet.nn.routing import squash

# Models small enough for per-model gradient checks on a CPU.
QUICK_OVERRIDES = {
    "baseline-cnn": {"channels": (8, 8, 4), "hidden": (16, 8)},
    "em-capsnet": {"A": 16, "B": 8, "C": 8, "D": 8},  # full size: tests/test_em.py
}


def test_registry_lists_required_models():
    assert {"capsnet", "capsnet-small", "lenet5", "baseline-cnn"} <= set(models.names())


def test_paper_parameter_counts():
    assert models.count_parameters(models.build("capsnet")) == 8_215_568
    assert models.count_parameters(models.build("capsnet", decoder=False)) == 6_804_224
    assert models.count_parameters(models.build("baseline-cnn")) == 35_445_522
    assert models.count_parameters(models.build("lenet5")) == 61_706


def test_capsnet_small_is_much_smaller_with_same_structure():
    small = models.build("capsnet-small")
    assert models.count_parameters(small) < models.count_parameters(models.build("capsnet")) / 4
    assert small.config.num_primary == 8 * 6 * 6


def _example_input(model):
    cfg = model.config
    return torch.rand(3, cfg.in_channels, cfg.input_size, cfg.input_size)


@pytest.mark.parametrize("name", models.names())
def test_output_shapes_and_every_parameter_gets_a_gradient(name):
    torch.manual_seed(0)
    model = models.build(name, **QUICK_OVERRIDES.get(name, {}))
    x = _example_input(model)
    target = torch.tensor([0, 1, 2])
    out = model(x, target)
    classes = model.config.num_classes
    assert out.scores.shape == (3, classes)
    if out.poses is not None:
        assert out.poses.shape[:2] == (3, classes)
    if out.reconstruction is not None:
        assert out.reconstruction.shape == x.shape
    loss = out.scores.pow(2).sum()
    if out.reconstruction is not None:
        loss = loss + out.reconstruction.sum()
    loss.backward()
    without_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert without_grad == []


@pytest.mark.parametrize("name", models.names())
def test_no_nan_for_all_zero_image(name):
    model = models.build(name, **QUICK_OVERRIDES.get(name, {}))
    x = torch.zeros_like(_example_input(model)).requires_grad_(True)
    out = model(x)
    assert torch.isfinite(out.scores).all()
    out.scores.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_primary_capsules_group_the_channels_of_one_type_at_one_position():
    torch.manual_seed(0)
    layer = PrimaryCapsules(in_channels=4, caps_types=3, caps_dim=5, kernel=3, stride=2)
    x = torch.randn(2, 4, 9, 9)
    caps = layer(x)  # (2, 3*4*4, 5)
    conv = layer.conv(x)  # (2, 15, 4, 4)
    grid = conv.shape[-1]
    for t, y, xx in [(0, 0, 0), (1, 2, 3), (2, 3, 1)]:
        index = t * grid * grid + y * grid + xx
        expected = squash(conv[:, t * 5 : (t + 1) * 5, y, xx])
        torch.testing.assert_close(caps[:, index], expected)


def test_votes_are_w_times_u_for_each_pair():
    torch.manual_seed(0)
    model = models.build("capsnet-small")
    layer = model.classes
    u = torch.randn(2, layer.weight.shape[0], layer.weight.shape[3])
    votes = layer.votes(u)  # (2, n_in, n_out, d_out)
    for i, j in [(0, 0), (17, 3), (287, 9)]:
        torch.testing.assert_close(votes[:, i, j], u[:, i] @ layer.weight[i, j].T)


def test_decoder_masks_by_target_in_training_and_by_prediction_otherwise():
    torch.manual_seed(0)
    model = models.build("capsnet-small").eval()
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        predicted = model(x)
        wrong = (predicted.scores.argmax(1) + 1) % 10
        masked_by_target = model(x, wrong)
        again = model(x, predicted.scores.argmax(1))
    assert not torch.allclose(predicted.reconstruction, masked_by_target.reconstruction)
    torch.testing.assert_close(predicted.reconstruction, again.reconstruction)


def test_capsnet_accepts_other_input_sizes_and_channels():
    model = models.build("capsnet-small", in_channels=2, input_size=32, num_classes=5)
    out = model(torch.rand(2, 2, 32, 32))
    assert out.scores.shape == (2, 5)
    assert out.reconstruction.shape == (2, 2, 32, 32)


def test_unknown_model_and_unknown_override_are_config_errors():
    with pytest.raises(ConfigError, match="unknown model 'capsnett'"):
        models.build("capsnett")
    with pytest.raises(ConfigError, match="no config field"):
        models.build("lenet5", routing_iterations=3)
    with pytest.raises(ConfigError, match="routing_iterations must be >= 1"):
        models.build("capsnet", routing_iterations=0)


def test_routing_iterations_is_a_config_field():
    model = models.build("capsnet-small", routing_iterations=5)
    assert model.config.routing_iterations == 5
    assert model.classes.iterations == 5


def test_reconstruct_decodes_one_image_per_label_column():
    torch.manual_seed(0)
    model = models.build("capsnet-small").eval()
    with torch.no_grad():
        poses = model(torch.rand(3, 1, 28, 28)).poses  # (3, 10, 16)
        labels = torch.tensor([[1, 4], [0, 9], [7, 2]])
        both = model.reconstruct(poses, labels)  # (3, 2, 1, 28, 28)
        assert both.shape == (3, 2, 1, 28, 28)
        for i in range(2):
            torch.testing.assert_close(both[:, i], model.decoder(poses, labels[:, i]))
        torch.testing.assert_close(model.reconstruct(poses, labels[:, 0]), both[:, 0])
    with pytest.raises(ValueError, match="no decoder"):
        models.build("capsnet-small", decoder=False).reconstruct(poses, labels)


def test_a_model_is_its_module_alone(tmp_path, monkeypatch):
    """A module dropped into capsnet/models/ registers its model: no list names it."""
    import sys

    import capsnet.models as package

    (tmp_path / "toymodels.py").write_text(
        "from dataclasses import dataclass\n"
        "from torch import nn\n"
        "from capsnet.models import register\n\n"
        "@dataclass(frozen=True)\n"
        "class ToyConfig:\n"
        "    input_size: int = 28\n\n"
        "@register('toy-net', ToyConfig, 'a toy', capsules=False, family='toy')\n"
        "class ToyNet(nn.Module):\n"
        "    def __init__(self, config):\n"
        "        super().__init__()\n"
        "        self.config = config\n"
    )
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.delitem(package._REGISTRY, "toy-net", raising=False)
    try:
        assert "toy-net" in package.names()
        assert package.registered("toy-net").family == "toy"
    finally:
        package._REGISTRY.pop("toy-net", None)
        sys.modules.pop("capsnet.models.toymodels", None)
