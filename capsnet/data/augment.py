"""Training-time augmentation strategies (albumentations), chosen by name from params.yaml.

Strategies: ``none``, ``shift`` (integer translation up to N px), ``rotate`` (up to
+-degrees), ``affine`` (rotation, shear, scale, translation), ``elastic``. Pipelines are
built with ``Compose(strict=True)`` so a misspelled argument is an error.

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

from capsnet.config import AugmentParams
from capsnet.errors import ConfigError

STRATEGIES = ("none", "shift", "rotate", "affine", "elastic")


def build_transform(strategy: str, params: AugmentParams | None = None, seed: int | None = None):
    """An albumentations Compose for ``strategy`` (None for ``none``)."""
    if strategy not in STRATEGIES:
        raise ConfigError(
            f"augment.strategy {strategy!r} unknown; choose one of {', '.join(STRATEGIES)}"
        )
    if strategy == "none":
        return None
    import albumentations as A
    import cv2

    params = params or AugmentParams()
    constant = {"border_mode": cv2.BORDER_CONSTANT, "fill": 0}
    if strategy == "shift":
        px = params.shift.pixels
        transform = A.Affine(
            translate_px={"x": (-px, px), "y": (-px, px)},
            interpolation=cv2.INTER_NEAREST,
            p=1.0,
            **constant,
        )
    elif strategy == "rotate":
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
        self.name = f"{getattr(base, 'name', 'dataset')}+{strategy}"
        self.reseed()

    def reseed(self, worker_id: int | None = None) -> None:
        """Seed the pipeline from (seed, epoch, worker); the main process counts as -1."""
        if self.compose is not None:
            worker = -1 if worker_id is None else worker_id
            self.compose.set_random_seed(_derive_seed(self.seed, self.epoch, worker + 1))

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
        target = targets[index]
        return image.float().div_(255.0), (int(target) if target.dim() == 0 else target)
