"""smallNORB (SPEC 2.3): official binary files, 48x48 preparation, EM-paper crops, and the
novel-viewpoint subsets.

Prepared images keep both stereo channels, uint8 (N, 2, 48, 48); a model picks channels
with the ``channels`` option. Training items are random 32x32 crops with random brightness
and contrast (seeded per item from (seed, epoch, index), so any number of DataLoader workers
gives the same stream); test items are the centre 32x32 crop.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from capsnet.data.sources import RemoteFile, fetch
from capsnet.errors import DataError

OFFICIAL_BASE = "https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/"
PREFIX = {
    "train": "smallnorb-5x46789x9x18x6x2x96x96-training",
    "test": "smallnorb-5x01235x9x18x6x2x96x96-testing",
}
RAW_MD5 = {  # (split, part) -> MD5 of the decompressed file, SPEC 2.3
    ("train", "dat"): "8138a0902307b32dfa0025a36dfa45ec",
    ("train", "cat"): "fd5120d3f770ad57ebe620eb61a0b633",
    ("train", "info"): "19faee774120001fc7e17980d6960451",
    ("test", "dat"): "e9920b7f7b2869a8f1a12e945b2c166c",
    ("test", "cat"): "fd5120d3f770ad57ebe620eb61a0b633",
    ("test", "info"): "7c5b871cc69dcadec1bf6a18141f5edc",
}
#: part -> bytes of each decompressed file: the header (magic, ndim, max(3, ndim) dims as
#: int32), then 24,300 rows
RAW_SIZE = {"dat": 24 + 24_300 * 2 * 96 * 96, "cat": 20 + 24_300 * 4, "info": 20 + 24_300 * 16}
CLASSES = 5  # animal, human, airplane, truck, car
INFO_FIELDS = ("instance", "elevation", "azimuth", "lighting")
INFO_MAX = (9, 8, 34, 5)  # the largest value of each info field
FAMILIAR_AZIMUTHS = (30, 32, 34, 0, 2, 4)  # 300..40 degrees (azimuth index x 10 degrees)
FAMILIAR_ELEVATIONS = (0, 1, 2)  # the three lowest: 30, 35, 40 degrees
SUBSETS = ("all", "azimuth-familiar", "azimuth-novel", "elevation-familiar", "elevation-novel")


def filename(split: str, part: str) -> str:
    return f"{PREFIX[split]}-{part}.mat.gz"


def remote_files() -> list[RemoteFile]:
    return [
        RemoteFile(
            "smallnorb",
            filename(split, part),
            (OFFICIAL_BASE + filename(split, part),),
            md5,
            size=RAW_SIZE[part],
        )
        for (split, part), md5 in RAW_MD5.items()
    ]


def download(raw_dir: str | os.PathLike, mirror: str | None = None, progress: bool = True):
    """Fetch and verify the six smallNORB files into ``raw_dir``."""
    return [fetch(remote, raw_dir, mirror=mirror, progress=progress) for remote in remote_files()]


def read_split(raw_dir: str | os.PathLike, split: str):
    """(images uint8 (N, 2, 96, 96), labels int64 (N,), info int64 (N, 4)) of ``split``."""
    from capsnet.data.formats import read_norb

    if split not in PREFIX:
        raise DataError(f"smallnorb split {split!r} unknown; choose train or test")
    raw_dir = Path(raw_dir)
    paths = {part: raw_dir / filename(split, part) for part in ("dat", "cat", "info")}
    dat, cat, info = (read_norb(paths[part]) for part in ("dat", "cat", "info"))
    if dat.ndim != 4 or dat.shape[1] != 2 or dat.dtype != np.uint8:
        raise DataError(f"{paths['dat']}: expected uint8 (N, 2, H, W), got {dat.dtype} {dat.shape}")
    cat = cat.reshape(-1)
    if info.ndim != 2 or info.shape[1] != 4:
        raise DataError(f"{paths['info']}: expected (N, 4) info, got {info.shape}")
    for path, array in ((paths["cat"], cat), (paths["info"], info)):
        if array.shape[0] != dat.shape[0]:
            raise DataError(
                f"{path}: {array.shape[0]} rows but {dat.shape[0]} images in {paths['dat'].name}"
            )
    if cat.size and (cat.min() < 0 or cat.max() > 4):
        raise DataError(f"{paths['cat']}: label {int(cat.max())} out of range 0..4")
    for column, (name, largest) in enumerate(zip(INFO_FIELDS, INFO_MAX)):
        values = info[:, column]
        if values.size and (values.min() < 0 or values.max() > largest):
            raise DataError(f"{paths['info']}: {name} out of range 0..{largest}")
    return (
        torch.from_numpy(np.ascontiguousarray(dat)),
        torch.from_numpy(cat.astype(np.int64)),
        torch.from_numpy(info.astype(np.int64)),
    )


def downsample(images: torch.Tensor, size: int = 48) -> torch.Tensor:
    """uint8 (N, C, H, W) -> uint8 (N, C, size, size), antialiased bilinear, the same bytes
    on every CPU (``capsnet.data.resample.resize``)."""
    from capsnet.data.resample import resize

    return resize(images, size)


def prepare(raw_dir: str | os.PathLike, out_dir: str | os.PathLike, size: int = 48) -> Path:
    """Write ``out_dir/{train,test}.pt``: images uint8 (N, 2, size, size), labels, info."""
    from capsnet.data.store import save_prepared
    from capsnet.io import atomic_directory

    splits = {split: read_split(raw_dir, split) for split in PREFIX}
    with atomic_directory(out_dir) as tmp:
        for split, (images, labels, info) in splits.items():
            save_prepared(
                tmp / f"{split}.pt",
                {"images": downsample(images, size), "labels": labels, "info": info},
                dataset="smallnorb",
                split=split,
                size=size,
                info_fields=INFO_FIELDS,
                count=int(labels.shape[0]),
            )
    return Path(out_dir)


def subset_mask(info: torch.Tensor, subset: str) -> torch.Tensor:
    """bool (N,): the rows of ``info`` (N, 4) in a named viewpoint subset."""
    if subset not in SUBSETS:
        raise DataError(f"smallnorb subset {subset!r} unknown; choose one of {', '.join(SUBSETS)}")
    if subset == "all":
        return torch.ones(info.shape[0], dtype=torch.bool)
    kind, which = subset.split("-")
    column, familiar = (2, FAMILIAR_AZIMUTHS) if kind == "azimuth" else (1, FAMILIAR_ELEVATIONS)
    mask = torch.isin(info[:, column], torch.tensor(familiar))
    return mask if which == "familiar" else ~mask


def centre_crop(images: torch.Tensor, crop: int) -> torch.Tensor:
    """uint8 (N, C, H, W) -> (N, C, crop, crop) about the centre."""
    from torchvision.transforms.v2 import functional as TF

    return TF.center_crop(images, [crop, crop])


class SmallNORBTrain(Dataset):
    """Training items: random crop, random brightness and contrast, float (C, crop, crop)."""

    num_classes = CLASSES

    def __init__(
        self,
        images,
        labels,
        info,
        crop=32,
        brightness=0.2,
        contrast=0.2,
        seed=0,
        standardize=False,
        name="smallnorb-train",
    ):
        self.images = images  # (N, C, 48, 48) uint8
        self.labels = labels  # (N,)
        self.info = info  # (N, 4)
        self.crop, self.brightness, self.contrast = crop, brightness, contrast
        self.seed, self.epoch, self.standardize, self.name = seed, 0, standardize, name

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int):
        from torchvision.transforms.v2 import functional as TF

        rng = np.random.default_rng([self.seed, self.epoch, int(index)])
        image = self.images[index]  # (C, 48, 48)
        top, left = (int(v) for v in rng.integers(0, image.shape[-1] - self.crop + 1, 2))
        image = image[:, top : top + self.crop, left : left + self.crop]  # (C, crop, crop)
        image = image.float().div_(255.0).unsqueeze(1)  # (C, 1, crop, crop): channels apart
        b, c = rng.uniform(-1, 1, 2)
        image = TF.adjust_brightness(image, 1.0 + self.brightness * float(b))
        image = TF.adjust_contrast(image, 1.0 + self.contrast * float(c))
        image = image.squeeze(1)  # (C, crop, crop)
        if self.standardize:
            image = _standardize(image)
        return image, int(self.labels[index])


def _standardize(images: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit variance per image: float (..., C, H, W)."""
    dims = (-3, -2, -1)
    return (images - images.mean(dims, keepdim=True)) / images.std(dims, keepdim=True).clamp(
        min=1e-6
    )


