"""MultiMNIST (Sabour et al. 2017): two shifted digits of different classes on one canvas.

Only the recipe is stored: pairs of source indices into one MNIST split and the shift of
each digit. Images are rendered a batch at a time from the recipe, bit-for-bit the same for
the same seed, so the paper-scale set (1,000 pairs per digit) never touches the disk.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from capsnet.data.store import PreparedSpec, TensorSpec
from capsnet.io.errors import DataError

MERGES = ("sum-clip", "max")
SIDE = 28


@dataclass(frozen=True)
class Recipe:
    """pairs int64 (M, 2) source indices; shifts int64 (M, 4) = (dy_a, dx_a, dy_b, dx_b)."""

    pairs: torch.Tensor
    shifts: torch.Tensor
    shift: int
    pad: int
    seed: int

    def __len__(self) -> int:
        return self.pairs.shape[0]


def check_settings(shift: int, pad: int, merge: str = "sum-clip") -> None:
    if shift < 0:
        raise DataError(f"multimnist: shift must be >= 0, got {shift}")
    if pad < 0:
        raise DataError(f"multimnist: pad must be >= 0, got {pad}")
    if merge not in MERGES:
        raise DataError(f"multimnist: merge {merge!r} unknown; choose one of {', '.join(MERGES)}")


def make_recipe(
    labels: torch.Tensor, pairs_per_digit: int, shift: int, pad: int, seed: int
) -> Recipe:
    """Pair every digit with ``pairs_per_digit`` partners of a different class (same split)
    and draw integer shifts in [-shift, shift] per axis for both digits."""
    check_settings(shift, pad)
    if pairs_per_digit < 1:
        raise DataError(f"multimnist: pairs_per_digit must be >= 1, got {pairs_per_digit}")
    generator = torch.Generator().manual_seed(seed)
    labels = labels.long()
    n = labels.shape[0]
    first = torch.arange(n).repeat_interleave(pairs_per_digit)  # (M,)
    second = torch.empty_like(first)  # (M,)
    for digit in range(10):
        rows = (labels[first] == digit).nonzero().squeeze(1)  # pairs whose first digit is `digit`
        others = (labels != digit).nonzero().squeeze(1)  # candidates of other classes
        if rows.numel() and not others.numel():
            raise DataError("multimnist: the split holds a single class; no pairs possible")
        pick = torch.randint(0, max(1, others.numel()), (rows.numel(),), generator=generator)
        second[rows] = others[pick] if others.numel() else pick
    shifts = torch.randint(-shift, shift + 1, (first.shape[0], 4), generator=generator)  # (M, 4)
    return Recipe(torch.stack([first, second], 1), shifts, shift, pad, seed)


def render_parts(
    images: torch.Tensor, labels: torch.Tensor, recipe: Recipe, index: torch.Tensor | slice
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each digit of the recipe rows ``index`` alone on its shifted canvas: uint8
    (B, 2, S, S), S = 28 + 2 pad, and the two labels int64 (B, 2), in recipe order.

    Each digit is placed with its top-left corner at (pad + dy, pad + dx); ink falling off the
    canvas is clipped.
    """
    check_settings(recipe.shift, recipe.pad)
    pairs = recipe.pairs[index]  # (B, 2)
    digits = place_digits(images, pairs, recipe.shifts[index], recipe.shift, recipe.pad)
    return digits, labels[pairs].long()  # (B, 2, S, S), (B, 2)


def place_digits(
    images: torch.Tensor, pairs: torch.Tensor, shifts: torch.Tensor, shift: int, pad: int
) -> torch.Tensor:
    """Digits ``pairs`` (B, 2) of ``images`` (N, 28, 28), each moved by its (dy, dx) of
    ``shifts`` (B, 4) on a canvas of S = 28 + 2 pad: uint8 (B, 2, S, S), on images' device."""
    shifts = shifts.view(-1, 2, 2)  # (B, 2 digits, (dy, dx))
    batch = pairs.shape[0]
    margin = pad + shift
    side = SIDE + 2 * pad
    sources = torch.nn.functional.pad(images[pairs.reshape(-1)], (margin,) * 4)  # (2B, W, W)
    windows = sources.unfold(1, side, 1).unfold(2, side, 1)  # view (2B, K, K, S, S), K = W-S+1
    origin = shift - shifts.reshape(-1, 2)  # (2B, 2) window corner (row, col)
    rows = torch.arange(2 * batch, device=images.device)  # (2B,)
    digits = windows[rows, origin[:, 0], origin[:, 1]]  # (2B, S, S)
    return digits.view(batch, 2, side, side)  # (B, 2, S, S)


