"""torch Datasets over in-memory uint8 image tensors, and ``load(name, split, root)``."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.utils.data import Dataset

from capsnet.errors import DataError

DEFAULT_ROOT = Path("data")


class TensorImageDataset(Dataset):
    """(image, target) pairs from uint8 images (N, H, W) or (N, C, H, W) and targets (N, ...).

    Items are float (C, H, W) in [0, 1] and an int class (or the target row, e.g. multi-hot).
    ``tensors`` exposes the raw tensors so training can batch them without per-item work.
    """

    def __init__(
        self, images: torch.Tensor, targets: torch.Tensor, name: str = "", num_classes: int = 10
    ):
        if images.dim() == 3:
            images = images.unsqueeze(1)  # (N, 1, H, W)
        if images.dim() != 4:
            raise DataError(
                f"{name or 'dataset'}: images must be (N, [C,] H, W), got {tuple(images.shape)}"
            )
        if images.shape[0] != targets.shape[0]:
            raise DataError(
                f"{name or 'dataset'}: {images.shape[0]} images but {targets.shape[0]} targets"
            )
        self.images = images  # (N, C, H, W) uint8
        self.targets = targets  # (N,) int64 or (N, K)
        self.name = name
        self.num_classes = num_classes

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images, self.targets

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int):
        image = self.images[index].float().div_(255.0)  # (C, H, W)
        target = self.targets[index]
        return image, (int(target) if target.dim() == 0 else target)

    def subset(self, limit: int | None) -> TensorImageDataset:
        """The first ``limit`` items (all when None)."""
        if limit is None or limit >= len(self):
            return self
        return TensorImageDataset(
            self.images[:limit], self.targets[:limit], self.name, self.num_classes
        )


class Slice(Dataset):
    """Items ``start`` to ``stop`` of a dataset, forwarding ``set_epoch`` and
    ``worker_init_fn`` so per-epoch redraws and per-worker seeding keep working."""

    def __init__(self, base: Dataset, start: int, stop: int):
        self.base, self.start, self.stop = base, start, min(stop, len(base))
        self.name = getattr(base, "name", "")
        self.num_classes = getattr(base, "num_classes", 10)
        if hasattr(base, "worker_init_fn"):
            self.worker_init_fn = base.worker_init_fn

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def __getitem__(self, index: int):
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.base[self.start + index]

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)


def split_tail(dataset: Dataset, tail: int, head_limit: int | None = None):
    """(head, tail) of ``dataset``: the last ``tail`` items apart (None when 0), the head
    cut to its first ``head_limit`` items. In-memory datasets stay in memory."""
    n = len(dataset)
    if tail >= n:
        raise DataError(f"{getattr(dataset, 'name', 'dataset')}: cannot hold out {tail} of {n}")
    cut = n - tail
    if hasattr(dataset, "tensors"):
        images, targets = dataset.tensors
        name, classes = getattr(dataset, "name", ""), dataset.num_classes
        head = TensorImageDataset(images[:cut], targets[:cut], name, classes).subset(head_limit)
        rest = (
            TensorImageDataset(images[cut:], targets[cut:], f"{name}-val", classes)
            if tail
            else None
        )
        return head, rest
    head = Slice(dataset, 0, cut if head_limit is None else min(cut, head_limit))
    return head, (Slice(dataset, cut, n) if tail else None)


def shape_of(dataset: Dataset) -> tuple[int, int, int]:
    """The (channels, image size, classes) a model needs for ``dataset`` (what
    ``capsnet.models.build`` takes as ``shape``): from its first image and the
    ``num_classes`` every dataset here declares (10 unless it says)."""
    image = dataset[0][0]  # (C, H, W)
    if image.dim() != 3 or image.shape[-1] != image.shape[-2]:
        name = getattr(dataset, "name", "dataset")
        raise DataError(f"{name}: items must be square (C, H, W) images, got {tuple(image.shape)}")
    return (int(image.shape[0]), int(image.shape[-1]), int(getattr(dataset, "num_classes", 10)))


def rotate_images(images: torch.Tensor, angle: float) -> torch.Tensor:
    """Rotate each image about its centre by ``angle`` degrees (counter-clockwise),
    bilinear, zero fill, same canvas, the same bytes on every CPU.
    uint8 (N, [C,] H, W) in, same shape and dtype out."""
    from capsnet.data.resample import rotate

    return rotate(images, angle)


DATASETS = (
    "mnist",
    "expanded-mnist",
    "rotated-mnist",
    "affnist",
    "affnist-synth",
    "smallnorb",
    "multimnist",
)


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
    (downloaded when ``download``).
    """
    from capsnet.data import mnist

    root = Path(root) if root is not None else DEFAULT_ROOT
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    known = {
        "smallnorb": {"channels", "standardize", "augment", "crop", "brightness", "contrast"},
        "multimnist": {"merge", "redraw", "components"},
    }.get(name, set())
    unknown = sorted(set(options) - known)
    if unknown:
        raise DataError(f"{name}: unknown option(s) {', '.join(unknown)}")

    def mnist_split(which: str):
        return mnist.load_tensors(root, which, download, mirror, progress)

    if name == "smallnorb":
        from capsnet.data import smallnorb

        return smallnorb.load(root, split, subset=subset, seed=seed or 0, **options)
    if name == "multimnist":
        from capsnet.data import multimnist

        return multimnist.load(root, split, mnist_split, seed=seed, **options)
    return _mnist_derived(name, split, root, mnist_split, angle, seed)


def _mnist_derived(name: str, split: str, root: Path, mnist_split, angle, seed) -> Dataset:
    """mnist, rotated-mnist, expanded-mnist, affnist and affnist-synth as in-memory images."""
    if name == "rotated-mnist":
        if angle is None:
            raise DataError("rotated-mnist needs an angle")
        from capsnet.data import rotated

        images, labels = rotated.load_tensors(split, angle, mnist_split)
        return TensorImageDataset(images, labels, f"rotated-mnist-{angle:g}")
    if name in ("affnist", "affnist-synth"):
        from capsnet.data import affnist

        loader = affnist.load_real if name == "affnist" else affnist.load_synth
        images, labels = loader(root, split, mnist_split=mnist_split)
        return TensorImageDataset(images, labels, f"{name}-{split}")
    images, labels = mnist_split(split)
    if name == "expanded-mnist":
        from capsnet.data import affnist

        expanded = affnist.expand(images, seed=0 if seed is None else seed)
        return TensorImageDataset(expanded, labels, f"expanded-mnist-{split}")
    return TensorImageDataset(images, labels, f"mnist-{split}")
