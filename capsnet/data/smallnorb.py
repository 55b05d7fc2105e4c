"""smallNORB (data/smallnorb.md): official binary files, 48x48 preparation, EM-paper crops, and the
novel-viewpoint subsets.

Prepared images keep both stereo channels, uint8 (N, 2, 48, 48); a model picks channels
with the ``channels`` option. Training batches are random 32x32 crops with random
brightness and contrast, rendered on the training device (``SmallNORBTrain.render_batch``);
test items are the centre 32x32 crop. With ``standardize`` (the EM paper's preprocessing)
every image, train and test alike, is then shifted and scaled to zero mean and unit
variance over its pixels (after the crop and the brightness and contrast draws, so the
model always sees standardised inputs).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from capsnet.data.batches import RenderedItems
from capsnet.data.sources import NoSource, RemoteFile, fetch
from capsnet.data.store import PreparedSpec, TensorSpec
from capsnet.data.tensors import TensorImageDataset
from capsnet.io.errors import ConfigError, DataError, DatasetDisabled

OFFICIAL_BASE = "https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/"
PREFIX = {
    "train": "smallnorb-5x46789x9x18x6x2x96x96-training",
    "test": "smallnorb-5x01235x9x18x6x2x96x96-testing",
}
RAW_MD5 = {  # (split, part) -> MD5 of the decompressed file (data/smallnorb.md)
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
CLASS_NAMES = ("animal", "human", "airplane", "truck", "car")  # label 0..4, real and stand-in
CLASSES = len(CLASS_NAMES)
INFO_FIELDS = ("instance", "elevation", "azimuth", "lighting")
INFO_MAX = (9, 8, 34, 5)  # the largest value of each info field
FAMILIAR_AZIMUTHS = (30, 32, 34, 0, 2, 4)  # 300..40 degrees (azimuth index x 10 degrees)
FAMILIAR_ELEVATIONS = (0, 1, 2)  # the three lowest: 30, 35, 40 degrees
PREPARED = PreparedSpec(
    {
        "images": TensorSpec(torch.uint8, ("N", 2, "S", "S")),  # (N, 2 stereo, S, S)
        "labels": TensorSpec(torch.int64, ("N",), 0, CLASSES - 1),  # (N,)
        "info": TensorSpec(torch.int64, ("N", len(INFO_FIELDS)), 0, INFO_MAX, columns=INFO_FIELDS),
    }
)
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


SOURCE_FILE = "SOURCE.txt"  # in the raw directory: which files it holds
SYNTH = "smallnorb-synth"
REAL = "smallnorb"


def obtain(
    raw_dir: str | os.PathLike, params, mirror: str | None, progress: bool = False, stand_in=None
) -> str:
    """Fill ``raw_dir`` with the six files from ``params.source`` (``data.smallnorb``):
    real (download), synth (``stand_in(raw_dir, seed, side, lightings)`` renders them) or auto
    (real when the mirror holds the official files, otherwise synth). Returns the source
    used, also written to SOURCE.txt."""
    raw_dir = Path(raw_dir)
    source = params.source
    if source == "auto":
        source = "real" if _mirror_has_real(raw_dir, mirror) else "synth"
    if source == "real":
        download(raw_dir, mirror, progress)
        used = REAL
    else:
        if stand_in is None:
            raise DataError("data.smallnorb.source synth: no stand-in renderer was given")
        stand_in(raw_dir, params.synth.seed, params.synth.side, params.synth.lightings)
        used = SYNTH
    from capsnet.io.files import atomic_write_bytes

    atomic_write_bytes(raw_dir / SOURCE_FILE, f"{used}\n".encode())
    return used


def _mirror_has_real(raw_dir: Path, mirror: str | None) -> bool:
    """Whether the six verified official files are in ``raw_dir`` already or reachable
    through ``mirror`` alone (never the official URLs: auto must work offline). A mirror
    without them leads to the stand-in silently; one holding any of them that fails (a
    corrupt or missing file beside good ones) says so in one line on stderr first."""
    failed: list[NoSource] = []
    for remote in remote_files():
        local = RemoteFile(remote.dataset, remote.filename, (), remote.raw_md5, size=remote.size)
        try:
            fetch(local, raw_dir, mirror=mirror, retries=1, progress=False)
        except NoSource as exc:
            failed.append(exc)
    if not failed:
        return True
    if len(failed) < len(RAW_MD5) or not all(exc.missing for exc in failed):
        exc = next((e for e in failed if not e.missing), failed[0])
        print(
            f"warning: {'; '.join(exc.tried) or exc}; data.smallnorb.source auto uses the "
            f"stand-in {SYNTH} instead of the real smallNORB",
            file=sys.stderr,
            flush=True,
        )
    return False


def raw_source(raw_dir: str | os.PathLike) -> str:
    """smallnorb or smallnorb-synth: what ``raw_dir`` holds. SOURCE.txt labels the stand-in;
    files not labelled so are the real smallNORB only when each matches its official raw
    MD5, and are refused otherwise, so other data is never reported as smallNORB."""
    raw_dir = Path(raw_dir)
    marker = raw_dir / SOURCE_FILE
    text = marker.read_text().strip() if marker.is_file() else None
    if text == SYNTH:
        return SYNTH
    if text not in (None, REAL):
        raise DataError(f"{marker}: {text!r} is neither {REAL} nor {SYNTH}")
    said = f"{SOURCE_FILE} says {REAL}" if text else f"no {SOURCE_FILE} says what it is"
    for remote in remote_files():
        path = raw_dir / remote.filename
        problem = remote.verify(path) if path.is_file() else "not found"
        if problem is not None:
            raise DataError(
                f"{path}: not the official smallNORB file ({problem}) and {said}; refused. "
                f"`capsnet data download smallnorb` fetches the real files (data.smallnorb."
                f"source: real) or renders the labelled stand-in (source: synth)"
            )
    return REAL


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
    """Write ``out_dir/{train,test}.pt``: images uint8 (N, 2, size, size), labels, info,
    and in meta the source (smallnorb or smallnorb-synth)."""
    from capsnet.config.dataset_specs import PREPARED_FILES
    from capsnet.data.store import save_prepared
    from capsnet.io.outputset import atomic_directory

    source = raw_source(raw_dir)
    splits = {split: read_split(raw_dir, split) for split in PREFIX}
    with atomic_directory(out_dir, PREPARED_FILES) as tmp:
        for split, (images, labels, info) in splits.items():
            save_prepared(
                tmp / f"{split}.pt",
                {"images": downsample(images, size), "labels": labels, "info": info},
                dataset="smallnorb",
                split=split,
                size=size,
                info_fields=INFO_FIELDS,
                count=int(labels.shape[0]),
                source=source,
                synthetic=source == SYNTH,
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


def standardize(images: torch.Tensor) -> torch.Tensor:
    """Zero mean, unit variance per image: float (B, C, H, W) over (C, H, W)."""
    dims = (-3, -2, -1)
    mean = images.mean(dims, keepdim=True)  # (B, 1, 1, 1)
    return (images - mean) / images.std(dims, keepdim=True).clamp(min=1e-6)  # (B, C, H, W)


def random_crops(images: torch.Tensor, crop: int, generator) -> torch.Tensor:
    """uint8 (B, C, S, S) -> (B, C, crop, crop) at offsets drawn from ``generator``."""
    batch, channels, side = images.shape[0], images.shape[1], images.shape[-1]
    device = images.device
    corner = torch.randint(0, side - crop + 1, (batch, 2), generator=generator, device=device)
    span = torch.arange(crop, device=device)  # (crop,)
    rows = (corner[:, :1] + span)[:, None, :, None]  # (B, 1, crop, 1)
    cols = (corner[:, 1:] + span)[:, None, None, :]  # (B, 1, 1, crop)
    batch_index = torch.arange(batch, device=device)[:, None, None, None]
    channel_index = torch.arange(channels, device=device)[None, :, None, None]
    return images[batch_index, channel_index, rows, cols]  # (B, C, crop, crop)


def jitter(images: torch.Tensor, brightness: float, contrast: float, generator) -> torch.Tensor:
    """Random brightness then contrast of float (B, C, H, W) in [0, 1], each stereo channel
    scaled about its own mean (torchvision's adjust_brightness / adjust_contrast on each
    channel as a grey image); factors 1 + brightness * U(-1, 1), 1 + contrast * U(-1, 1)."""
    draws = torch.rand(images.shape[0], 2, generator=generator, device=images.device)  # (B, 2)
    spread = (2.0 * draws - 1.0)[:, :, None, None]  # (B, 2, 1, 1) in [-1, 1)
    b = 1.0 + brightness * spread[:, :1]  # (B, 1, 1, 1)
    bright = (images * b).clamp_(0.0, 1.0)  # (B, C, H, W)
    mean = bright.mean((-2, -1), keepdim=True)  # (B, C, 1, 1)
    c = 1.0 + contrast * spread[:, 1:]  # (B, 1, 1, 1)
    return (c * bright + (1.0 - c) * mean).clamp_(0.0, 1.0)  # (B, C, H, W)


class SmallNORBTrain(RenderedItems):
    """Training items: random crop, random brightness and contrast, then (``standardize``)
    zero mean and unit variance, float (C, crop, crop). Batches come from ``render_batch`` on
    the training device; items, for a DataLoader, are the same transform seeded per
    (seed, epoch, index)."""

    num_classes = CLASSES

    def __init__(
        self, images, labels, info, crop=32, brightness=0.2, contrast=0.2, seed=0,
        standardize=True, name="smallnorb-train",
    ):  # fmt: skip
        self.images = images  # (N, C, 48, 48) uint8
        self.labels = labels  # (N,)
        self.info = info  # (N, 4)
        self.crop, self.brightness, self.contrast = crop, brightness, contrast
        self.seed, self.epoch, self.standardize, self.name = seed, 0, standardize, name

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.images.shape[0]

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        return {"images": self.images, "labels": self.labels}

    def render_batch(self, tensors, index, epoch, generator):
        """(images float32 (B, C, crop, crop), labels (B,)) of the items ``index``: random
        crops, brightness and contrast from ``generator``, standardised when configured; all
        on the device of ``tensors``, no host sync."""
        images = random_crops(tensors["images"][index], self.crop, generator)  # (B, C, k, k)
        images = jitter(images.float().div_(255.0), self.brightness, self.contrast, generator)
        if self.standardize:
            images = standardize(images)
        return images, tensors["labels"][index]


class StandardizedTest(Dataset):
    """Centre-cropped test items, each standardised (zero mean, unit variance); batches
    through ``__getitems__``."""

    num_classes = CLASSES

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, info, name: str):
        self.images, self.labels, self.info, self.name = images, labels, info, name

    def __len__(self) -> int:
        return self.images.shape[0]

    @property
    def targets(self) -> torch.Tensor:
        return self.labels  # (N,), as TensorImageDataset names them

    def __getitems__(self, indices):
        index = torch.as_tensor(indices, dtype=torch.long)
        images = standardize(self.images[index].float().div_(255.0))  # (B, C, k, k)
        return list(zip(images, self.labels[index].tolist()))

    def __getitem__(self, index: int):
        return self.__getitems__([index])[0]

    def subset(self, limit: int | None):
        """The first ``limit`` items (all when None)."""
        if limit is None or limit >= len(self):
            return self
        info = None if self.info is None else self.info[:limit]
        return StandardizedTest(self.images[:limit], self.labels[:limit], info, self.name)


def crop_test_set(images, labels, info, crop: int, standardize: bool, name: str):
    """Centre ``crop`` crops of uint8 (N, C, S, S), standardised per image when asked."""
    cropped = centre_crop(images, crop).contiguous()  # (N, C, crop, crop)
    if standardize:
        return StandardizedTest(cropped, labels, info, name)
    dataset = TensorImageDataset(cropped, labels, name, num_classes=CLASSES)
    dataset.info = info
    return dataset


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
    standardize: bool = True,
):
    """smallNORB ``split`` restricted to ``subset``: random-crop training items (when
    ``augment``, default for train) or centre-cropped test items; ``source`` attribute:
    smallnorb or smallnorb-synth."""
    from capsnet.data.store import load_prepared
    from capsnet.io.files import read_disabled

    prepared = Path(root) / "prepared" / "smallnorb"
    if read_disabled(prepared) is not None:
        raise DatasetDisabled(
            f"{prepared}: smallnorb is switched off (data.smallnorb.enabled in params.yaml)"
        )
    if split not in PREFIX:
        raise DataError(f"smallnorb split {split!r} unknown; choose train or test")
    tensors, meta = load_prepared(prepared / f"{split}.pt", "smallnorb")
    mask = subset_mask(tensors["info"], subset)
    bad = [c for c in channels if c not in (0, 1)]
    if bad or not channels:
        raise DataError(f"smallnorb channels {channels!r}: choose from 0 and 1")
    side = tensors["images"].shape[-1]
    if crop > side:
        raise DataError(
            f"{prepared / f'{split}.pt'}: crop {crop} is larger than the prepared {side}x{side} "
            f"images (data.smallnorb.crop, data.smallnorb.size)"
        )
    images = tensors["images"][mask][:, list(channels)]  # (M, C, S, S)
    labels, info = tensors["labels"][mask], tensors["info"][mask]
    name = f"smallnorb-{split}-{subset}"
    if augment if augment is not None else split == "train":
        dataset = SmallNORBTrain(
            images, labels, info, crop, brightness, contrast, seed, standardize, name
        )
    else:
        dataset = crop_test_set(images, labels, info, crop, standardize, name)
    dataset.source = meta.get("source", REAL)
    dataset.class_names = CLASS_NAMES
    return dataset


def load_dataset(request, **options):
    """The registry loader."""
    return load(request.root, request.split, request.subset, request.seed or 0, **options)


def download_stage(out: Path, section, mirror, progress: bool, stand_in=None) -> Path:
    """The download stage: the six files from ``data.smallnorb.source``."""
    obtain(out, section, mirror, progress, stand_in)
    return out


def prepare_stage(root: Path, out: Path, section) -> Path:
    """The prepare stage: ``root/raw/smallnorb`` downsampled to ``data.smallnorb.size``."""
    return prepare(root / "raw" / "smallnorb", out, section.size)


def run_options(spec) -> dict:
    """The loader options of a run (``capsnet.training.run.RunSpec``): stereo channels and the
    ``data.smallnorb`` crop, jitter and standardisation (train and test alike)."""
    norb = spec.settings()
    return {
        "channels": tuple(range(spec.channels)), "crop": norb.crop,
        "brightness": norb.brightness, "contrast": norb.contrast,
        "standardize": norb.standardize,
    }  # fmt: skip


def run_split(spec):
    """(train, val) of a run: validation is the last ``val_size`` training items as centre
    crops, training the first ``train_size`` of the rest as random crops with brightness and
    contrast."""
    options = run_options(spec)
    full = load(spec.data_root, "train", spec.subset, augment=True, **options)
    images, labels, info = full.images, full.labels, full.info  # (N, C, 48, 48), (N,), (N, 4)
    if spec.val_size >= images.shape[0]:
        raise ConfigError(
            f"val_size {spec.val_size} >= {images.shape[0]} smallnorb training images"
        )
    cut = images.shape[0] - spec.val_size
    stop = cut if spec.train_size is None else min(cut, spec.train_size)
    del options["channels"]
    train = SmallNORBTrain(
        images[:stop].clone(), labels[:stop].clone(), info[:stop].clone(), seed=spec.train.seed,
        name="smallnorb-train", **options,
    )  # fmt: skip
    train.source = full.source
    val = None
    if spec.val_size:
        val = crop_test_set(
            images[cut:], labels[cut:].clone(), info[cut:].clone(), options["crop"],
            options["standardize"], "smallnorb-val",
        )  # fmt: skip
    return train, val


def run_test_set(spec, subset: str | None = None):
    """A run's centre-cropped test set (``subset``: another viewpoint subset than the run's)."""
    return load(spec.data_root, "test", subset or spec.subset, **run_options(spec))


def data_record(settings) -> dict:
    """What a checkpoint records of the preprocessing ``settings`` (``data.smallnorb``) ask
    for: ``standardize`` (the crop is the model's input size); the evaluation checks it
    against its own settings (``capsnet.evaluation.datasets``)."""
    return {"standardize": settings.standardize}


def evaluation_set(name: str, request, root: Path, load, channels: int = 2):
    """The evaluation's centre-cropped test set of the viewpoint subset ``name`` stands for,
    with ``channels`` views and the ``data.smallnorb`` crop and standardisation."""
    from capsnet.config.dataset_specs import subset_of

    subset = subset_of(name)
    norb = request.settings(name)
    dataset = load(
        "smallnorb", subset=subset, channels=tuple(range(channels)), crop=norb.crop,
        standardize=norb.standardize,
    )  # fmt: skip
    return dataset.subset(request.params.limit), {"subset": subset, "source": dataset.source}
