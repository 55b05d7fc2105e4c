"""The ``data`` and ``augment`` sections of params.yaml."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from capsnet.config.schema import (
    MAX_ITEMS,
    MAX_PIXELS,
    MAX_SEED,
    Invalid,
    Section,
    at_least,
    at_most,
    count,
    range_pair,
)

#: MultiMNIST pairs per digit: the paper's 1,000 (60M training images) at most.
MAX_PAIRS_PER_DIGIT = 1_000

Merge = Literal["sum-clip", "max"]
Strategy = Literal["none", "shift", "rotate", "affine", "elastic"]
AffnistSource = Literal["synth", "real", "auto"]
SmallnorbSource = Literal["real", "synth", "auto"]
STRATEGIES: tuple[str, ...] = typing.get_args(Strategy)


@dataclass(frozen=True)
class MnistParams:
    enabled: bool = True


@dataclass(frozen=True)
class AffnistSynthParams:
    """affnist-synth: random affine maps of MNIST test digits, 40x40 canvas (data/affnist.md)."""

    seed: int = 0
    rotation_degrees: float = 20.0
    shear: float = 0.2
    scale: tuple[float, float] = (0.8, 1.2)
    limit: int | None = None  # first N MNIST test digits (None: all 10,000)

    def __post_init__(self):
        at_least(self, "rotation_degrees", 0)
        at_least(self, "shear", 0)
        range_pair(self, "scale", 0.01)
        count(self, "limit", 1, MAX_ITEMS)
        count(self, "seed", 0, MAX_SEED)


@dataclass(frozen=True)
class AffnistParams:
    """source: synth (offline default), real (the official files), auto (real when it can be
    downloaded, otherwise synth)."""

    enabled: bool = True
    source: AffnistSource = "synth"
    include_training: bool = False  # also fetch training_and_validation_batches.zip (1.6 GB)
    synth: AffnistSynthParams = field(default_factory=AffnistSynthParams)


@dataclass(frozen=True)
class SmallnorbSynthParams:
    """smallnorb-synth: the rendered stand-in (capsnet.data.smallnorb_synth); ``side`` below
    96 renders smaller images and ``lightings`` below 6 only the first lighting indices
    (4,050 images per split and lighting; tests only: the recorded checksums are of side 96
    and all 6 lightings)."""

    seed: int = 0
    side: int = 96
    lightings: int = 6

    def __post_init__(self):
        count(self, "side", 8, MAX_PIXELS)
        at_least(self, "lightings", 1)
        count(self, "seed", 0, MAX_SEED)
        if self.lightings > 6:
            raise Invalid("lightings", f"{self.lightings} is more than the 6 of smallNORB")


@dataclass(frozen=True)
class SmallnorbParams:
    """source: real (the six official files), synth (the rendered stand-in, smallnorb-synth),
    auto (real when the mirror holds the official files, otherwise synth). Images are
    downsampled to ``size``, standardised per image when ``standardize`` (zero mean, unit
    variance, train and test alike, EM paper), trained on random ``crop`` crops with
    random brightness and contrast and tested on the centre crop."""

    enabled: bool = True
    source: SmallnorbSource = "auto"
    size: int = 48
    crop: int = 32
    brightness: float = 0.2
    contrast: float = 0.2
    standardize: bool = True
    synth: SmallnorbSynthParams = field(default_factory=SmallnorbSynthParams)

    def __post_init__(self):
        count(self, "size", 8, MAX_PIXELS)
        at_least(self, "crop", 1)
        if self.crop > self.size:
            raise Invalid("crop", f"{self.crop} is larger than size {self.size}")
        at_least(self, "brightness", 0)
        at_least(self, "contrast", 0)


@dataclass(frozen=True)
class MultiMnistParams:
    enabled: bool = True
    seed: int = 0
    shift: int = 4
    pad: int = 4
    merge: Merge = "sum-clip"
    train_pairs_per_digit: int = 1
    test_pairs_per_digit: int = 1
    redraw_each_epoch: bool = True

    def __post_init__(self):
        count(self, "shift", 0, MAX_PIXELS)
        count(self, "pad", 0, MAX_PIXELS)
        count(self, "train_pairs_per_digit", 1, MAX_PAIRS_PER_DIGIT)
        count(self, "test_pairs_per_digit", 1, MAX_PAIRS_PER_DIGIT)
        count(self, "seed", 0, MAX_SEED)


#: The data directory a command reads and writes unless told otherwise (``--data-root``,
#: $CAPSNET_DATA); not a params.yaml key, so every stage of a checkout shares it.
DATA_ROOT = "data"


@dataclass(frozen=True)
class DataParams(Section):
    SECTION: ClassVar[str] = "data"

    mirror: str = ""
    mnist: MnistParams = field(default_factory=MnistParams)
    affnist: AffnistParams = field(default_factory=AffnistParams)
    smallnorb: SmallnorbParams = field(default_factory=SmallnorbParams)
    multimnist: MultiMnistParams = field(default_factory=MultiMnistParams)


# --- augment ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShiftAugment:
    pixels: int = 2

    def __post_init__(self):
        count(self, "pixels", 0, MAX_PIXELS)


@dataclass(frozen=True)
class RotateAugment:
    degrees: float = 15.0

    def __post_init__(self):
        at_least(self, "degrees", 0)


@dataclass(frozen=True)
class AffineAugment:
    degrees: float = 15.0
    shear_degrees: float = 10.0
    scale: tuple[float, float] = (0.9, 1.1)
    translate_pixels: int = 2

    def __post_init__(self):
        at_least(self, "degrees", 0)
        at_least(self, "shear_degrees", 0)
        range_pair(self, "scale", 0.01)
        count(self, "translate_pixels", 0, MAX_PIXELS)


@dataclass(frozen=True)
class ElasticAugment:
    alpha: float = 34.0
    sigma: float = 4.0  # albumentations' ElasticTransform takes sigma >= 1

    def __post_init__(self):
        at_least(self, "alpha", 0)
        at_least(self, "sigma", 1)
        at_most(self, "sigma", MAX_PIXELS)  # the Gaussian kernel grows with sigma


@dataclass(frozen=True)
class AugmentParams(Section):
    """Training augmentation: ``strategy`` (what ``capsnet train`` uses unless --augment says
    otherwise; sweeps name theirs in the space) picks one of the parameter blocks below. The
    draws are seeded by the run's seed."""

    SECTION: ClassVar[str] = "augment"

    strategy: Strategy = "shift"
    shift: ShiftAugment = field(default_factory=ShiftAugment)
    rotate: RotateAugment = field(default_factory=RotateAugment)
    affine: AffineAugment = field(default_factory=AffineAugment)
    elastic: ElasticAugment = field(default_factory=ElasticAugment)
