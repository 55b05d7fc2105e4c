"""A toy dataset registered at run time: three classes of 12x12 bars (horizontal, vertical,
diagonal) with a little noise, built in memory. Everything the project needs of it is this
module and its registration (``SPEC``: behaviour and display, its results column first)."""

from __future__ import annotations

import torch

from capsnet.config.dataset_specs import Column, DatasetSpec, SummaryKey
from capsnet.data.tensors import TensorImageDataset

SIDE, CLASSES = 12, 3
SIZES = {"train": 48, "test": 24}


def _images(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(count) % CLASSES  # (N,)
    images = torch.randint(0, 40, (count, SIDE, SIDE), generator=generator)  # (N, S, S)
    line = torch.arange(2, SIDE - 2)
    images[labels == 0, SIDE // 2, 2 : SIDE - 2] = 255
    images[labels == 1, 2 : SIDE - 2, SIDE // 2] = 255
    images[(labels == 2).nonzero().repeat(1, len(line)), line, line] = 255
    return images.to(torch.uint8), labels


def load_dataset(request, **options) -> TensorImageDataset:
    """The registry loader: the ``request.split`` items, the same for every call."""
    images, labels = _images(SIZES[request.split], seed=len(request.split))
    return TensorImageDataset(images, labels, f"toy-{request.split}", num_classes=CLASSES)


SPEC = DatasetSpec(
    "toy-bars", "toy-bars", "toyset:load_dataset", shape=(1, SIDE, CLASSES),
    train=True, evaluation=("toy-bars",), columns=(Column("toy-bars", "toy bars"),),
    column_order=5, summary=(SummaryKey("toy-bars", "toy"),),
)  # fmt: skip
