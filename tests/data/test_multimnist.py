"""MultiMNIST: recipe properties, vectorised rendering, determinism, overlap on real MNIST."""

from __future__ import annotations

import pytest
import torch
from datahelpers import tiny_mnist

from capsnet.data import load, multimnist
from capsnet.io.errors import DataError


@pytest.fixture
def digits():
    return tiny_mnist(200)


def test_pairs_are_of_different_classes_and_shifts_in_bounds(digits):
    _, labels = digits
    recipe = multimnist.make_recipe(labels, pairs_per_digit=5, shift=3, pad=4, seed=0)
    assert len(recipe) == 1000
    assert (labels[recipe.pairs[:, 0]] != labels[recipe.pairs[:, 1]]).all()
    assert torch.equal(recipe.pairs[:, 0], torch.arange(200).repeat_interleave(5))
    assert recipe.shifts.min() >= -3 and recipe.shifts.max() <= 3
    assert set(recipe.shifts.unique().tolist()) == set(range(-3, 4))


def test_rendering_is_bit_for_bit_deterministic(digits):
    images, labels = digits
    a = multimnist.make_recipe(labels, 2, 4, 4, seed=7)
    b = multimnist.make_recipe(labels, 2, 4, 4, seed=7)
    c = multimnist.make_recipe(labels, 2, 4, 4, seed=8)
    assert torch.equal(a.pairs, b.pairs) and torch.equal(a.shifts, b.shifts)
    assert not torch.equal(a.pairs, c.pairs)
    x1, t1 = multimnist.render(images, labels, a, slice(None))
    x2, t2 = multimnist.render(images, labels, b, slice(None))
    assert torch.equal(x1, x2) and torch.equal(t1, t2)


def test_render_places_each_digit_at_its_shift(digits):
    images, labels = digits
    pairs = torch.tensor([[0, 1]])
    shifts = torch.tensor([[2, -3, -1, 4]])  # (dy_a, dx_a, dy_b, dx_b)
    recipe = multimnist.Recipe(pairs, shifts, shift=4, pad=4, seed=0)
    out, target = multimnist.render(images, labels, recipe, slice(None), "max")
    assert out.shape == (1, 1, 36, 36) and out.dtype == torch.uint8
    expected = torch.zeros(36, 36, dtype=torch.uint8)
    for digit, (dy, dx) in ((0, (2, -3)), (1, (-1, 4))):
        placed = torch.zeros(36, 36, dtype=torch.uint8)
        placed[4 + dy : 32 + dy, 4 + dx : 32 + dx] = images[digit]
        expected = torch.maximum(expected, placed)
    assert torch.equal(out[0, 0], expected)
    assert target[0].nonzero().flatten().tolist() == sorted(labels[[0, 1]].tolist())


def test_merge_rules(digits):
    images, labels = digits
    images = images.clone()
    images[0], images[1] = 200, 100
    recipe = multimnist.Recipe(torch.tensor([[0, 1]]), torch.zeros(1, 4, dtype=torch.long), 0, 0, 0)
    summed, _ = multimnist.render(images, labels, recipe, slice(None), "sum-clip")
    maxed, _ = multimnist.render(images, labels, recipe, slice(None), "max")
    assert int(summed.max()) == 255 and int(maxed.max()) == 200


def test_dataset_batches_equal_single_items_and_targets_are_multi_hot(digits):
    images, labels = digits
    recipe = multimnist.make_recipe(labels, 1, 4, 4, seed=0)
    data = multimnist.MultiMNIST(images, labels, recipe)
    batch = data.__getitems__([3, 17, 42])
    for i, (image, target) in zip((3, 17, 42), batch):
        single_image, single_target = data[i]
        assert torch.equal(image, single_image) and torch.equal(target, single_target)
        assert image.shape == (1, 36, 36) and 0 <= image.min() and image.max() <= 1
        assert target.shape == (10,) and target.sum() == 2


def test_training_recipe_redrawn_per_epoch(digits):
    images, labels = digits
    data = multimnist.MultiMNIST(
        images, labels, multimnist.make_recipe(labels, 1, 4, 4, 0), redraw=True
    )
    data.set_epoch(0)
    first = data.recipe.pairs.clone()
    data.set_epoch(1)
    assert not torch.equal(first, data.recipe.pairs)
    data.set_epoch(0)
    assert torch.equal(first, data.recipe.pairs)


