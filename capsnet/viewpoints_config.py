"""params.yaml ``viewpoints`` section: the novel-viewpoint experiment (issue 6, SPEC 2.3),
validated by capsnet.config.

No torch import here: the params file is validated before any model code loads. Model
names and config overrides are checked against the registry when the experiment starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from capsnet.errors import ConfigError

Kind = Literal["azimuth", "elevation"]
KINDS: tuple[str, ...] = ("azimuth", "elevation")
ROLES: tuple[str, ...] = ("capsules", "cnn")
DATA_FIELDS = ("in_channels", "input_size", "num_classes")  # set by the data, never by params


def _invalid(key: str, message: str) -> ConfigError:
    return ConfigError(f"params: viewpoints.{key}: {message}")


@dataclass(frozen=True)
class PerModelFloat:
    """One number for each of the two models."""

    capsules: float = 0.0
    cnn: float = 0.0


@dataclass(frozen=True)
class PerModelOverrides:
    """Model config overrides (``capsnet.models.build`` keywords) for each model."""

    capsules: dict[str, Any] = field(default_factory=dict)
    cnn: dict[str, Any] = field(default_factory=dict)


def _capsules_weight_decay() -> PerModelFloat:
    return PerModelFloat(capsules=2e-7, cnn=0.0)  # EM paper: 2e-7 instead of reconstruction


@dataclass(frozen=True)
class ViewpointsParams:
    """Train capsules and the CNN on the familiar viewpoints of each kind, measure familiar
    and novel test error after every epoch, compare both at matched familiar error."""

    kinds: tuple[Kind, ...] = KINDS
    capsules: str = "em-capsnet-small"
    cnn: str = "smallnorb-cnn"
    overrides: PerModelOverrides = field(default_factory=PerModelOverrides)
    channels: int = 2  # 1: the left stereo image only; 2: both
    epochs: int = 20  # per model; every epoch is a candidate for the match
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: PerModelFloat = field(default_factory=_capsules_weight_decay)
    train_limit: int | None = None  # first N familiar training images (null: all)
    test_limit: int | None = None  # N familiar and N novel test images per epoch (null: all)
    tolerance: float = 0.005  # |familiar error gap| that still counts as matched
    seed: int = 0
    out_dir: str = "models-viewpoints"
    device: str = "auto"
    compile: bool = False  # torch.compile the capsules' EM routing (TrainConfig.compile)

    def __post_init__(self):
        if not self.kinds:
            raise _invalid("kinds", f"list one or both of {', '.join(KINDS)}")
        if len(set(self.kinds)) != len(self.kinds):
            raise _invalid("kinds", f"repeats a kind: {list(self.kinds)}")
        if not self.capsules or not self.cnn:
            raise _invalid("capsules" if not self.capsules else "cnn", "needs a model name")
        if self.capsules == self.cnn:
            raise _invalid("cnn", f"must differ from viewpoints.capsules ({self.capsules!r})")
        for role in ROLES:
            fixed = sorted(set(getattr(self.overrides, role)) & set(DATA_FIELDS))
            if fixed:
                raise _invalid(
                    f"overrides.{role}", f"{', '.join(fixed)} follow the data; remove them"
                )
        if self.channels not in (1, 2):
            raise _invalid("channels", f"must be 1 or 2, got {self.channels}")
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise _invalid(name, f"must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise _invalid("lr", f"must be > 0, got {self.lr}")
        for role in ROLES:
            if getattr(self.weight_decay, role) < 0:
                raise _invalid(f"weight_decay.{role}", "must be >= 0")
        for name in ("train_limit", "test_limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise _invalid(name, f"must be >= 1 or null, got {value}")
        if not 0 <= self.tolerance <= 1:
            raise _invalid("tolerance", f"must be in [0, 1], got {self.tolerance}")
        if not self.out_dir:
            raise _invalid("out_dir", "must name a directory")

    def model_name(self, role: str) -> str:
        return self.capsules if role == "capsules" else self.cnn
