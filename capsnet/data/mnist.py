"""MNIST: official sources, raw-MD5 verification, IDX parsing into uint8 tensors."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from capsnet.data.formats import read_idx_images, read_idx_labels
from capsnet.data.sources import RemoteFile, fetch
from capsnet.data.store import PreparedSpec, digits
from capsnet.io.errors import DataError

OFFICIAL_BASES = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)

# file stem -> raw (decompressed) MD5 (data/mnist.md)
RAW_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}

# file stem -> bytes of the decompressed file (an IDX header plus one byte per value)
RAW_SIZE = {
    "train-images-idx3-ubyte": 16 + 60_000 * 28 * 28,
    "train-labels-idx1-ubyte": 8 + 60_000,
    "t10k-images-idx3-ubyte": 16 + 10_000 * 28 * 28,
    "t10k-labels-idx1-ubyte": 8 + 10_000,
}

PREPARED = PreparedSpec(digits(28))

SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def remote_files() -> list[RemoteFile]:
    return [
        RemoteFile(
            "mnist",
            f"{stem}.gz",
            tuple(base + f"{stem}.gz" for base in OFFICIAL_BASES),
            md5,
            size=RAW_SIZE[stem],
        )
        for stem, md5 in RAW_MD5.items()
    ]


def download(raw_dir: str | os.PathLike, mirror: str | None = None, progress: bool = True):
    """Fetch and verify the four MNIST files into ``raw_dir``."""
    return [fetch(remote, raw_dir, mirror=mirror, progress=progress) for remote in remote_files()]


def read_split(raw_dir: str | os.PathLike, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Images uint8 (N, 28, 28) and labels int64 (N,) of ``split`` from the raw .gz files."""
    if split not in SPLIT_FILES:
        raise DataError(f"MNIST split {split!r} unknown; choose train or test")
    image_stem, label_stem = SPLIT_FILES[split]
    raw_dir = Path(raw_dir)
    images = read_idx_images(raw_dir / f"{image_stem}.gz")
    labels = read_idx_labels(raw_dir / f"{label_stem}.gz")
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"{raw_dir / image_stem}.gz: {images.shape[0]} images but "
            f"{labels.shape[0]} labels in {label_stem}.gz"
        )
    return images, labels


def load_split(
    raw_dir: str | os.PathLike,
    split: str,
    download_missing: bool = True,
    mirror: str | None = None,
    progress: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``read_split``, downloading (and verifying) the files first when asked."""
    if download_missing:
        stems = SPLIT_FILES.get(split, ())
        wanted = [r for r in remote_files() if r.filename[: -len(".gz")] in stems]
        for remote in wanted:
            fetch(remote, raw_dir, mirror=mirror, progress=progress)
    return read_split(raw_dir, split)


def prepare(raw_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Parse and check the raw files; write ``out_dir/{train,test}.pt`` (uint8 images,
    int64 labels) atomically, both or neither."""
    from capsnet.config.dataset_specs import PREPARED_FILES
    from capsnet.data.store import save_prepared
    from capsnet.io.outputset import atomic_directory

    splits = {split: read_split(raw_dir, split) for split in SPLIT_FILES}
    with atomic_directory(out_dir, PREPARED_FILES) as tmp:
        for split, (images, labels) in splits.items():
            save_prepared(
                tmp / f"{split}.pt",
                {"images": images, "labels": labels},
                dataset="mnist",
                split=split,
                count=int(labels.shape[0]),
            )
    return Path(out_dir)


def load_tensors(
    root: str | os.PathLike,
    split: str,
    download_missing: bool = True,
    mirror: str | None = None,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST ``split`` from ``root/prepared/mnist`` when prepared, else from ``root/raw/mnist``."""
    from capsnet.data.store import load_prepared

    prepared = Path(root) / "prepared" / "mnist" / f"{split}.pt"
    if prepared.is_file():
        tensors, _ = load_prepared(prepared, "mnist")
        return tensors["images"], tensors["labels"]
    return load_split(Path(root) / "raw" / "mnist", split, download_missing, mirror, progress)


def split_loader(request) -> Callable[[str], tuple[torch.Tensor, torch.Tensor]]:
    """MNIST split name -> (images uint8 (N, 28, 28), labels (N,)) under a loader request's
    root (``capsnet.data.tensors.LoadRequest``): what the MNIST-derived sets are made of."""
    return lambda which: load_tensors(
        request.root, which, request.download, request.mirror, request.progress
    )


def load_dataset(request):
    """The registry loader: MNIST ``request.split`` as a TensorImageDataset."""
    from capsnet.data.tensors import TensorImageDataset

    images, labels = split_loader(request)(request.split)
    return TensorImageDataset(images, labels, f"mnist-{request.split}")


def download_stage(out: Path, section, mirror, progress: bool, stand_in=None) -> Path:
    """The download stage: the four files into ``out``."""
    download(out, mirror, progress)
    return out


def prepare_stage(root: Path, out: Path, section) -> Path:
    """The prepare stage: ``root/raw/mnist`` -> ``out``."""
    return prepare(root / "raw" / "mnist", out)
