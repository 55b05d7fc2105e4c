"""affNIST (data/affnist.md): the real test set, expanded MNIST for training, and affnist-synth.

The official archives have no published checksum. They are verified instead by the CRC-32
of every zip member (a truncated or altered download fails), the expected member count
(32 batches in each transformed archive) and, when prepared, by parsing: every .mat must
hold the ``affNISTdata`` fields with 1600-pixel columns and labels 0..9.

``affnist-synth`` is a clearly named stand-in for offline machines: random affine maps of
the MNIST test digits with the ranges of data/affnist.md. It is never reported as affNIST.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

from capsnet.data.batches import RenderedItems
from capsnet.data.sources import RemoteFile, check_zip, fetch, safe_extract_zip
from capsnet.data.store import PreparedSpec, TensorSpec, digits
from capsnet.data.tensors import TensorImageDataset
from capsnet.io.errors import DataError

OFFICIAL_BASE = "https://www.cs.toronto.edu/~tijmen/affNIST/32x/"
ARCHIVES = {  # official file name -> path under the 32x/ folder
    "test_batches.zip": "transformed/test_batches.zip",
    "test.mat.zip": "just_centered/test.mat.zip",
    "training_and_validation_batches.zip": "transformed/training_and_validation_batches.zip",
}
BATCHES = 32
SIDE = 40
PREPARED = PreparedSpec(digits(SIDE))
PREPARED_SYNTH = PreparedSpec(
    {**digits(SIDE), "affine": TensorSpec(torch.float32, ("N", 6), required=False)}
)
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
    from capsnet.config.dataset_specs import PREPARED_FILES
    from capsnet.data.store import save_prepared
    from capsnet.io.outputset import atomic_directory

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
    with atomic_directory(out_dir, PREPARED_FILES) as tmp:
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


def place(digits: torch.Tensor, offsets: torch.Tensor, side: int = SIDE) -> torch.Tensor:
    """Digits uint8 (B, h, w) on a black side x side canvas with their top-left corner at
    ``offsets`` int64 (B, 2) (row, column) -> uint8 (B, side, side), on their device."""
    batch, height, width = digits.shape
    axis = torch.arange(side, device=digits.device)  # (side,)
    rows = axis[None, :] - offsets[:, :1]  # (B, side) source row of each canvas row
    cols = axis[None, :] - offsets[:, 1:]  # (B, side)
    inside = ((rows >= 0) & (rows < height))[:, :, None] & ((cols >= 0) & (cols < width))[:, None]
    picked = digits[
        torch.arange(batch, device=digits.device)[:, None, None],
        rows.clamp(0, height - 1)[:, :, None],
        cols.clamp(0, width - 1)[:, None, :],
    ]  # (B, side, side)
    return picked * inside


class ExpandedMnist(RenderedItems):
    """Expanded MNIST for training: each digit placed anew every epoch at a uniformly random
    offset on the 40x40 canvas (Sabour et al.'s protocol). Batches are rendered on the
    training device (``resident_tensors`` / ``render_batch``); items, for a DataLoader, are
    the same transform seeded per (seed, epoch, index)."""

    num_classes = 10

    def __init__(self, digits: torch.Tensor, labels: torch.Tensor, seed: int = 0, name: str = ""):
        self.digits, self.labels = digits, labels  # (N, 28, 28) uint8, (N,)
        self.seed, self.epoch, self.name = seed, 0, name or "expanded-mnist-train"

    def __len__(self) -> int:
        return self.digits.shape[0]

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        return {"digits": self.digits, "labels": self.labels}

    def render_batch(self, tensors, index, epoch, generator):
        """(images float32 (B, 1, 40, 40) in [0, 1], labels (B,)) of the items ``index``,
        placed at offsets drawn from ``generator``, all on the device of ``tensors``."""
        digits = tensors["digits"][index]  # (B, 28, 28)
        room = SIDE - digits.shape[-1] + 1
        offsets = torch.randint(
            0, room, (index.shape[0], 2), generator=generator, device=digits.device
        )  # (B, 2)
        images = place(digits, offsets).unsqueeze(1).float().div_(255.0)  # (B, 1, 40, 40)
        return images, tensors["labels"][index]

    def take(self, start: int, stop: int, fixed: bool = False):
        """Items ``start`` to ``stop``: re-placed each epoch, or (``fixed``, for validation)
        placed once from the seed."""
        digits, labels = self.digits[start:stop], self.labels[start:stop]
        if fixed:
            return TensorImageDataset(expand(digits, self.seed), labels, f"{self.name}-val")
        return ExpandedMnist(digits, labels, self.seed, self.name)


def synthesize(
    images: torch.Tensor,
    seed: int = 0,
    rotation_degrees: float = 20.0,
    shear: float = 0.2,
    scale: tuple[float, float] = (0.8, 1.2),
    side: int = SIDE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """affnist-synth: random affine maps of digits uint8 (N, 28, 28) on a side x side canvas.

    Rotation in +-rotation_degrees, shear in +-shear, per-axis scale in ``scale`` about the
    canvas centre (bilinear, exact: ``capsnet.data.resample``), then an integer translation
    drawn so the ink stays inside. Returns images uint8 (N, side, side) and the parameters
    float (N, 6) = (degrees, shear, scale_x, scale_y, shift_x, shift_y).
    """
    import torch.nn.functional as F

    from capsnet.data.resample import warp_about_centre

    generator = torch.Generator().manual_seed(seed)
    n = images.shape[0]
    u = torch.rand(n, 4, generator=generator, dtype=torch.float64)  # (N, 4)
    degrees = (2 * u[:, 0] - 1) * rotation_degrees  # (N,)
    shears = (2 * u[:, 1] - 1) * shear  # (N,)
    scales = scale[0] + (scale[1] - scale[0]) * u[:, 2:4]  # (N, 2)
    inverse = _inverse_maps(degrees, shears, scales)  # (N, 2, 2)
    pad = (side - images.shape[1]) // 2
    canvas = F.pad(images, (pad, side - images.shape[2] - pad, pad, side - images.shape[1] - pad))
    canvas = canvas[:, None]  # (N, 1, side, side)
    centred = warp_about_centre(canvas, inverse)[:, 0]  # (N, side, side)
    shift = _ink_preserving_shifts(centred > 0, torch.rand(n, 2, generator=generator))  # (N, 2)
    warped = warp_about_centre(canvas, inverse, shift.double())[:, 0]  # (N, side, side)
    params = torch.stack([degrees, shears, scales[:, 0], scales[:, 1]], 1).float()  # (N, 4)
    return warped, torch.cat([params, shift], 1)  # (N, side, side), (N, 6)


def _inverse_maps(degrees: torch.Tensor, shears: torch.Tensor, scales: torch.Tensor):
    """Inverses float64 (N, 2, 2) of forward = rotation @ shear @ diag(scales), the map from
    a digit's (x, y) offset from the centre to its place on the output, entry by entry in
    float64 (no matrix kernels)."""
    from capsnet.data.resample import sin_cos_degrees

    pairs = [sin_cos_degrees(d) for d in degrees.tolist()]
    sin, cos = torch.tensor(pairs, dtype=torch.float64).unbind(1)  # (N,) each
    sx, sy = scales.unbind(1)  # (N,) each
    a, b = cos * sx, (cos * shears - sin) * sy  # forward row 0: rot @ [[sx, s sy], [0, sy]]
    c, d = sin * sx, (sin * shears + cos) * sy  # forward row 1
    det = a * d - b * c  # (N,) = sx sy > 0
    return torch.stack([torch.stack([d, -b], 1), torch.stack([-c, a], 1)], 1) / det[:, None, None]


def _ink_preserving_shifts(ink: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Integer shifts float (N, 2) = (x, y), uniform over those keeping the inked pixels of
    ink bool (N, side, side) on the canvas; ``draws`` float (N, 2) uniform in [0, 1)."""
    n, side = ink.shape[0], ink.shape[-1]
    axis = torch.arange(side)
    shift = torch.zeros(n, 2)  # (N, 2) pixels (x, y)
    for column, mask in ((0, ink.any(1)), (1, ink.any(2))):  # (N, side) columns, then rows
        lo = torch.where(mask, axis, side).amin(1)  # first inked column/row
        hi = torch.where(mask, axis, -1).amax(1)  # last
        low, high = -lo, side - 1 - hi  # integer shifts keeping [lo, hi] on the canvas
        high = torch.maximum(low, high)
        choice = low + (draws[:, column] * (high - low + 1)).floor().long()
        shift[:, column] = torch.minimum(choice, high).float()
    shift[~ink.flatten(1).any(1)] = 0.0
    return shift


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
    from capsnet.config.dataset_specs import PREPARED_FILES
    from capsnet.data import mnist
    from capsnet.data.store import save_prepared
    from capsnet.io.outputset import atomic_directory

    images, labels = mnist.load_tensors(root, "test", download_missing=False)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    synth, params = synthesize(images, seed, rotation_degrees, shear, tuple(scale))
    with atomic_directory(out_dir, PREPARED_FILES) as tmp:
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
        tensors, _ = load_prepared(prepared, "affnist")
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
        tensors, _ = load_prepared(prepared, "affnist-synth")
        return tensors["images"], tensors["labels"]
    if mnist_split is None:
        raise DataError(f"{prepared}: not prepared")
    images, labels = mnist_split("test")
    return synthesize(images)[0], labels


def evaluation_set(root: str | os.PathLike, mnist_split: Callable | None = None):
    """(dataset, name): real affNIST test when it is present under ``root``, otherwise
    affnist-synth; ``name`` says which, so results are never mislabelled. A real file that
    is present but damaged is an error, not a reason to fall back."""
    try:
        images, labels = load_real(root, "test", mnist_split)
        name = "affnist"
    except DataError:
        if (Path(root) / "prepared" / "affnist" / "test.pt").is_file():
            raise
        images, labels = load_synth(root, "test", mnist_split)
        name = "affnist-synth"
    return TensorImageDataset(images, labels, f"{name}-test"), name


def load_expanded(request):
    """The registry loader of expanded-mnist: MNIST ``request.split`` on the 40x40 canvas,
    placed from ``request.seed`` (0 when None); the training set re-places its digits every
    epoch (``ExpandedMnist``)."""
    from capsnet.data import mnist

    images, labels = mnist.split_loader(request)(request.split)
    seed = 0 if request.seed is None else request.seed
    name = f"expanded-mnist-{request.split}"
    if request.split == "train":
        return ExpandedMnist(images, labels, seed, name)
    return TensorImageDataset(expand(images, seed=seed), labels, name)


def load_real_dataset(request):
    """The registry loader of affnist (the real test set)."""
    images, labels = load_real(request.root, request.split)
    return TensorImageDataset(images, labels, f"affnist-{request.split}")


def load_synth_dataset(request):
    """The registry loader of affnist-synth."""
    from capsnet.data import mnist

    images, labels = load_synth(request.root, request.split, mnist.split_loader(request))
    return TensorImageDataset(images, labels, f"affnist-synth-{request.split}")


def download_stage(out: Path, section, mirror, progress: bool, stand_in=None) -> Path:
    """The download stage: the archives (data.affnist.source real or auto), a DISABLED.txt
    when synth, or when auto and the real files are unreachable."""
    from capsnet.config.dataset_specs import RAW_FILES
    from capsnet.io.outputset import write_disabled

    if section.source == "synth":
        reason = "data.affnist.source is synth: the real files are not used"
        return write_disabled(out, reason, own=RAW_FILES)
    try:
        download(out, mirror, section.include_training, progress)
    except DataError as exc:
        if section.source != "auto":
            raise
        return write_disabled(
            out,
            f"data.affnist.source is auto and the real files are "
            f"unreachable, so evaluation uses affnist-synth: {exc}",
            own=RAW_FILES,
        )
    return out


def prepare_stage(root: Path, out: Path, section) -> Path:
    """The prepare stage of the real files."""
    return prepare(root / "raw" / "affnist", out)


def prepare_synth_stage(root: Path, out: Path, section) -> Path:
    """The prepare stage of affnist-synth (data.affnist.synth)."""
    s = section.synth
    return build_synth(
        root, out, seed=s.seed, rotation_degrees=s.rotation_degrees, shear=s.shear,
        scale=s.scale, limit=s.limit,
    )  # fmt: skip


def evaluation_set_of(name: str, request, root: Path, load, channels: int = 1):
    """The evaluation's affNIST set: real affNIST test when prepared, else affnist-synth;
    info records which (``source``)."""
    from capsnet.data import mnist

    def mnist_split(which: str):
        return mnist.load_tensors(root, which, True, request.mirror)

    dataset, source = evaluation_set(root, mnist_split)
    return dataset.subset(request.params.limit), {"source": source}


def synth_evaluation_set(name: str, request, root: Path, load, channels: int = 1):
    """The evaluation's affnist-synth set, its source recorded."""
    return load(name).subset(request.params.limit), {"source": name}
