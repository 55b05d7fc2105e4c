"""The ``viewpoints`` section: the smallNORB novel-viewpoint experiment (Hinton et al. 2018).

Model names and config overrides are checked against the registry when the experiment
starts (the registry needs torch; this module must not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from capsnet.config.schema import (
    MAX_BATCH,
    MAX_CHECKS_PER_EPOCH,
    MAX_EPOCHS,
    MAX_ITEMS,
    Invalid,
    Section,
    above,
    at_least,
    count,
    seeds,
)
from capsnet.config.sweep import Precision, check_schedule, seed_list

Kind = Literal["azimuth", "elevation"]
MatchRule = Literal["first", "nearest", "lowest"]
KINDS: tuple[str, ...] = ("azimuth", "elevation")
ROLES: tuple[str, ...] = ("capsules", "cnn")
#: Whether each role's model must be a capsule network (the registry's ``capsules``).
ROLE_CAPSULES: dict[str, bool] = {"capsules": True, "cnn": False}
DATA_FIELDS = ("in_channels", "input_size", "num_classes")  # set by the data, never by params


@dataclass(frozen=True)
class PerModelFloat:
    """One number for each of the two models."""

    capsules: float = 0.0
    cnn: float = 0.0

    def __post_init__(self):
        for role in ROLES:
            at_least(self, role, 0)


@dataclass(frozen=True)
class PerModelEpochs:
    """The epochs of each of the two models, both named (None: not given)."""

    capsules: int | None = None
    cnn: int | None = None

    def __post_init__(self):
        for role in ROLES:
            if getattr(self, role) is None:
                raise Invalid(role, "missing: name both capsules and cnn, or give one number")
            count(self, role, 1, MAX_EPOCHS)


@dataclass(frozen=True)
class PerModelCount:
    """A whole number of at least 1 for each of the two models, 1 unless given."""

    capsules: int = 1
    cnn: int = 1

    def __post_init__(self):
        for role in ROLES:
            count(self, role, 1, MAX_CHECKS_PER_EPOCH)


@dataclass(frozen=True)
class PerModelOverrides:
    """Model config overrides (``capsnet.models.build`` keywords) for each model."""

    capsules: dict[str, Any] = field(default_factory=dict)
    cnn: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        for role in ROLES:
            fixed = sorted(set(getattr(self, role)) & set(DATA_FIELDS))
            if fixed:
                raise Invalid(role, f"{', '.join(fixed)} follow the data; remove them")


def _capsules_weight_decay() -> PerModelFloat:
    return PerModelFloat(capsules=2e-7, cnn=0.0)  # EM paper: 2e-7 instead of reconstruction


@dataclass(frozen=True)
class ViewpointsParams(Section):
    """Train capsules and the CNN on the familiar viewpoints of each kind, measure familiar
    and novel test error after every epoch, compare both at matched familiar error."""

    SECTION: ClassVar[str] = "viewpoints"

    kinds: tuple[Kind, ...] = KINDS
    capsules: str = "em-capsnet-small"
    cnn: str = "smallnorb-cnn"
    overrides: PerModelOverrides = field(default_factory=PerModelOverrides)
    channels: int = 2  # 1: the left stereo image only; 2: both
    epochs: int | PerModelEpochs = 20  # one for both, or {capsules: ..., cnn: ...}
    batch_size: int = 64
    lr: float | PerModelFloat = 3e-3  # one for both, or {capsules: ..., cnn: ...}
    # the learning rate times lr_decay every lr_decay_steps steps; null: TrainConfig's
    lr_decay: float | None = None
    lr_decay_steps: int | None = None
    weight_decay: PerModelFloat = field(default_factory=_capsules_weight_decay)
    train_limit: int | None = None  # first N familiar training images (null: all)
    test_limit: int | None = None  # N familiar and N novel test images per epoch (null: all)
    tolerance: float = 0.005  # |familiar error gap| that still counts as matched
    # which check of each model is compared (capsnet.evaluation.viewpoint_matching.RULES):
    # first: its first at or below the target; nearest: that or its lowest error before it,
    # whichever is nearer the target; lowest: the lowest error both reach within the
    # tolerance of each other
    match: MatchRule = "first"
    # familiar and novel test error measured this often per epoch; each check is a
    # candidate for the match (a model that learns fast needs more to be matched)
    checks_per_epoch: PerModelCount = field(default_factory=PerModelCount)
    seed: int = 0
    seeds: int = 1  # runs with the seeds seed, seed + 1, ... (each kind, both models)
    out_dir: str = "models-viewpoints"
    device: str = "auto"
    compile: bool = False  # torch.compile the capsules' EM routing (TrainConfig.compile)
    amp: Precision | None = None  # auto | bf16 | fp32 (TrainConfig.amp); null: TrainConfig's

    def __post_init__(self):
        if not self.kinds:
            raise Invalid("kinds", f"list one or both of {', '.join(KINDS)}")
        if len(set(self.kinds)) != len(self.kinds):
            raise Invalid("kinds", f"repeats a kind: {list(self.kinds)}")
        for role in ROLES:
            if not getattr(self, role):
                raise Invalid(role, "needs a model name")
        if self.capsules == self.cnn:
            raise Invalid("cnn", f"must differ from viewpoints.capsules ({self.capsules!r})")
        if self.channels not in (1, 2):
            raise Invalid("channels", f"must be 1 or 2, got {self.channels}")
        count(self, "batch_size", 1, MAX_BATCH)
        for name in ("train_limit", "test_limit"):
            count(self, name, 1, MAX_ITEMS)
        seeds(self, "seed", "seeds")
        if not isinstance(self.epochs, PerModelEpochs):  # a PerModelEpochs checks itself
            count(self, "epochs", 1, MAX_EPOCHS)
        if isinstance(self.lr, PerModelFloat):
            for role in ROLES:
                if not getattr(self.lr, role) > 0:
                    raise Invalid(f"lr.{role}", f"must be > 0, got {getattr(self.lr, role)}")
        else:
            above(self, "lr", 0)
        check_schedule(self)
        if not 0 <= self.tolerance <= 1:
            raise Invalid("tolerance", f"must be in [0, 1], got {self.tolerance}")
        if self.test_limit is not None and self.tolerance * self.test_limit < 1:
            raise Invalid(
                "tolerance",
                f"{self.tolerance:g} is less than one of test_limit's {self.test_limit} images "
                f"({1 / self.test_limit:.4g}): a gap is a whole number of images",
            )
        if not self.out_dir:
            raise Invalid("out_dir", "must name a directory")

    def model_name(self, role: str) -> str:
        return self.capsules if role == "capsules" else self.cnn

    def epochs_of(self, role: str) -> int:
        """The epochs of ``role`` (capsules or cnn)."""
        return (
            getattr(self.epochs, role) if isinstance(self.epochs, PerModelEpochs) else self.epochs
        )

    def lr_of(self, role: str) -> float:
        """The learning rate of ``role`` (capsules or cnn)."""
        return getattr(self.lr, role) if isinstance(self.lr, PerModelFloat) else self.lr

    def seed_list(self) -> list[int]:
        """The seeds of the experiment's runs, the first one ``seed``."""
        return seed_list(self.seed, self.seeds)
