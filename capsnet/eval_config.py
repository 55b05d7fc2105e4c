"""params.yaml ``evaluate`` and ``publish`` sections (issue 5), validated by capsnet.config.

No torch import here: the params file is validated before any model code loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from capsnet.errors import ConfigError

EVAL_DATASETS = (
    "mnist",
    "rotated-mnist",
    "affnist",
    "affnist-synth",
    "expanded-mnist",
    "multimnist",
    "smallnorb",
    "smallnorb-azimuth-familiar",
    "smallnorb-azimuth-novel",
    "smallnorb-elevation-familiar",
    "smallnorb-elevation-novel",
)

WandbMode = Literal["auto", "offline", "online", "disabled"]


def _invalid(key: str, message: str) -> ConfigError:
    """A ConfigError naming the dotted params key, e.g. ``evaluate.robustness.epsilons``."""
    return ConfigError(f"params: {key}: {message}")


def _positive_or_none(value, key: str) -> None:
    if value is not None and value < 1:
        raise _invalid(key, f"must be >= 1 or null, got {value}")


@dataclass(frozen=True)
class RobustnessParams:
    """FGSM and BIM (L-inf) on the first ``limit`` MNIST test images."""

    enabled: bool = True
    epsilons: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3)
    bim_steps: int = 10
    limit: int | None = 500

    def __post_init__(self):
        if not self.epsilons or any(not 0 < e <= 1 for e in self.epsilons):
            raise _invalid(
                "evaluate.robustness.epsilons",
                f"need one or more values in (0, 1], got {self.epsilons}",
            )
        if self.bim_steps < 2:
            raise _invalid(
                "evaluate.robustness.bim_steps",
                f"must be >= 2 (1 step is FGSM), got {self.bim_steps}",
            )
        _positive_or_none(self.limit, "evaluate.robustness.limit")


@dataclass(frozen=True)
class EquivarianceParams:
    """Pose diagnostic: the true class capsule's pose as the input rotates through ``angles``."""

    enabled: bool = True
    angles: tuple[float, ...] = (-60.0, -45.0, -30.0, -15.0, 0.0, 15.0, 30.0, 45.0, 60.0)
    limit: int | None = 300

    def __post_init__(self):
        if len(self.angles) < 3:
            raise _invalid("evaluate.equivariance.angles", "needs at least three angles")
        _positive_or_none(self.limit, "evaluate.equivariance.limit")


@dataclass(frozen=True)
class EvaluateParams:
    """The evaluate stage: every checkpoint under ``models_dir`` on ``datasets``."""

    models_dir: str = "models"
    # More checkpoint directories (e.g. models-smallnorb); a missing one, or one holding
    # DISABLED.txt, is skipped with the reason logged.
    extra_models_dirs: tuple[str, ...] = ()
    # The novel-viewpoint experiment's output (capsnet viewpoints); "" leaves it out.
    viewpoints_dir: str = "models-viewpoints"
    out_dir: str = "eval"
    datasets: tuple[str, ...] = ("mnist", "rotated-mnist", "affnist", "multimnist")
    angles: tuple[float, ...] = (0.0, 15.0, 30.0, 35.0, 45.0, 60.0, 90.0, 135.0, 180.0)
    limit: int | None = None  # first N test images of every dataset (null: all)
    batch_size: int = 500
    device: str = "cpu"
    confusion_angle: float = 35.0
    figure_examples: int = 8
    robustness: RobustnessParams = field(default_factory=RobustnessParams)
    equivariance: EquivarianceParams = field(default_factory=EquivarianceParams)

    def __post_init__(self):
        unknown = [d for d in self.datasets if d not in EVAL_DATASETS]
        if unknown:
            raise _invalid(
                "evaluate.datasets",
                f"{', '.join(unknown)} unknown; choose from {', '.join(EVAL_DATASETS)}",
            )
        if not self.angles:
            raise _invalid("evaluate.angles", "must list at least one angle")
        _positive_or_none(self.limit, "evaluate.limit")
        if self.batch_size < 1:
            raise _invalid("evaluate.batch_size", f"must be >= 1, got {self.batch_size}")
        if not 1 <= self.figure_examples <= 32:
            raise _invalid("evaluate.figure_examples", f"must be 1..32, got {self.figure_examples}")


@dataclass(frozen=True)
class PublishParams:
    """The publish stage: W&B eval runs (offline unless an API key is configured), a W&B
    Report when online, and eval/report.html always."""

    project: str = "capsnet"
    experiment: str = ""  # W&B group; empty: sweep.name
    mode: WandbMode = "auto"
    dir: str = "runs"  # runs/wandb/
    report: bool = True  # a W&B Report (online only)
    html: str = "eval/report.html"
    sweep_results: str = "sweep/results.csv"
