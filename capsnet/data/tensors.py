"""torch Datasets over in-memory uint8 image tensors, what every dataset module builds on.

No module of capsnet.data is imported here, so each dataset module can import this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from capsnet.io.errors import DataError


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
    stop = cut if head_limit is None else min(cut, head_limit)
    if hasattr(dataset, "take"):  # rendered per epoch: keep the dataset's own batch path
        return dataset.take(0, stop), (dataset.take(cut, n, fixed=True) if tail else None)
    head = Slice(dataset, 0, stop)
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


@dataclass(frozen=True)
class LoadRequest:
    """What a dataset loader is asked for: the split under ``root`` (prepared files in
    ``root/prepared``), and the settings some datasets read. ``settings``: the dataset's
    validated params.yaml section (``data.<its spec's section>``, a ``capsnet.config.data``
    dataclass; None where the data section has none), the same at every entry point."""

    root: Path
    split: str
    angle: float | None = None  # rotated-mnist
    subset: str = "all"  # smallnorb viewpoint subset
    seed: int | None = None  # expanded-mnist placement, multimnist redraws, smallnorb crops
    # MNIST-derived sets read the raw MNIST files when unprepared (capsnet.data.mnist):
    download: bool = True  # fetch missing raw files
    mirror: str | None = None
    progress: bool = False
    settings: Any = None
