"""Rotated MNIST (data/rotated-mnist.md): MNIST digits rotated about the centre by a fixed angle,
bilinear, zero fill, same 28x28 canvas.

Nothing is stored: the set is rotated when loaded, by the one rotation every caller uses
(``capsnet.data.resample.rotate``, the same bytes on every CPU). The evaluation rotates its
test digits in memory the same way, at the angles params.yaml asks for.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from capsnet.data.resample import rotate


def load_tensors(
    split: str, angle: float, mnist_split: Callable
) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST ``split`` (images uint8 (N, 28, 28), labels (N,)) rotated by ``angle`` degrees."""
    images, labels = mnist_split(split)
    return rotate(images, angle), labels


def load_dataset(request):
    """The registry loader: MNIST ``request.split`` rotated by ``request.angle`` degrees."""
    from capsnet.data.tensors import TensorImageDataset
    from capsnet.io.errors import DataError

    if request.angle is None:
        raise DataError("rotated-mnist needs an angle")
    from capsnet.data import mnist

    images, labels = load_tensors(request.split, request.angle, mnist.split_loader(request))
    return TensorImageDataset(images, labels, f"rotated-mnist-{request.angle:g}")
