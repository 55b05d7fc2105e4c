"""``load(name, split, root)``: any declared dataset (``capsnet.config.dataset_specs``)."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.utils.data import Dataset

from capsnet.config.data import DATA_ROOT, DataParams
from capsnet.config.dataset_specs import DATASETS, get
from capsnet.data.registry import resolve
from capsnet.data.tensors import LoadRequest, Slice, TensorImageDataset, shape_of, split_tail
from capsnet.io.errors import DataError

__all__ = [
    "DATASETS", "DEFAULT_ROOT", "Slice", "TensorImageDataset", "load", "rotate_images",
    "shape_of", "split_tail",
]  # fmt: skip

DEFAULT_ROOT = Path(DATA_ROOT)


def rotate_images(images: torch.Tensor, angle: float) -> torch.Tensor:
    """Rotate each image about its centre by ``angle`` degrees (counter-clockwise),
    bilinear, zero fill, same canvas, the same bytes on every CPU.
    uint8 (N, [C,] H, W) in, same shape and dtype out."""
    from capsnet.data.resample import rotate

    return rotate(images, angle)


def rotated(dataset: TensorImageDataset, angle: float, name: str = "") -> TensorImageDataset:
    """A copy of ``dataset`` (its ``tensors``) with every image rotated by ``angle`` degrees
    (``rotate_images``), the same targets."""
    images, targets = dataset.tensors  # (N, C, H, W) uint8, (N, ...)
    return TensorImageDataset(rotate_images(images, angle), targets, name)


def load(
    name: str,
    split: str = "test",
    root: str | os.PathLike | None = None,
    *,
    angle: float | None = None,
    subset: str = "all",
    seed: int | None = None,
    download: bool = True,
    mirror: str | None = None,
    progress: bool = False,
    data: DataParams | None = None,
    **options,
) -> Dataset:
    """A prepared dataset by name, as a torch Dataset of (image float (C, H, W) in [0, 1],
    target): an int class, or a multi-hot (10,) float vector for ``multimnist``.

    Names: mnist, expanded-mnist (40x40 canvas, random shift from ``seed``), rotated-mnist
    (``angle`` degrees), affnist (real files; split ``test`` or ``test-centered``),
    affnist-synth (test only), smallnorb (``subset``: all or a viewpoint subset, see
    ``capsnet.data.smallnorb.SUBSETS``; ``options``: channels, standardize, augment),
    multimnist (``options``: merge, redraw, components: items (image, target, each digit
    alone (2, 1, S, S), the two labels (2,))). Prepared files under ``root/prepared`` are used
    when present; MNIST-derived sets are otherwise computed from the raw MNIST files
    (downloaded when ``download``). ``data``: params.yaml's validated ``data`` section
    (default: its defaults); the loader reads its dataset's part, ``data.<spec.section>``,
    as ``request.settings``.
    """
    root = Path(root) if root is not None else DEFAULT_ROOT
    spec = get(name)
    if split not in spec.splits:
        raise DataError(f"{name} has no split {split!r}; choose one of: {', '.join(spec.splits)}")
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise DataError(f"{name}: unknown option(s) {', '.join(unknown)}")

    settings = spec.settings(DataParams() if data is None else data)
    request = LoadRequest(root, split, angle, subset, seed, download, mirror, progress, settings)
    return resolve(spec.loader)(request, **options)
