"""Augmentation strategies: one batched implementation per name, per-example draws from a
generator on the images' device, geometry checked against independent computations."""

from __future__ import annotations

import pytest
import torch
from datahelpers import tiny_mnist

from capsnet.config import AffineAugment, AugmentParams, ElasticAugment, RotateAugment
from capsnet.data import TensorImageDataset
from capsnet.data.augment import (
    STRATEGIES,
    AugmentedDataset,
    augment_batch,
    check_strategy,
    random_shift,
    warp,
)
from capsnet.io.errors import ConfigError


def digits(n: int = 8) -> torch.Tensor:
    images, _ = tiny_mnist(1)
    return images.repeat(n, 1, 1).unsqueeze(1).float() / 255.0  # (n, 1, 28, 28)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_keeps_shape_dtype_and_range(strategy):
    images = digits()
    out = augment_batch(images, strategy, AugmentParams(), torch.Generator().manual_seed(0))
    assert out.shape == images.shape and out.dtype == torch.float32
    assert 0 <= float(out.min()) and float(out.max()) <= 1 + 1e-6


@pytest.mark.parametrize("strategy", ["shift", "rotate", "affine", "elastic"])
def test_each_example_gets_its_own_draw_and_a_seed_repeats_them(strategy):
    images = digits()
    params = AugmentParams()

    def run(seed):
        return augment_batch(images, strategy, params, torch.Generator().manual_seed(seed))

    first = run(1)
    assert torch.equal(first, run(1)) and not torch.equal(first, run(2))
    assert len({tuple(x.flatten().tolist()) for x in first}) > 1  # per example, not per batch


def test_rotate_by_a_quarter_turn_is_rot90():
    """About the centre with pixel centres on pixel centres: exact up to interpolation."""
    images = torch.rand(2, 1, 6, 6)
    quarter = torch.tensor([[0.0, 1.0], [-1.0, 0.0]]).expand(2, 2, 2)  # +90 degrees
    turned = warp(images, quarter, torch.zeros(2, 2))
    expected = [torch.rot90(images, k, (2, 3)) for k in (1, -1)]
    assert any(torch.allclose(turned, e, atol=1e-5) for e in expected)


def test_neutral_settings_leave_images_unchanged():
    images = digits(4)
    generator = torch.Generator().manual_seed(0)
    neutral = AugmentParams(
        rotate=RotateAugment(degrees=0.0),
        affine=AffineAugment(degrees=0, shear_degrees=0, scale=(1.0, 1.0), translate_pixels=0),
        elastic=ElasticAugment(alpha=0.0),
    )
    for strategy in ("none", "rotate", "affine", "elastic"):
        out = augment_batch(images, strategy, neutral, generator)
        torch.testing.assert_close(out, images, atol=1e-5, rtol=0)


def test_affine_translation_alone_is_an_integer_shift_of_at_most_the_setting():
    images = digits(16)
    params = AugmentParams(
        affine=AffineAugment(degrees=0, shear_degrees=0, scale=(1.0, 1.0), translate_pixels=2)
    )
    out = augment_batch(images, "affine", params, torch.Generator().manual_seed(3))
    candidates = [
        torch.roll(torch.nn.functional.pad(images, (2,) * 4), (dy, dx), (2, 3))[..., 2:-2, 2:-2]
        for dy in range(-2, 3)
        for dx in range(-2, 3)
    ]
    for i in range(16):
        assert any(torch.allclose(out[i], c[i], atol=1e-5) for c in candidates), i


def test_random_shift_moves_content_within_bounds_and_keeps_ink():
    images = torch.zeros(50, 1, 10, 10)
    images[:, :, 4:6, 4:6] = 1.0
    shifted = random_shift(images, 2, torch.Generator().manual_seed(0))
    assert torch.equal(shifted.sum(dim=(1, 2, 3)), images.sum(dim=(1, 2, 3)))
    rows = shifted[:, 0].sum(dim=2).argmax(dim=1)
    assert rows.min() >= 2 and rows.max() <= 6 and len(set(rows.tolist())) > 1


def test_augmented_dataset_items_are_the_batched_implementation_on_one_image():
    images, labels = tiny_mnist(1)
    base = TensorImageDataset(images.repeat(4, 1, 1), labels.repeat(4), "copies")
    data = AugmentedDataset(base, "rotate", AugmentParams(), seed=0)
    expected_generator = torch.Generator().manual_seed(data.generator.initial_seed())
    image, label = data[0]
    expected = augment_batch(base[0][0][None], "rotate", AugmentParams(), expected_generator)[0]
    assert torch.equal(image, expected) and label == int(labels[0])
    data.set_epoch(1)
    assert not torch.equal(data[0][0], image)  # epochs draw differently


def test_unknown_strategy_refused():
    with pytest.raises(ConfigError, match=r"augment\.strategy 'blur' unknown"):
        check_strategy("blur")
    with pytest.raises(ConfigError, match=r"augment\.strategy 'blur' unknown"):
        augment_batch(digits(1), "blur", None, torch.Generator())


def test_the_training_path_imports_no_albumentations():
    import subprocess
    import sys

    code = (
        "import sys, capsnet.training.fit, capsnet.data.augment, capsnet.training.run; "
        "print('albumentations' in sys.modules, 'cv2' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["False", "False"], done.stderr
