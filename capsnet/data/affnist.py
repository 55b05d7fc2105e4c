"""affNIST (SPEC 2.2): the real test set, expanded MNIST for training, and affnist-synth.

The official archives have no published checksum. They are verified instead by the CRC-32
of every zip member (a truncated or altered download fails), the expected member count
(32 batches in each transformed archive) and, when prepared, by parsing: every .mat must
hold the ``affNISTdata`` fields with 1600-pixel columns and labels 0..9.

``affnist-synth`` is a clearly named stand-in for offline machines: random affine maps of
the MNIST test digits with the SPEC ranges. It is never reported as affNIST.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

from capsnet.data.sources import RemoteFile, check_zip, fetch, safe_extract_zip
from capsnet.errors import DataError

OFFICIAL_BASE = "https://www.cs.toronto.edu/~tijmen/affNIST/32x/"
ARCHIVES = {  # official file name -> path under the 32x/ folder
    "test_batches.zip": "transformed/test_batches.zip",
    "test.mat.zip": "just_centered/test.mat.zip",
    "training_and_validation_batches.zip": "transformed/training_and_validation_batches.zip",
}
BATCHES = 32
SIDE = 40
SYNTH_NOTE = "affnist-synth: synthetic stand-in (random affine maps of MNIST test digits)"


def remote_files(include_training: bool = False) -> list[RemoteFile]:
    names = list(ARCHIVES)[: 3 if include_training else 2]
    return [
        RemoteFile("affnist", name, (OFFICIAL_BASE + ARCHIVES[name],), None, check_zip)
        for name in names
    ]


def download(
    raw_dir: str | os.PathLike,
    mirror: str | None = None,
    include_training: bool = False,
    progress: bool = True,
) -> list[Path]:
    """Fetch the archives into ``raw_dir`` and extract each into ``raw_dir/<stem>/``."""
    raw_dir = Path(raw_dir)
    extracted = []
    for remote in remote_files(include_training):
        archive = fetch(remote, raw_dir, mirror=mirror, progress=progress)
        stem = archive.name.removesuffix(".zip").removesuffix(".mat")
        extracted += safe_extract_zip(archive, raw_dir / stem)
    return extracted


def _mat_files(directory: Path) -> list[Path]:
    def order(path: Path):
        return (int(path.stem), "") if path.stem.isdigit() else (math.inf, path.stem)

    return sorted(directory.rglob("*.mat"), key=order)


def read_mats(paths: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated images uint8 (N, 40, 40) and labels int64 (N,) of affNIST .mat files."""
    from capsnet.data.formats import read_affnist_mat

    parts = [read_affnist_mat(path) for path in paths]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def prepare(raw_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Parse the extracted test batches into ``out_dir/test.pt`` (and ``test-centered.pt``
    from just_centered/test.mat when present)."""
    from capsnet.data.store import atomic_directory, save_prepared

    raw_dir = Path(raw_dir)
    batches = _mat_files(raw_dir / "test_batches")
    if not batches:
        raise DataError(f"{raw_dir / 'test_batches'}: no affNIST .mat files (run download)")
    if len(batches) != BATCHES:
        raise DataError(
            f"{raw_dir / 'test_batches'}: {len(batches)} .mat files, expected {BATCHES}"
        )
    outputs = {"test": read_mats(batches)}
    centered = _mat_files(raw_dir / "test")
    if centered:
        outputs["test-centered"] = read_mats(centered)
    with atomic_directory(out_dir) as tmp:
        for split, (images, labels) in outputs.items():
            save_prepared(
                tmp / f"{split}.pt",
                {"images": images, "labels": labels},
                dataset="affnist",
                split=split,
                synthetic=False,
                count=int(labels.shape[0]),
            )
    return Path(out_dir)


def expand(images: torch.Tensor, seed: int = 0, side: int = SIDE) -> torch.Tensor:
    """Expanded MNIST: each digit uint8 (N, 28, 28) placed on a black side x side canvas at a
    uniformly random integer offset. -> uint8 (N, side, side)."""
    n, height, width = images.shape
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.randint(0, side - height + 1, (n, 2), generator=generator)  # (N, 2)
    canvas = torch.zeros(n, side, side, dtype=images.dtype)
    rows = offsets[:, :1] + torch.arange(height)  # (N, 28)
    cols = offsets[:, 1:] + torch.arange(width)  # (N, 28)
    canvas[torch.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]] = images
    return canvas


def synthesize(
    images: torch.Tensor,
    seed: int = 0,
    rotation_degrees: float = 20.0,
    shear: float = 0.2,
    scale: tuple[float, float] = (0.8, 1.2),
    side: int = SIDE,
    batch: int = 2000,
) -> tuple[torch.Tensor, torch.Tensor]:
    """affnist-synth: random affine maps of digits uint8 (N, 28, 28) on a side x side canvas.

    Rotation in +-rotation_degrees, shear in +-shear, per-axis scale in ``scale`` about the
    canvas centre (bilinear), then an integer translation drawn so the ink stays inside.
    Returns images uint8 (N, side, side) and the parameters float (N, 6) =
    (degrees, shear, scale_x, scale_y, shift_x, shift_y).
    """
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(seed)
    n = images.shape[0]
    u = torch.rand(n, 4, generator=generator, dtype=torch.float64)  # (N, 4)
    degrees = (2 * u[:, 0] - 1) * rotation_degrees
    shears = (2 * u[:, 1] - 1) * shear
    scales = scale[0] + (scale[1] - scale[0]) * u[:, 2:4]  # (N, 2)
    theta = torch.deg2rad(degrees)
    cos, sin = torch.cos(theta), torch.sin(theta)
    rot = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], 1)  # (N,2,2)
    sh = torch.eye(2, dtype=torch.float64).repeat(n, 1, 1)
    sh[:, 0, 1] = shears
    forward = rot @ sh @ torch.diag_embed(scales)  # (N, 2, 2), output = forward @ input
    inverse = torch.linalg.inv(forward).float()  # (N, 2, 2)
    pad = (side - images.shape[1]) // 2
    canvas = F.pad(images, (pad, side - images.shape[2] - pad, pad, side - images.shape[1] - pad))

    def warp(shift: torch.Tensor) -> torch.Tensor:  # shift float (N, 2) pixels (x, y)
        out = []
        for start in range(0, n, batch):
            stop = min(n, start + batch)
            affine = torch.cat(
                [
                    inverse[start:stop],
                    -(inverse[start:stop] @ (2 * shift[start:stop] / side)[..., None]),
                ],
                2,
            )  # (B, 2, 3)
            src = canvas[start:stop, None].float()  # (B, 1, side, side)
            grid = F.affine_grid(affine, list(src.shape), align_corners=False)
            out.append(
                F.grid_sample(
                    src, grid, mode="bilinear", padding_mode="zeros", align_corners=False
                )[:, 0]
            )  # (B, side, side)
        return torch.cat(out).round_().clamp_(0, 255).to(torch.uint8)  # (N, side, side)

    centred = warp(torch.zeros(n, 2))
    ink = centred > 0  # (N, side, side)
    axis = torch.arange(side)
    draws = torch.rand(n, 2, generator=generator)  # (N, 2) for (x, y)
    shift = torch.zeros(n, 2)  # (N, 2) pixels (x, y)
    for column, mask in ((0, ink.any(1)), (1, ink.any(2))):  # (N, side) columns, then rows
        lo = torch.where(mask, axis, side).amin(1)  # first inked column/row
        hi = torch.where(mask, axis, -1).amax(1)  # last
        low, high = -lo, side - 1 - hi  # integer shifts keeping [lo, hi] on the canvas
        high = torch.maximum(low, high)
        choice = low + (draws[:, column] * (high - low + 1)).floor().long()
        shift[:, column] = torch.minimum(choice, high).float()
    shift[~ink.flatten(1).any(1)] = 0.0
    params = torch.stack(
        [
            degrees.float(),
            shears.float(),
            scales[:, 0].float(),
            scales[:, 1].float(),
            shift[:, 0],
            shift[:, 1],
        ],
        1,
    )  # (N, 6)
    return warp(shift), params


def build_synth(
    root: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    seed: int = 0,
    rotation_degrees: float = 20.0,
    shear: float = 0.2,
    scale: tuple[float, float] = (0.8, 1.2),
    limit: int | None = None,
) -> Path:
    """Write ``out_dir/test.pt``: affnist-synth from the MNIST test split under ``root``."""
    from capsnet.data import mnist
    from capsnet.data.store import atomic_directory, save_prepared

    images, labels = mnist.load_tensors(root, "test", download_missing=False)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    synth, params = synthesize(images, seed, rotation_degrees, shear, tuple(scale))
    with atomic_directory(out_dir) as tmp:
        save_prepared(
            tmp / "test.pt",
            {"images": synth, "labels": labels, "affine": params},
            dataset="affnist-synth",
            split="test",
            synthetic=True,
            note=SYNTH_NOTE,
            seed=seed,
            rotation_degrees=rotation_degrees,
            shear=shear,
            scale=list(scale),
            count=int(labels.shape[0]),
        )
    return Path(out_dir)


def load_real(
    root: str | os.PathLike, split: str = "test", mnist_split: Callable | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The real affNIST ``split`` (test or test-centered) from prepared or raw files."""
    from capsnet.data.store import load_prepared

    if split not in ("test", "test-centered"):
        raise DataError(
            f"affnist split {split!r} unknown; choose test or test-centered "
            "(train on expanded-mnist, the Sabour protocol)"
        )
    prepared = Path(root) / "prepared" / "affnist" / f"{split}.pt"
    if prepared.is_file():
        tensors, _ = load_prepared(prepared)
        return tensors["images"], tensors["labels"]
    raw = Path(root) / "raw" / "affnist" / ("test_batches" if split == "test" else "test")
    files = _mat_files(raw) if raw.is_dir() else []
    if not files:
        raise DataError(
            f"{prepared}: real affNIST not prepared and no .mat files in {raw}; "
            "download it (`capsnet data download affnist`) or use affnist-synth"
        )
    return read_mats(files)


def load_synth(
    root: str | os.PathLike, split: str = "test", mnist_split: Callable | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """affnist-synth test images: the prepared file, else generated with default settings."""
    from capsnet.data.store import load_prepared

    if split != "test":
        raise DataError(f"affnist-synth split {split!r} unknown; it is a test set only")
    prepared = Path(root) / "prepared" / "affnist-synth" / "test.pt"
    if prepared.is_file():
        tensors, _ = load_prepared(prepared)
        return tensors["images"], tensors["labels"]
    if mnist_split is None:
        raise DataError(f"{prepared}: not prepared")
    images, labels = mnist_split("test")
    return synthesize(images)[0], labels


def evaluation_set(root: str | os.PathLike, **kwargs):
    """(dataset, name): real affNIST test when it is present under ``root``, otherwise
    affnist-synth; ``name`` says which, so results are never mislabelled."""
    from capsnet.data.datasets import load

    try:
        return load("affnist", "test", root, **kwargs), "affnist"
    except DataError:
        return load("affnist-synth", "test", root, **kwargs), "affnist-synth"
