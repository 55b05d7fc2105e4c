"""Helpers for the data tests: tiny datasets written in the official formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from capsnet.data.formats import write_idx


def tiny_mnist(n: int = 40, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Images uint8 (n, 28, 28): a filled block per digit, so ink is non-empty; labels (n,)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 10
    images = torch.zeros(n, 28, 28, dtype=torch.uint8)
    for i in range(n):
        top, left = (int(v) for v in torch.randint(4, 12, (2,), generator=generator))
        images[i, top : top + 12, left : left + 8] = 100 + 15 * int(labels[i])
    return images, labels


def write_tiny_mnist(raw_dir: Path, n_train: int = 60, n_test: int = 40) -> Path:
    """The four MNIST files (IDX, gzip) with tiny content under ``raw_dir``."""
    for prefix, n, seed in (("train", n_train, 0), ("t10k", n_test, 1)):
        images, labels = tiny_mnist(n, seed)
        write_idx(raw_dir / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(raw_dir / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return raw_dir


def files_under(path: Path) -> list[Path]:
    """Every file below ``path`` (empty when it does not exist)."""
    path = Path(path)
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.exists() else []


def write_affnist_mirror(mirror: Path, per_batch: int = 2, batches: int = 32) -> Path:
    """``mirror/affnist/{test_batches.zip,test.mat.zip}`` in the official layout:
    test_batches/<k>.mat (k = 1..32) and test.mat, each an affNISTdata struct."""
    import zipfile

    from capsnet.data.formats import write_affnist_mat

    staging = mirror / "staging"
    (staging / "test_batches").mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    for k in range(1, batches + 1):
        images = torch.randint(0, 256, (per_batch, 40, 40), generator=generator, dtype=torch.uint8)
        write_affnist_mat(
            staging / "test_batches" / f"{k}.mat", images, torch.arange(per_batch) % 10
        )
    write_affnist_mat(
        staging / "test.mat", torch.zeros(3, 40, 40, dtype=torch.uint8), torch.tensor([1, 2, 3])
    )
    (mirror / "affnist").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(mirror / "affnist" / "test_batches.zip", "w") as archive:
        for k in range(1, batches + 1):
            archive.write(staging / "test_batches" / f"{k}.mat", f"test_batches/{k}.mat")
    with zipfile.ZipFile(mirror / "affnist" / "test.mat.zip", "w") as archive:
        archive.write(staging / "test.mat", "test.mat")
    return mirror


def norb_info(n: int) -> np.ndarray:
    """(n, 4) int32 info rows cycling through every elevation, azimuth and lighting."""
    i = np.arange(n)
    return np.stack([i % 5, i % 9, (2 * i) % 36, i % 6], 1).astype(np.int32)


def write_smallnorb_raw(raw_dir: Path, n: int = 24, side: int = 96) -> Path:
    """The six smallNORB files (official binary format, gzip) with ``n`` examples each,
    labelled a stand-in (SOURCE.txt), as any raw smallNORB that is not the official data."""
    from capsnet.data import smallnorb
    from capsnet.data.formats import write_norb

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        write_norb(
            raw_dir / smallnorb.filename(split, "dat"),
            rng.integers(0, 256, (n, 2, side, side), dtype=np.uint8),
        )
        write_norb(raw_dir / smallnorb.filename(split, "cat"), (np.arange(n) % 5).astype(np.int32))
        write_norb(raw_dir / smallnorb.filename(split, "info"), norb_info(n))
    (raw_dir / smallnorb.SOURCE_FILE).write_text(f"{smallnorb.SYNTH}\n")
    return raw_dir