def test_negative_shift_refused(digits):
    _, labels = digits
    with pytest.raises(DataError, match="multimnist: shift must be >= 0, got -1"):
        multimnist.make_recipe(labels, 1, -1, 4, 0)


def test_build_writes_recipes_and_load_uses_them(tiny_root):
    from capsnet.data import mnist

    mnist.prepare(tiny_root / "raw" / "mnist", tiny_root / "prepared" / "mnist")
    multimnist.build(
        tiny_root,
        tiny_root / "prepared" / "multimnist",
        seed=3,
        shift=2,
        pad=3,
        merge="max",
        train_pairs_per_digit=2,
        test_pairs_per_digit=1,
    )
    train = load("multimnist", "train", tiny_root)
    test = load("multimnist", "test", tiny_root)
    assert len(train) == 120 and len(test) == 40
    assert train.recipe.shift == 2 and train.merge == "max" and train.redraw and not test.redraw
    image, target = test[0]
    assert image.shape == (1, 34, 34) and target.sum() == 2
    materialized = test.materialize()
    assert torch.equal(materialized.tensors[0][0].float() / 255, image)


def test_mean_bounding_box_overlap_on_real_mnist(mnist_root):
    """Sabour et al. 2017 (6): about 80% bounding-box overlap with the paper's shift of 4 px."""
    data = load("multimnist", "test", mnist_root, download=False)
    overlap = multimnist.bounding_box_overlap(data.images, data.recipe, slice(0, 5000))
    assert 0.65 < float(overlap.mean()) < 0.9
    labels = data.labels[data.recipe.pairs]
    assert (labels[:, 0] != labels[:, 1]).all()


@pytest.mark.parametrize("merge", ["sum-clip", "max"])
def test_components_merge_to_the_same_image_bitwise(tiny_root, merge):
    plain = load("multimnist", "train", tiny_root, download=False, merge=merge)
    parts = load("multimnist", "train", tiny_root, download=False, merge=merge, components=True)
    assert not plain.components and parts.components
    indices = list(range(len(parts)))
    for (image, target), item in zip(plain.__getitems__(indices), parts.__getitems__(indices)):
        merged, multi_hot, components, labels = item
        assert merged.shape == (1, 36, 36) and multi_hot.shape == (10,)
        assert components.shape == (2, 1, 36, 36) and components.dtype == torch.float32
        assert labels.shape == (2,) and labels.dtype == torch.long
        assert torch.equal(merged, image) and torch.equal(multi_hot, target)
        ink = (components * 255).round().to(torch.uint8)  # (2, 1, 36, 36), exact
        assert torch.equal(ink.float() / 255, components)
        expected = ink.amax(0) if merge == "max" else (ink[0].int() + ink[1]).clamp(max=255)
        assert torch.equal(expected.float() / 255, image)
        assert (components > 0).flatten(1).any(1).all()  # each digit has ink of its own
    assert len(parts[0]) == 4 and torch.equal(parts[0][0], plain[0][0])


def test_component_labels_are_the_two_distinct_classes_in_recipe_order(tiny_root):
    from capsnet.data import mnist

    data = load("multimnist", "test", tiny_root, download=False, components=True)
    _, source_labels = mnist.load_tensors(tiny_root, "test", download_missing=False)
    for i in range(len(data)):
        _, target, _, labels = data[i]
        assert labels[0] != labels[1]
        assert torch.equal(labels, source_labels[data.recipe.pairs[i]])
        assert target.nonzero().flatten().tolist() == sorted(labels.tolist())
    first = data.recipe.pairs[0, 0]
    dy, dx = data.recipe.shifts[0, :2].tolist()
    placed = torch.zeros(36, 36, dtype=torch.uint8)
    images, _ = mnist.load_tensors(tiny_root, "test", download_missing=False)
    placed[4 + dy : 32 + dy, 4 + dx : 32 + dx] = images[first]
    assert torch.equal(data[0][2][0, 0], placed.float() / 255)


def test_a_loader_batches_components_and_labels(tiny_root):
    data = load("multimnist", "train", tiny_root, download=False, components=True)
    images, targets, components, labels = next(iter(torch.utils.data.DataLoader(data, 8)))
    assert images.shape == (8, 1, 36, 36) and targets.shape == (8, 10)
    assert components.shape == (8, 2, 1, 36, 36) and labels.shape == (8, 2)
    assert torch.equal(targets.sum(1), torch.full((8,), 2.0))
