"""MultiMNIST training as in the paper (section 6): each digit reconstructed from its own
true-label capsule and compared with its own image."""

from __future__ import annotations

import pytest
import torch

from capsnet import models
from capsnet.config import AugmentParams, ShiftAugment
from capsnet.config.training import TrainConfig
from capsnet.data.augment import random_shift
from capsnet.training.fit import augment, compute_loss
from capsnet.training.run import RunSpec, load_split, train_run


def _pair_batch():
    """Two 36x36 examples: each digit alone (2, 2, 1, 36, 36), their sum-clip merge, the
    labels (2, 2) and the multi-hot targets (2, 10)."""
    generator = torch.Generator().manual_seed(0)
    components = torch.zeros(2, 2, 1, 36, 36)
    components[:, 0, :, 4:24, 6:20] = torch.rand(2, 1, 20, 14, generator=generator)
    components[:, 1, :, 12:32, 14:30] = torch.rand(2, 1, 20, 16, generator=generator)
    images = components.sum(1).clamp(max=1.0)  # (2, 1, 36, 36)
    labels = torch.tensor([[3, 7], [1, 0]])
    targets = torch.zeros(2, 10).scatter_(1, labels, 1.0)  # (2, 10)
    return images, targets, components, labels


def test_loss_is_margin_plus_the_two_digit_reconstruction_errors_by_hand():
    torch.manual_seed(0)
    model = models.build("capsnet-small", input_size=36).eval()
    images, targets, components, labels = _pair_batch()
    config = TrainConfig()
    with torch.no_grad():
        output = model(images, labels)
        loss = compute_loss(model, output, images, targets, config, components=components)
        poses = model(images).poses  # (2, 10, 16)
        expected = 0.0
        for b in range(2):
            for k in range(10):
                length = float(poses[b, k].pow(2).sum().sqrt())
                if k in labels[b].tolist():
                    expected += max(0.0, 0.9 - length) ** 2 / 2
                else:
                    expected += 0.5 * max(0.0, length - 0.1) ** 2 / 2
            for i in range(2):
                masked = torch.zeros_like(poses[b : b + 1])  # (1, 10, 16)
                masked[0, labels[b, i]] = poses[b, labels[b, i]]
                image = torch.sigmoid(model.decoder.net(masked.flatten(1))).view(1, 36, 36)
                expected += 0.0005 * float((image - components[b, i]).pow(2).sum()) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    assert output.reconstruction.shape == (2, 2, 1, 36, 36)


def test_each_digit_is_decoded_from_its_own_capsule_and_gets_gradients():
    torch.manual_seed(0)
    model = models.build("capsnet-small", input_size=36)
    images, targets, components, labels = _pair_batch()
    output = model(images, labels)
    for i in range(2):
        alone = model(images, labels[:, i]).reconstruction  # (2, 1, 36, 36)
        torch.testing.assert_close(output.reconstruction[:, i], alone)
    compute_loss(model, output, images, targets, TrainConfig(), components=components).backward()
    assert all(p.grad is not None and p.grad.any() for p in model.decoder.parameters())


def test_components_with_a_single_reconstruction_are_refused():
    model = models.build("capsnet-small", input_size=36)
    images, targets, components, _ = _pair_batch()
    output = model(images)  # masked by the prediction: one reconstruction per example
    with pytest.raises(ValueError, match=r"reconstruction \(2, 1, 36, 36\) and images"):
        compute_loss(model, output, images, targets, TrainConfig(), components=components)


def test_a_batch_shift_moves_both_digits_with_their_merge():
    images, targets, components, labels = _pair_batch()
    config = TrainConfig(augment="shift", augment_params=AugmentParams(shift=ShiftAugment(3)))
    generator = torch.Generator().manual_seed(5)
    shifted, _, parts, out_labels = augment(
        (images, targets, components, labels), config, generator
    )
    alone = random_shift(images, 3, torch.Generator().manual_seed(5))  # (2, 1, 36, 36)
    assert torch.equal(shifted, alone) and not torch.equal(shifted, images)
    assert torch.equal(parts.sum(1).clamp(max=1.0), shifted)
    assert torch.equal(out_labels, labels)


@pytest.fixture
def spec(mnist_root):
    return RunSpec(
        model="capsnet-small",
        dataset="multimnist",
        train_size=48,
        val_size=16,
        augment="shift",
        train=TrainConfig(epochs=1, batch_size=16, progress=False),
        data_root=mnist_root,
    )