def load(
    root: str | os.PathLike,
    split: str,
    subset: str = "all",
    seed: int = 0,
    channels: tuple[int, ...] = (0, 1),
    augment: bool | None = None,
    crop: int = 32,
    brightness: float = 0.2,
    contrast: float = 0.2,
    standardize: bool = False,
):
    """smallNORB ``split`` restricted to ``subset``: random-crop training items (when
    ``augment``, default for train) or centre-cropped test tensors."""
    from capsnet.data.datasets import TensorImageDataset
    from capsnet.data.store import load_prepared
    from capsnet.io import is_disabled

    prepared = Path(root) / "prepared" / "smallnorb"
    if is_disabled(prepared):
        raise DataError(
            f"{prepared}: smallnorb is switched off (data.smallnorb.enabled in params.yaml)"
        )
    if split not in PREFIX:
        raise DataError(f"smallnorb split {split!r} unknown; choose train or test")
    tensors, _ = load_prepared(prepared / f"{split}.pt", "smallnorb")
    mask = subset_mask(tensors["info"], subset)
    bad = [c for c in channels if c not in (0, 1)]
    if bad or not channels:
        raise DataError(f"smallnorb channels {channels!r}: choose from 0 and 1")
    images = tensors["images"][mask][:, list(channels)]  # (M, C, 48, 48)
    labels, info = tensors["labels"][mask], tensors["info"][mask]
    name = f"smallnorb-{split}-{subset}"
    if augment if augment is not None else split == "train":
        return SmallNORBTrain(
            images, labels, info, crop, brightness, contrast, seed, standardize, name
        )
    cropped = centre_crop(images, crop)  # (M, C, crop, crop)
    if standardize:
        return _StandardizedTensors(cropped, labels, name)
    dataset = TensorImageDataset(cropped, labels, name, num_classes=CLASSES)
    dataset.info = info
    return dataset


class _StandardizedTensors(Dataset):
    num_classes = CLASSES

    def __init__(self, images, labels, name):
        self.images, self.labels, self.name = images, labels, name

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int):
        return _standardize(self.images[index].float().div(255.0)), int(self.labels[index])
