"""Rotated MNIST test sets (SPEC 2.5)."""

from __future__ import annotations

import torch
from datahelpers import tiny_mnist

from capsnet.data import load, mnist, rotate_images, rotated


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


def test_prepared_sets_match_on_the_fly_rotation(tiny_root):
    mnist.prepare(tiny_root / "raw" / "mnist", tiny_root / "prepared" / "mnist")
    rotated.prepare(tiny_root, tiny_root / "prepared" / "rotated-mnist", [0, 35, -15])
    names = sorted(p.name for p in (tiny_root / "prepared" / "rotated-mnist").iterdir())
    assert names == ["angle_-15.pt", "angle_0.pt", "angle_35.pt"]
    prepared = load("rotated-mnist", "test", tiny_root, angle=35)
    images, _ = mnist.read_split(tiny_root / "raw" / "mnist", "test")
    assert torch.equal(prepared.tensors[0][:, 0], rotate_images(images, 35))
    assert prepared.name == "rotated-mnist-35"
