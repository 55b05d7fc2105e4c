"""Training-time augmentation strategies (albumentations), chosen by name from params.yaml.

Strategies: ``none``, ``shift`` (integer translation up to N px, zero fill), ``rotate`` (up
to +-degrees), ``affine`` (rotation, shear, scale, translation), ``elastic``. ``shift`` has
one implementation, ``random_shift``: ``fit`` applies it to whole batches on the device
(``TrainConfig.shift_pixels``), ``AugmentedDataset`` to single items. The other strategies
are albumentations pipelines built with ``Compose(strict=True)``, so a misspelled argument
is an error. ``for_training`` is how every training run picks between the two.

Seeding: albumentations 2.0.8 copies one random state into every DataLoader worker, so all
workers would draw the same augmentations. ``AugmentedDataset.worker_init_fn`` and
``set_epoch`` reseed the pipeline from (seed, epoch, worker id) instead: runs are
reproducible, workers differ, and epochs differ.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from capsnet.config import STRATEGIES, AugmentParams
from capsnet.errors import ConfigError


def check_strategy(strategy: str) -> None:
    """ConfigError naming the known strategies when ``strategy`` is not one of them."""
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"augment.strategy {strategy!r} unknown; choose one of {', '.join(STRATEGIES)}"
        )


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Shift each image by an integer offset in [-max_shift, max_shift] per axis, zero fill.

    images (B, C, H, W) -> (B, C, H, W); offsets drawn from ``generator`` (on images' device).
    """
    if max_shift == 0:
        return images
    batch, _, height, width = images.shape
    padded = torch.nn.functional.pad(images, (max_shift,) * 4)  # (B, C, H+2s, W+2s)
    offsets = torch.randint(
        0, 2 * max_shift + 1, (2, batch), generator=generator, device=generator.device
    ).to(images.device)  # (2, B)
    rows = offsets[0, :, None] + torch.arange(height, device=images.device)  # (B, H)
    cols = offsets[1, :, None] + torch.arange(width, device=images.device)  # (B, W)
    batch_index = torch.arange(batch, device=images.device)[:, None, None]  # (B, 1, 1)
    out = padded.permute(0, 2, 3, 1)[batch_index, rows[:, :, None], cols[:, None, :]]  # (B,H,W,C)
    return out.permute(0, 3, 1, 2).contiguous()


def build_transform(strategy: str, params: AugmentParams | None = None, seed: int | None = None):
    """An albumentations Compose for ``strategy`` (None for ``none`` and ``shift``, which
    ``random_shift`` implements)."""
    check_strategy(strategy)
    if strategy in ("none", "shift"):
        return None
    import albumentations as A
    import cv2

    params = params or AugmentParams()
    constant = {"border_mode": cv2.BORDER_CONSTANT, "fill": 0}
    if strategy == "rotate":
        transform = A.Rotate(
            limit=(-params.rotate.degrees, params.rotate.degrees), p=1.0, **constant
        )
    elif strategy == "affine":
        a = params.affine
        px = a.translate_pixels
        transform = A.Affine(
            rotate=(-a.degrees, a.degrees),
            shear=(-a.shear_degrees, a.shear_degrees),
            scale=tuple(a.scale),
            translate_px={"x": (-px, px), "y": (-px, px)},
            p=1.0,
            **constant,
        )
    else:
        e = params.elastic
        transform = A.ElasticTransform(alpha=e.alpha, sigma=e.sigma, p=1.0, **constant)
    return A.Compose([transform], strict=True, seed=seed)


def _derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


def for_training(
    dataset, strategy: str, params: AugmentParams | None = None, seed: int = 0
) -> tuple[Dataset, int]:
    """(training dataset, batch shift in pixels) for ``strategy``: ``shift`` keeps the
    dataset and asks ``fit`` to shift whole batches on the device; ``none`` keeps the
    dataset; the others wrap an in-memory image dataset in ``AugmentedDataset``."""
    check_strategy(strategy)
    if strategy == "shift":
        return dataset, (params or AugmentParams()).shift.pixels
    if strategy == "none":
        return dataset, 0
    if not hasattr(dataset, "tensors"):
        name = getattr(dataset, "name", "this dataset")
        raise ConfigError(
            f"augment {strategy!r} needs in-memory images; {name} is rendered or augmented "
            f"on the fly (use none or shift)"
        )
    return AugmentedDataset(dataset, strategy, params, seed), 0


class AugmentedDataset(Dataset):
    """Wrap a TensorImageDataset: items are augmented float (C, H, W) images in [0, 1].

    Deliberately has no ``tensors`` attribute, so training takes the DataLoader path that
    calls ``worker_init_fn`` and ``set_epoch``.
    """

    def __init__(
        self,
        base,
        strategy: str = "shift",
        params: AugmentParams | None = None,
        seed: int = 0,
    ):
        self.base = base
        self.strategy = strategy
        self.seed = seed
        self.epoch = 0
        self.compose = build_transform(strategy, params)
        self.shift = (params or AugmentParams()).shift.pixels if strategy == "shift" else 0
        self.generator = torch.Generator()
        self.name = f"{getattr(base, 'name', 'dataset')}+{strategy}"
        self.num_classes = getattr(base, "num_classes", 10)
        self.reseed()

    def reseed(self, worker_id: int | None = None) -> None:
        """Seed the pipeline from (seed, epoch, worker); the main process counts as -1."""
        worker = -1 if worker_id is None else worker_id
        seed = _derive_seed(self.seed, self.epoch, worker + 1)
        self.generator.manual_seed(seed)
        if self.compose is not None:
            self.compose.set_random_seed(seed)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.reseed()

    @staticmethod
    def worker_init_fn(worker_id: int) -> None:
        """Pass to DataLoader(worker_init_fn=...): reseed this worker's copy of the dataset."""
        info = get_worker_info()
        dataset = info.dataset if info is not None else None
        if isinstance(dataset, AugmentedDataset):
            dataset.reseed(worker_id)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Any]:
        images, targets = self.base.tensors
        image = images[index]  # (C, H, W) uint8
        if self.compose is not None:
            array = image.permute(1, 2, 0).numpy()  # (H, W, C)
            out = self.compose(image=array)["image"]
            image = torch.from_numpy(np.ascontiguousarray(out)).reshape(array.shape)
            image = image.permute(2, 0, 1)  # (C, H, W)
        elif self.shift:
            image = random_shift(image[None], self.shift, self.generator)[0]  # (C, H, W)
        target = targets[index]
        return image.float().div_(255.0), (int(target) if target.dim() == 0 else target)
