"""Augmentation strategies: seeding per worker and per epoch, strictness, shapes."""

from __future__ import annotations

import pytest
import torch
from datahelpers import tiny_mnist
from torch.utils.data import DataLoader

from capsnet.config import AugmentParams
from capsnet.data import TensorImageDataset
from capsnet.data.augment import STRATEGIES, AugmentedDataset, build_transform
from capsnet.errors import ConfigError

pytest.importorskip("albumentations")


def same_digit_dataset(n: int = 16) -> TensorImageDataset:
    images, labels = tiny_mnist(1)
    return TensorImageDataset(images.repeat(n, 1, 1), labels.repeat(n), "copies")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_keeps_shape_range_and_label(strategy):
    data = AugmentedDataset(same_digit_dataset(4), strategy, AugmentParams(), seed=0)
    image, label = data[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert 0 <= float(image.min()) and float(image.max()) <= 1 and label == 0
    assert not hasattr(data, "tensors")  # training must take the DataLoader path


def test_shift_moves_ink_by_at_most_the_setting():
    base = same_digit_dataset(32)
    data = AugmentedDataset(base, "shift", AugmentParams(), seed=0)
    original = base[0][0][0] > 0
    rows, cols = original.any(1).nonzero(), original.any(0).nonzero()
    for i in range(32):
        ink = data[i][0][0] > 0
        dy = int(ink.any(1).nonzero()[0]) - int(rows[0])
        dx = int(ink.any(0).nonzero()[0]) - int(cols[0])
        assert abs(dy) <= 2 and abs(dx) <= 2
        assert int(ink.sum()) == int(original.sum())  # integer shift: ink preserved


def test_same_seed_same_stream_other_seed_or_epoch_differs():
    base = same_digit_dataset()

    def stream(seed, epoch=0):
        data = AugmentedDataset(base, "affine", AugmentParams(), seed=seed)
        data.set_epoch(epoch)
        return torch.stack([data[i][0] for i in range(8)])

    assert torch.equal(stream(1), stream(1))
    assert not torch.equal(stream(1), stream(2))
    assert not torch.equal(stream(1, epoch=0), stream(1, epoch=1))


def loader_stream(data, workers: int, seed: int = 0):
    loader = DataLoader(
        data,
        batch_size=1,
        num_workers=workers,
        shuffle=False,
        worker_init_fn=data.worker_init_fn,
        generator=torch.Generator().manual_seed(seed),
    )
    return torch.cat([images for images, _ in loader])  # (N, 1, 28, 28)


def test_workers_draw_different_augmentations_and_runs_repeat():
    """albumentations 2.0.8 would give both workers one stream unless reseeded."""
    data = AugmentedDataset(same_digit_dataset(8), "rotate", AugmentParams(), seed=0)
    first = loader_stream(data, workers=2)
    # batch_size 1, two workers: items alternate between worker 0 and worker 1
    worker0, worker1 = first[0::2], first[1::2]
    assert not torch.equal(worker0, worker1)
    assert torch.equal(first, loader_stream(data, workers=2))


def test_unknown_strategy_refused():
    with pytest.raises(ConfigError, match=r"augment\.strategy 'blur' unknown"):
        build_transform("blur")


def test_compose_is_strict():
    compose = build_transform("affine", AugmentParams())
    assert compose.strict is True