def test_one_epoch_of_capsnet_small_on_tiny_multimnist_uses_both_digits(spec, monkeypatch):
    import capsnet.training.fit

    split = load_split(spec)
    assert len(split.train) == 48 and len(split.val) == 16 and len(split.train[0]) == 4
    seen = []
    real = capsnet.training.fit.compute_loss

    def spy(model, output, images, targets, config, step, total, components=None):
        seen.append((tuple(output.reconstruction.shape), tuple(components.shape)))
        return real(model, output, images, targets, config, step, total, components)

    monkeypatch.setattr(capsnet.training.fit, "compute_loss", spy)
    result = train_run(spec, split)
    assert result.model.config.input_size == 36 and result.train_images == 48
    assert seen == [((16, 2, 1, 36, 36), (16, 2, 1, 36, 36))] * 3
    (record,) = result.history
    assert torch.isfinite(torch.tensor(record["train_loss"])) and record["train_loss"] > 0
    assert 0.0 <= record["val_accuracy"] <= 1.0


def test_models_without_a_decoder_get_plain_multimnist_items(spec):
    spec.overrides = {"decoder": False}
    assert len(load_split(spec).train[0]) == 2
    spec.model, spec.overrides = "lenet5", {}
    assert len(load_split(spec).train[0]) == 2


def test_figure_shows_each_predicted_and_each_true_digit_beside_the_input(tmp_path, monkeypatch):
    from capsnet.data.datasets import TensorImageDataset
    from capsnet.evaluation import plots as figures
    from capsnet.evaluation.figures import multimnist_figure

    torch.manual_seed(0)
    model = models.build("capsnet-small", input_size=36).eval()
    images, targets, _, labels = _pair_batch()
    data = TensorImageDataset((images * 255).round().to(torch.uint8), targets)
    drawn = {}
    real = figures.image_grid

    def spy(rows, path, **kwargs):
        drawn.update(rows=rows, **kwargs)
        return real(rows, path, **kwargs)

    monkeypatch.setattr(figures, "image_grid", spy)
    path = multimnist_figure(model, data, 2, tmp_path / "mm.png", "caps36", "cpu")
    assert path.is_file() and path.stat().st_size > 0
    assert drawn["row_labels"][0] == "input" and len(drawn["rows"]) == 6
    with torch.no_grad():
        x = data.tensors[0].float() / 255
        out = model(x)
        top2 = out.scores.topk(2, dim=1).indices  # (2, 2)
        torch.testing.assert_close(drawn["rows"][1], model.reconstruct(out.poses, top2[:, 0]))
        ascending = labels.sort(dim=1).values  # (2, 2)
        for i in range(2):
            expected = model.reconstruct(out.poses, ascending[:, i])  # (2, 1, 36, 36)
            torch.testing.assert_close(drawn["rows"][4 + i], expected)
    assert drawn["col_labels"][0].startswith("true 3,7")


def _tiny_multimnist(redraw: bool, components: bool = True):
    from capsnet.data.multimnist import MultiMNIST, make_recipe

    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(60) % 10
    images = torch.randint(0, 256, (60, 28, 28), dtype=torch.uint8, generator=generator)
    recipe = make_recipe(labels, 2, 4, 4, seed=0)
    return MultiMNIST(images, labels, recipe, redraw=redraw, components=components)


def test_render_batch_without_redraw_is_the_host_rendering_of_the_recipe():
    from capsnet.data.batches import as_renderable

    data = _tiny_multimnist(redraw=False)
    assert as_renderable(data) is data
    index = torch.tensor([3, 0, 17, 119])
    images, targets, parts, labels = data.render_batch(
        data.resident_tensors(), index, 0, torch.Generator()
    )
    expected = data.__getitems__(index.tolist())
    for i, (image, target, part, label) in enumerate(expected):
        assert torch.equal(images[i], image) and torch.equal(targets[i], target)
        assert torch.equal(parts[i], part) and torch.equal(labels[i], label)


def test_render_batch_with_redraw_pairs_each_digit_with_another_class():
    data = _tiny_multimnist(redraw=True, components=False)
    tensors = data.resident_tensors()
    index = torch.arange(len(data))
    first = data.render_batch(tensors, index, 0, torch.Generator().manual_seed(1))
    again = data.render_batch(tensors, index, 0, torch.Generator().manual_seed(1))
    other = data.render_batch(tensors, index, 0, torch.Generator().manual_seed(2))
    assert torch.equal(first[0], again[0]) and not torch.equal(first[0], other[0])
    assert torch.equal(first[1].sum(1), torch.full((len(data),), 2.0))  # two classes each
    recipe_classes = data.labels[data.recipe.pairs[:, 0]]  # (M,) the kept first digits
    assert bool(first[1][torch.arange(len(data)), recipe_classes].eq(1).all())
