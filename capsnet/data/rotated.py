"""Rotated MNIST test sets (SPEC 2.5): each test digit rotated about its centre by a fixed
angle, bilinear, zero fill, same 28x28 canvas; deterministic."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from capsnet.data.resample import rotate as rotate_images


def filename(angle: float) -> str:
    return f"angle_{float(angle):g}.pt"


def prepare(root: str | os.PathLike, out_dir: str | os.PathLike, angles: Iterable[float]) -> Path:
    """Write ``out_dir/angle_<a>.pt`` for every angle of the MNIST test split under ``root``."""
    from capsnet.data import mnist
    from capsnet.data.store import atomic_directory, save_prepared

    images, labels = mnist.load_tensors(root, "test", download_missing=False)
    with atomic_directory(out_dir) as tmp:
        for angle in sorted({float(a) for a in angles}):
            save_prepared(
                tmp / filename(angle),
                {"images": rotate_images(images, angle), "labels": labels},
                dataset="rotated-mnist",
                split="test",
                angle=angle,
                count=int(labels.shape[0]),
            )
    return Path(out_dir)


def load_tensors(
    root: str | os.PathLike, split: str, angle: float, mnist_split: Callable
) -> tuple[torch.Tensor, torch.Tensor]:
    """The prepared rotated test set when present, else MNIST ``split`` rotated now."""
    from capsnet.data.store import load_prepared

    prepared = Path(root) / "prepared" / "rotated-mnist" / filename(angle)
    if split == "test" and prepared.is_file():
        tensors, _ = load_prepared(prepared)
        return tensors["images"], tensors["labels"]
    images, labels = mnist_split(split)
    return rotate_images(images, angle), labels