def merge_digits(digits: torch.Tensor, merge: str = "sum-clip") -> torch.Tensor:
    """uint8 (B, 2, S, S) -> (B, S, S): min(a + b, 255) ("sum-clip", official) or max(a, b)."""
    check_settings(0, 0, merge)
    if merge == "max":
        return digits.amax(1)  # (B, S, S)
    return digits.sum(1, dtype=torch.int16).clamp_(max=255).to(torch.uint8)  # (B, S, S)


def multi_hot(pair_labels: torch.Tensor) -> torch.Tensor:
    """int (B, 2) labels -> float (B, 10) multi-hot targets."""
    targets = torch.zeros(pair_labels.shape[0], 10, device=pair_labels.device)
    return targets.scatter_(1, pair_labels, 1.0)  # (B, 10)


def render(
    images: torch.Tensor,
    labels: torch.Tensor,
    recipe: Recipe,
    index: torch.Tensor | slice,
    merge: str = "sum-clip",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Render the recipe rows ``index``: the merge of the two digits of ``render_parts``,
    uint8 (B, 1, S, S), and multi-hot targets float (B, 10)."""
    check_settings(recipe.shift, recipe.pad, merge)
    digits, pair_labels = render_parts(images, labels, recipe, index)  # (B, 2, S, S), (B, 2)
    return merge_digits(digits, merge).unsqueeze(1), multi_hot(pair_labels)


def bounding_box_overlap(
    images: torch.Tensor, recipe: Recipe, index: torch.Tensor | slice
) -> torch.Tensor:
    """Per rendered pair: intersection area of the two digits' ink bounding boxes divided by
    the area of the smaller box. float (B,)."""
    labels = torch.zeros(images.shape[0], dtype=torch.long)
    digits, _ = render_parts(images, labels, recipe, index)  # (B, 2, S, S)
    ink = digits.flatten(0, 1) > 0  # (2B, S, S)
    rows, cols = ink.any(2), ink.any(1)  # (2B, S)
    ar = torch.arange(ink.shape[1])
    big = ink.shape[1] + 1

    def extent(mask):  # first and last True index per row of mask (2B, S)
        lo = torch.where(mask, ar, big).amin(1)
        hi = torch.where(mask, ar, -1).amax(1)
        return lo.view(-1, 2), hi.view(-1, 2)  # (B, 2)

    (r0, r1), (c0, c1) = extent(rows), extent(cols)
    height = (torch.minimum(r1[:, 0], r1[:, 1]) - torch.maximum(r0[:, 0], r0[:, 1]) + 1).clamp(
        min=0
    )
    width = (torch.minimum(c1[:, 0], c1[:, 1]) - torch.maximum(c0[:, 0], c0[:, 1]) + 1).clamp(min=0)
    areas = (r1 - r0 + 1).clamp(min=0) * (c1 - c0 + 1).clamp(min=0)  # (B, 2)
    return (height * width).float() / areas.amin(1).clamp(min=1).float()


class MultiMNIST(Dataset):
    """(image float (1, S, S) in [0, 1], multi-hot target (10,)) rendered from a recipe;
    with ``components=True`` also each digit alone, float (2, 1, S, S), and the two labels
    int64 (2,) in the same order (what the paper's reconstruction loss compares against).

    ``__getitems__`` renders a whole batch in one vectorised call (the DataLoader uses it).
    With ``redraw=True`` (training) ``set_epoch(e)`` draws a fresh recipe from seed + e.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        recipe: Recipe,
        merge: str = "sum-clip",
        pairs_per_digit: int = 1,
        redraw: bool = False,
        name: str = "multimnist",
        components: bool = False,
    ):
        check_settings(recipe.shift, recipe.pad, merge)
        self.components = components
        self.images = images  # (N, 28, 28) uint8
        self.labels = labels  # (N,) int64
        self.recipe = recipe
        self.merge = merge
        self.pairs_per_digit = pairs_per_digit
        self.redraw = redraw
        self.name = name
        self.base_seed = recipe.seed

    def __len__(self) -> int:
        return len(self.recipe)

    def set_epoch(self, epoch: int) -> None:
        if self.redraw:
            self.recipe = make_recipe(
                self.labels,
                self.pairs_per_digit,
                self.recipe.shift,
                self.recipe.pad,
                self.base_seed + epoch,
            )

    def render(self, index) -> tuple[torch.Tensor, torch.Tensor]:
        """uint8 images (B, 1, S, S) and multi-hot targets (B, 10) for recipe rows ``index``."""
        return render(self.images, self.labels, self.recipe, index, self.merge)

    def __getitems__(self, indices: list[int]):
        index = torch.as_tensor(indices, dtype=torch.long)
        if not self.components:
            images, targets = self.render(index)
            return list(zip(images.float().div_(255.0), targets))
        digits, pair_labels = render_parts(self.images, self.labels, self.recipe, index)
        return list(zip(*self._batch(digits, pair_labels)))

    def _batch(self, digits: torch.Tensor, pair_labels: torch.Tensor) -> tuple:
        """(images float (B, 1, S, S), multi-hot (B, 10)[, each digit alone float
        (B, 2, 1, S, S), labels (B, 2)]) from the placed digits uint8 (B, 2, S, S)."""
        images = merge_digits(digits, self.merge).unsqueeze(1).float().div_(255.0)  # (B,1,S,S)
        if not self.components:
            return images, multi_hot(pair_labels)
        parts = digits.unsqueeze(2).float().div_(255.0)  # (B, 2, 1, S, S)
        return images, multi_hot(pair_labels), parts, pair_labels

    def __getitem__(self, index: int):
        return self.__getitems__([index])[0]

    def resident_tensors(self) -> dict[str, torch.Tensor]:
        """MNIST digits, labels, the recipe, and the digits sorted by class (for redraws)."""
        order = torch.argsort(self.labels, stable=True)  # (N,) digits grouped by class
        counts = torch.bincount(self.labels, minlength=10)  # (10,)
        return {
            "images": self.images,
            "labels": self.labels,
            "pairs": self.recipe.pairs,
            "shifts": self.recipe.shifts,
            "by_class": order,
            "class_start": torch.cumsum(counts, 0) - counts,  # (10,)
            "class_count": counts,
        }

    def render_batch(self, tensors, index, epoch, generator) -> tuple:
        """The ``DeviceRenderable`` batch of recipe rows ``index``: with ``redraw`` each
        first digit gets a fresh partner of another class and fresh shifts from
        ``generator`` (what ``set_epoch`` draws on the host), else the stored recipe.
        (images (B, 1, S, S), multi-hot (B, 10)[, digits (B, 2, 1, S, S), labels (B, 2)])."""
        pairs, shifts = tensors["pairs"][index], tensors["shifts"][index]  # (B, 2), (B, 4)
        if self.redraw:
            pairs = torch.stack([pairs[:, 0], _other_class(tensors, pairs[:, 0], generator)], 1)
            shift = self.recipe.shift
            shifts = torch.randint(
                -shift, shift + 1, shifts.shape, generator=generator, device=shifts.device
            )  # (B, 4)
        digits = place_digits(tensors["images"], pairs, shifts, self.recipe.shift, self.recipe.pad)
        return self._batch(digits, tensors["labels"][pairs].long())

    def materialize(self, limit: int | None = None):
        """A TensorImageDataset of the first ``limit`` rendered items (for evaluation)."""
        from capsnet.data.tensors import TensorImageDataset

        stop = len(self) if limit is None else min(limit, len(self))
        images, targets = self.render(slice(0, stop))
        return TensorImageDataset(images, targets, self.name)


def _other_class(
    tensors: dict[str, torch.Tensor], first: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """A uniformly drawn digit of a class other than each ``first`` digit's: (B,) indices.

    A draw r in [0, N - n_d) over the class-sorted digits skips the n_d digits of class d."""
    labels = tensors["labels"][first]  # (B,)
    count = tensors["class_count"][labels]  # (B,)
    start = tensors["class_start"][labels]  # (B,)
    total = tensors["labels"].shape[0]
    draw = torch.rand(first.shape[0], generator=generator, device=first.device)  # (B,)
    position = torch.minimum((draw * (total - count)).long(), total - count - 1)  # (B,)
    position = torch.where(position < start, position, position + count)  # (B,)
    return tensors["by_class"][position]


def build(
    root: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    seed: int,
    shift: int,
    pad: int,
    merge: str,
    train_pairs_per_digit: int,
    test_pairs_per_digit: int,
    redraw_each_epoch: bool = True,
) -> Path:
    """Write ``out_dir/{train,test}.pt`` recipes over the MNIST splits under data ``root``
    (the test recipe is drawn from ``seed + 1`` and never redrawn)."""
    from capsnet.config.dataset_specs import PREPARED_FILES
    from capsnet.data import mnist
    from capsnet.data.store import save_prepared
    from capsnet.io.outputset import atomic_directory

    check_settings(shift, pad, merge)
    per_split = {"train": (train_pairs_per_digit, seed), "test": (test_pairs_per_digit, seed + 1)}
    with atomic_directory(out_dir, PREPARED_FILES) as tmp:
        for split, (per_digit, split_seed) in per_split.items():
            _, labels = mnist.load_tensors(root, split, download_missing=False)
            recipe = make_recipe(labels, per_digit, shift, pad, split_seed)
            save_prepared(
                tmp / f"{split}.pt",
                {"pairs": recipe.pairs, "shifts": recipe.shifts},
                dataset="multimnist",
                split=split,
                seed=split_seed,
                shift=shift,
                pad=pad,
                merge=merge,
                pairs_per_digit=per_digit,
                redraw=redraw_each_epoch and split == "train",
                count=len(recipe),
            )
    return Path(out_dir)


def load(
    root: str | os.PathLike,
    split: str,
    mnist_split,
    seed: int | None = None,
    merge: str | None = None,
    redraw: bool | None = None,
    shift: int = 4,
    pad: int = 4,
    components: bool = False,
) -> MultiMNIST:
    """The MultiMNIST ``split``: the prepared recipe (and its settings) when present, else a
    fresh recipe with one pair per digit from ``seed`` (default 0 train, 1 test). With
    ``components`` items also carry each digit's own image and the two labels."""
    from capsnet.data.store import load_prepared, prepared_error

    images, labels = mnist_split(split)
    prepared = Path(root) / "prepared" / "multimnist" / f"{split}.pt"
    if prepared.is_file() and seed is None:
        tensors, meta = load_prepared(prepared, "multimnist")
        if int(tensors["pairs"].max()) >= labels.shape[0]:
            past = f"recipe indexes past the {labels.shape[0]} MNIST {split} digits"
            raise prepared_error(prepared, past, "multimnist")
        recipe = Recipe(
            tensors["pairs"],
            tensors["shifts"],
            int(meta["shift"]),
            int(meta["pad"]),
            int(meta["seed"]),
        )
        merge = merge or meta.get("merge", "sum-clip")
        redraw = bool(meta.get("redraw", split == "train")) if redraw is None else redraw
        per_digit = int(meta.get("pairs_per_digit", 1))
    else:
        seed = (0 if split == "train" else 1) if seed is None else seed
        per_digit = 1
        recipe = make_recipe(labels, per_digit, shift, pad, seed)
    if redraw is None:
        redraw = split == "train"
    name = f"multimnist-{split}"
    return MultiMNIST(
        images, labels, recipe, merge or "sum-clip", per_digit, redraw, name, components
    )


def load_dataset(request, **options) -> MultiMNIST:
    """The registry loader."""
    from capsnet.data import mnist

    split = mnist.split_loader(request)
    return load(request.root, request.split, split, seed=request.seed, **options)


def prepare_stage(root: Path, out: Path, section) -> Path:
    """The prepare stage: recipes from ``data.multimnist``."""
    m = section
    return build(
        root, out, seed=m.seed, shift=m.shift, pad=m.pad, merge=m.merge,
        train_pairs_per_digit=m.train_pairs_per_digit,
        test_pairs_per_digit=m.test_pairs_per_digit, redraw_each_epoch=m.redraw_each_epoch,
    )  # fmt: skip


PREPARED = PreparedSpec(
    {
        "pairs": TensorSpec(torch.int64, ("M", 2), 0),  # (M, 2) MNIST indices
        "shifts": TensorSpec(torch.int64, ("M", 4), "-shift", "shift"),  # (M, 4)
    },
    {"shift": int, "pad": int, "seed": int, "merge": MERGES, "pairs_per_digit": int},
)


def evaluation_set(name: str, request, root: Path, load, channels: int = 1):
    """The evaluation's MultiMNIST test pairs, rendered once (``evaluate.limit`` of them)."""
    return load(name).materialize(request.params.limit), {}
