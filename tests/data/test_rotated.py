"""Rotated MNIST (data/rotated-mnist.md) and the exact rotation behind it."""

from __future__ import annotations

import math

import pytest
import torch
from datahelpers import tiny_mnist

from capsnet.data import load, mnist, rotate_images
from capsnet.data.resample import sin_cos_degrees
from capsnet.io.errors import DataError


def test_rotation_by_0_and_360_is_identity():
    images, _ = tiny_mnist(10)
    assert torch.equal(rotate_images(images, 0), images)
    assert torch.equal(rotate_images(images, 360), images)
    assert torch.equal(rotate_images(images, -360), images)


def test_rotation_is_about_the_centre_and_deterministic():
    image = torch.zeros(1, 28, 28, dtype=torch.uint8)
    image[0, 4:8, 13:15] = 255  # a bar above the centre
    turned = rotate_images(image, 180)
    assert turned[0, 20:24, 13:15].float().mean() > 200  # now below the centre
    assert torch.equal(turned, rotate_images(image, 180))
    assert turned.shape == image.shape and turned.dtype == torch.uint8
    quarter = rotate_images(image, 90)  # counter-clockwise: the bar goes to the left
    assert quarter[0, 13:15, 4:8].float().mean() > 200


def test_quarter_turns_are_exact_pixel_moves():
    generator = torch.Generator().manual_seed(0)
    square = torch.randint(0, 256, (3, 2, 27, 27), generator=generator).to(torch.uint8)
    for k in (-3, -2, -1, 1, 2, 3, 4):
        assert torch.equal(rotate_images(square, 90 * k), torch.rot90(square, k, (-2, -1)))
    wide = torch.randint(0, 256, (3, 28, 30), generator=generator).to(torch.uint8)
    assert torch.equal(rotate_images(wide, 180), wide.flip(-2, -1))


def test_rotation_matches_scipy_bilinear_before_rounding(mnist_mirror):
    """scipy.ndimage.rotate (order 1, zeros outside, same canvas) is an independent bilinear
    rotation about the centre; ours is the same value rounded half up."""
    ndimage = pytest.importorskip("scipy.ndimage")
    images, _ = mnist.read_split(mnist_mirror / "mnist", "test")
    images = images[:20]
    for angle in (-165, -35, -15, 7.5, 35, 45, 100, 123.4):
        ours = rotate_images(images, angle).double().numpy()  # (20, 28, 28)
        for image, got in zip(images.double().numpy(), ours):
            exact = ndimage.rotate(image, angle, reshape=False, order=1, mode="grid-constant")
            assert abs(got - exact).max() <= 0.5 + 1e-6, angle


def test_sin_cos_degrees_is_accurate_and_exact_on_quarter_turns():
    quarter = {0: (0.0, 1.0), 90: (1.0, 0.0), 180: (0.0, -1.0), 270: (-1.0, 0.0)}
    for degrees in (-180, -90, 0, 90, 180, 270, 360, 720):
        assert sin_cos_degrees(degrees) == quarter[degrees % 360]
    for degrees in [d / 8 for d in range(-1440, 1441, 7)]:
        sin, cos = sin_cos_degrees(degrees)
        radians = math.radians(degrees)
        assert abs(sin - math.sin(radians)) < 4e-16 and abs(cos - math.cos(radians)) < 4e-16
    with pytest.raises(DataError, match="not a finite"):
        sin_cos_degrees(math.nan)


def test_rotation_refuses_float_images():
    with pytest.raises(DataError, match="uint8"):
        rotate_images(torch.zeros(1, 28, 28), 10)


def test_rotated_mnist_is_mnist_rotated_when_loaded(tiny_root):
    dataset = load("rotated-mnist", "test", tiny_root, angle=35, download=False)
    images, labels = mnist.read_split(tiny_root / "raw" / "mnist", "test")
    assert torch.equal(dataset.tensors[0][:, 0], rotate_images(images, 35))
    assert torch.equal(dataset.tensors[1], labels)
    assert dataset.name == "rotated-mnist-35"
    with pytest.raises(DataError, match="needs an angle"):
        load("rotated-mnist", "test", tiny_root, download=False)


def test_resampling_bytes_do_not_depend_on_the_batch_size():
    """resize and warp_about_centre work a few images at a time (for the CPU's caches):
    the bytes are those of one batch holding every image."""
    from capsnet.data.resample import resize, sin_cos_degrees, warp_about_centre

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (37, 2, 20, 20), dtype=torch.uint8, generator=generator)
    assert torch.equal(resize(images, 9), resize(images, 9, chunk=37))
    sin, cos = sin_cos_degrees(35.0)
    inverse = torch.tensor([[[cos, -sin], [sin, cos]]], dtype=torch.float64)  # (1, 2, 2)
    assert torch.equal(
        warp_about_centre(images, inverse, batch=5), warp_about_centre(images, inverse, batch=37)
    )
