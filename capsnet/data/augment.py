"""Training-time augmentation strategies, chosen by name from params.yaml.

Strategies: ``none``, ``shift`` (integer translation up to N px, zero fill), ``rotate`` (up
to +-degrees), ``affine`` (rotation, shear, scale, translation), ``elastic`` (a smoothed
random displacement field). Each has ONE implementation, batched over (B, C, H, W) float
images on their own device with per-example parameters drawn from a torch.Generator on that
device (``augment_batch``): ``fit`` applies it to every training batch after rendering, on
CPU and GPU alike, and ``AugmentedDataset`` (for figures and the data benchmark) to single
items. Only torch is needed; the warps are ``affine_grid`` / ``grid_sample`` (bilinear,
zero fill).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, get_worker_info

from capsnet.config import STRATEGIES, AugmentParams
from capsnet.io.errors import ConfigError


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


def _uniform(low, high, batch: int, generator: torch.Generator) -> torch.Tensor:
    """(B,) float32 uniform in [low, high) on the generator's device."""
    draw = torch.rand(batch, generator=generator, device=generator.device)  # (B,)
    return low + (high - low) * draw


def warp(images: torch.Tensor, matrix: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Resample each image under the pixel-space map p_out = matrix p_in + offset about the
    image centre: images (B, C, H, W), matrix (B, 2, 2), offset (B, 2) pixels (x, y);
    bilinear, zero fill."""
    height, width = images.shape[-2:]
    inverse = _inverse_2x2(matrix.float())  # (B, 2, 2) output -> input, pixels
    # normalised coordinates: x_n = x / (W / 2), y_n = y / (H / 2) about the centre
    # (Python scalars only: a tensor built from a list would be a blocking host copy)
    aspect = torch.stack(
        [
            torch.stack([inverse[:, 0, 0], inverse[:, 0, 1] * (height / width)], -1),
            torch.stack([inverse[:, 1, 0] * (width / height), inverse[:, 1, 1]], -1),
        ],
        1,
    )  # (B, 2, 2)
    moved = (inverse @ offset.float().unsqueeze(-1)).squeeze(-1)  # (B, 2) pixels
    shift = torch.stack([moved[:, 0] / (-width / 2), moved[:, 1] / (-height / 2)], -1)  # (B, 2)
    theta = torch.cat([aspect, shift.unsqueeze(-1)], 2)  # (B, 2, 3)
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)  # (B, H, W, 2)
    return F.grid_sample(images, grid, "bilinear", "zeros", align_corners=False)


def _inverse_2x2(matrix: torch.Tensor) -> torch.Tensor:
    """Closed-form inverse of (B, 2, 2) matrices (torch.linalg.inv checks its result on the
    host, a device sync per batch)."""
    a, b = matrix[:, 0, 0], matrix[:, 0, 1]  # (B,)
    c, d = matrix[:, 1, 0], matrix[:, 1, 1]  # (B,)
    adjugate = torch.stack([torch.stack([d, -b], -1), torch.stack([-c, a], -1)], 1)  # (B, 2, 2)
    return adjugate / (a * d - b * c).view(-1, 1, 1)


def _rotation(radians: torch.Tensor) -> torch.Tensor:
    """(B,) angles -> (B, 2, 2) counter-clockwise rotations in image (x right, y down)."""
    cos, sin = torch.cos(radians), torch.sin(radians)  # (B,)
    return torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], 1)


def random_rotate(images: torch.Tensor, degrees: float, generator: torch.Generator) -> torch.Tensor:
    """Rotate each image about its centre by an angle uniform in [-degrees, degrees]."""
    batch = images.shape[0]
    radians = torch.deg2rad(_uniform(-degrees, degrees, batch, generator))  # (B,)
    offset = torch.zeros(batch, 2, device=images.device)  # (B, 2)
    return warp(images, _rotation(radians), offset)


def random_affine(images: torch.Tensor, params, generator: torch.Generator) -> torch.Tensor:
    """Rotation, shear (x), per-image isotropic scale and translation (integer pixels up to
    ``translate_pixels``), each uniform in its range (``AffineAugment``)."""
    batch = images.shape[0]
    radians = torch.deg2rad(_uniform(-params.degrees, params.degrees, batch, generator))
    shear = torch.deg2rad(_uniform(-params.shear_degrees, params.shear_degrees, batch, generator))
    scale = _uniform(params.scale[0], params.scale[1], batch, generator)  # (B,)
    px = params.translate_pixels
    offset = torch.randint(
        -px, px + 1, (batch, 2), generator=generator, device=generator.device
    ).float()  # (B, 2)
    shear_matrix = torch.zeros(batch, 2, 2, device=images.device)  # (B, 2, 2)
    shear_matrix[:, 0, 0] = 1.0
    shear_matrix[:, 1, 1] = 1.0
    shear_matrix[:, 0, 1] = torch.tan(shear)
    matrix = _rotation(radians) @ shear_matrix * scale.view(-1, 1, 1)  # (B, 2, 2)
    return warp(images, matrix, offset)


def _gaussian_blur(field: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of (B, 2, H, W) displacement fields, zero padded."""
    radius = max(1, math.ceil(3 * sigma))
    taps = torch.arange(-radius, radius + 1, device=field.device, dtype=field.dtype)  # (K,)
    kernel = torch.exp(-0.5 * (taps / sigma) ** 2)
    kernel = kernel / kernel.sum()  # (K,)
    channels = field.shape[1]
    rows = kernel.view(1, 1, -1, 1).expand(channels, 1, -1, 1)  # (2, 1, K, 1)
    cols = kernel.view(1, 1, 1, -1).expand(channels, 1, 1, -1)  # (2, 1, 1, K)
    field = F.conv2d(field, rows, padding=(radius, 0), groups=channels)
    return F.conv2d(field, cols, padding=(0, radius), groups=channels)


def random_elastic(images: torch.Tensor, params, generator: torch.Generator) -> torch.Tensor:
    """Elastic distortion (Simard et al. 2003): a displacement field uniform in [-1, 1] per
    pixel and axis, smoothed by a Gaussian of ``sigma`` px, scaled by ``alpha`` px."""
    batch, _, height, width = images.shape
    noise = torch.rand(batch, 2, height, width, generator=generator, device=generator.device)
    field = _gaussian_blur(noise * 2.0 - 1.0, params.sigma) * params.alpha  # (B, 2, H, W) px
    identity = torch.eye(2, 3, device=images.device).expand(batch, 2, 3)  # (B, 2, 3)
    grid = F.affine_grid(identity, list(images.shape), align_corners=False)  # (B, H, W, 2)
    normalised = torch.stack([field[:, 0] * (2.0 / width), field[:, 1] * (2.0 / height)], -1)
    grid = grid + normalised  # (B, H, W, 2)
    return F.grid_sample(images, grid, "bilinear", "zeros", align_corners=False)


def augment_batch(
    images: torch.Tensor,
    strategy: str,
    params: AugmentParams | None,
    generator: torch.Generator,
) -> torch.Tensor:
    """``strategy`` applied to float images (B, C, H, W) with per-example draws from
    ``generator`` (on images' device): the one implementation of each strategy name."""
    check_strategy(strategy)
    params = params or AugmentParams()
    if strategy == "none" or images.shape[0] == 0:
        return images
    if strategy == "shift":
        return random_shift(images, params.shift.pixels, generator)
    if strategy == "rotate":
        return random_rotate(images, params.rotate.degrees, generator)
    if strategy == "affine":
        return random_affine(images, params.affine, generator)
    return random_elastic(images, params.elastic, generator)


def _derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


class AugmentedDataset(Dataset):
    """Items of an image dataset passed one at a time through ``augment_batch`` (figures,
    the data benchmark; training augments whole batches in ``fit`` instead): float
    (C, H, W) images in [0, 1]. Draws come from a generator seeded from (seed, epoch,
    worker): reproducible, and different per worker and per epoch."""

    def __init__(
        self,
        base,
        strategy: str = "shift",
        params: AugmentParams | None = None,
        seed: int = 0,
    ):
        check_strategy(strategy)
        self.base = base
        self.strategy = strategy
        self.params = params or AugmentParams()
        self.seed = seed
        self.epoch = 0
        self.generator = torch.Generator()
        self.name = f"{getattr(base, 'name', 'dataset')}+{strategy}"
        self.num_classes = getattr(base, "num_classes", 10)
        self.reseed()

    def reseed(self, worker_id: int | None = None) -> None:
        """Seed the draws from (seed, epoch, worker); the main process counts as -1."""
        worker = -1 if worker_id is None else worker_id
        self.generator.manual_seed(_derive_seed(self.seed, self.epoch, worker + 1))

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
        image, target, *_ = self.base[index]  # (C, H, W) float in [0, 1]
        image = augment_batch(image[None], self.strategy, self.params, self.generator)[0]
        return image, target
