"""Training sets that live on the device: the ``DeviceRenderable`` protocol and its
implementation for the plain in-memory sets (``TensorImageDataset``: MNIST, rotated MNIST).

``fit`` moves a renderable set's ``resident_tensors`` to the training device once per run,
shuffles with a device generator and asks ``render_batch`` for each batch: no per-step
host work, no host-to-device copy and no host sync. Sets without it keep the DataLoader.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch.utils.data import Dataset


@runtime_checkable
class DeviceRenderable(Protocol):
    """A training set whose batches are rendered on the training device.

    ``resident_tensors()``: the tensors to move to the device ONCE per fit (e.g. uint8
    images, labels).

    ``render_batch(tensors, index, epoch, generator)``: ``index`` (B,) int64 on the device of
    ``tensors``; returns ``(images float32 (B, C, H, W), targets, *parts)`` computed with
    tensor ops on that device only, random draws only from ``generator`` (a torch.Generator
    on the same device), no host sync.
    """

    def __len__(self) -> int: ...

    def resident_tensors(self) -> dict[str, torch.Tensor]: ...

    def render_batch(
        self,
        tensors: dict[str, torch.Tensor],
        index: torch.Tensor,
        epoch: int,
        generator: torch.Generator,
    ) -> tuple: ...


class InMemoryBatches:
    """``DeviceRenderable`` over a dataset with ``tensors`` = (uint8 images (N, C, H, W),
    targets (N, ...)): batches are the indexed rows, images scaled to [0, 1]."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset
        self.name = getattr(dataset, "name", "")

    def __len__(self) -> int:
        return len(self.dataset)

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        images, targets = self.dataset.tensors
        return {"images": images, "targets": targets}

    def render_batch(self, tensors, index, epoch, generator) -> tuple:
        images = tensors["images"][index].float().div_(255.0)  # (B, C, H, W)
        return images, tensors["targets"][index]


class OffsetBatches:
    """``DeviceRenderable`` over items ``start`` to ``stop`` of a renderable set (a
    ``capsnet.data.datasets.Slice``): indices are shifted by ``start``."""

    def __init__(self, base: DeviceRenderable, start: int, stop: int):
        self.base, self.start, self.stop = base, start, stop
        self.name = getattr(base, "name", "")

    def __len__(self) -> int:
        return max(0, self.stop - self.start)

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        return self.base.resident_tensors()

    def render_batch(self, tensors, index, epoch, generator) -> tuple:
        return self.base.render_batch(tensors, index + self.start, epoch, generator)


class RenderedItems(Dataset):
    """Items of a ``DeviceRenderable`` training set for a DataLoader: item ``index`` is its
    batch of one, rendered on the host with a generator seeded by (``seed``, ``epoch``,
    ``index``), so an item is the same whenever it is asked for in an epoch."""

    seed: int
    epoch: int

    def __getitem__(self, index: int):
        generator = torch.Generator().manual_seed(
            (self.seed * 1_000_003 + self.epoch) * 10_000_019 + int(index)
        )
        images, labels = self.render_batch(
            self.resident_tensors(), torch.tensor([int(index)]), self.epoch, generator
        )
        return images[0], int(labels[0])


def as_renderable(dataset: Dataset) -> DeviceRenderable | None:
    """``dataset`` itself when it implements the protocol; an adapter for in-memory image
    sets (``tensors``) and for slices of renderable sets; None otherwise (DataLoader path)."""
    from capsnet.data.datasets import Slice

    if isinstance(dataset, DeviceRenderable):
        return dataset
    if hasattr(dataset, "tensors"):
        return InMemoryBatches(dataset)
    if isinstance(dataset, Slice):
        base = as_renderable(dataset.base)
        if base is not None:
            return OffsetBatches(base, dataset.start, dataset.stop)
    return None


def to_device(tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The resident tensors on ``device`` (one copy each)."""
    return {key: value.to(device) for key, value in tensors.items()}
