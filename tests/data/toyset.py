"""A toy dataset registered at run time: three classes of 12x12 bars (horizontal, vertical,
diagonal) with a little noise, built in memory, with a settings section of its own
(``data.toyset.brightness``: the bars' pixel value). It stands for the five files a dataset
takes: its module in capsnet/data/ (``load_dataset``), its spec in
capsnet/config/dataset_specs.py (``SPEC``: behaviour and display, its results column first),
its section in capsnet/config/data.py (``ToysetParams``, one field of ``DataParams``:
``DATA_FIELD``), params.yaml and dvc.yaml (a test writes its own params file)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from capsnet.config.dataset_specs import Column, DatasetSpec, SummaryKey
from capsnet.config.schema import count
from capsnet.data.tensors import TensorImageDataset

SIDE, CLASSES = 12, 3
SIZES = {"train": 48, "test": 24}


@dataclass(frozen=True)
class ToysetParams:
    """data.toyset: ``brightness``, the bars' pixel value (the noise under them is 0-39)."""

    brightness: int = 255

    def __post_init__(self):
        count(self, "brightness", 40, 255)


#: The DataParams field it takes: (name, type, default factory).
DATA_FIELD = ("toyset", ToysetParams)


def _images(count: int, seed: int, brightness: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(count) % CLASSES  # (N,)
    images = torch.randint(0, 40, (count, SIDE, SIDE), generator=generator)  # (N, S, S)
    line = torch.arange(2, SIDE - 2)
    images[labels == 0, SIDE // 2, 2 : SIDE - 2] = brightness
    images[labels == 1, 2 : SIDE - 2, SIDE // 2] = brightness
    images[(labels == 2).nonzero().repeat(1, len(line)), line, line] = brightness
    return images.to(torch.uint8), labels


def load_dataset(request, **options) -> TensorImageDataset:
    """The registry loader: the ``request.split`` items at ``request.settings.brightness``
    (data.toyset), the same for every call."""
    brightness = request.settings.brightness
    images, labels = _images(SIZES[request.split], len(request.split), brightness)
    return TensorImageDataset(images, labels, f"toy-{request.split}", num_classes=CLASSES)


SPEC = DatasetSpec(
    "toy-bars", "toyset", "toyset:load_dataset", shape=(1, SIDE, CLASSES),
    train=True, evaluation=("toy-bars",), columns=(Column("toy-bars", "toy bars"),),
    column_order=5, summary=(SummaryKey("toy-bars", "toy"),),
)  # fmt: skip
