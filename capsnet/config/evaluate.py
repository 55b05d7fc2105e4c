"""The ``evaluate`` and ``publish`` sections of params.yaml."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from capsnet.config import dataset_specs
from capsnet.config.schema import MAX_BATCH, MAX_ITEMS, MAX_STEPS, Invalid, Section, count
from capsnet.config.sweep import WandbMode

EvalDataset = Literal[dataset_specs.EVAL_DATASETS]  # every dataset's evaluation sets
EVAL_DATASETS: tuple[str, ...] = typing.get_args(EvalDataset)


@dataclass(frozen=True)
class RobustnessParams:
    """FGSM and BIM (L-inf) on the first ``limit`` MNIST test images."""

    enabled: bool = True
    epsilons: tuple[float, ...] = (0.05, 0.1, 0.2)
    bim_steps: int = 5
    limit: int | None = 500

    def __post_init__(self):
        if not self.epsilons or any(not 0 < e <= 1 for e in self.epsilons):
            raise Invalid("epsilons", f"need one or more values in (0, 1], got {self.epsilons}")
        if self.bim_steps < 2:
            raise Invalid("bim_steps", f"must be >= 2 (1 step is FGSM), got {self.bim_steps}")
        count(self, "bim_steps", 2, MAX_STEPS)
        count(self, "limit", 1, MAX_ITEMS)


@dataclass(frozen=True)
class EquivarianceParams:
    """Pose diagnostic: the true class capsule's pose as the input rotates through ``angles``."""

    enabled: bool = True
    angles: tuple[float, ...] = (-60.0, -45.0, -30.0, -15.0, 0.0, 15.0, 30.0, 45.0, 60.0)
    limit: int | None = 300

    def __post_init__(self):
        if len(self.angles) < 3:
            raise Invalid("angles", f"needs at least three angles, got {len(self.angles)}")
        count(self, "limit", 1, MAX_ITEMS)


@dataclass(frozen=True)
class EvaluateParams(Section):
    """The evaluate stage: every checkpoint under ``models_dir`` on ``datasets``."""

    SECTION: ClassVar[str] = "evaluate"

    models_dir: str = "models"
    # More checkpoint directories (e.g. models-smallnorb); a missing one, or one holding
    # DISABLED.txt, is skipped with the reason logged.
    extra_models_dirs: tuple[str, ...] = ()
    # The novel-viewpoint experiment's output (capsnet viewpoints); "" leaves it out.
    viewpoints_dir: str = "models-viewpoints"
    out_dir: str = "eval"
    datasets: tuple[EvalDataset, ...] = ("mnist", "rotated-mnist", "affnist", "multimnist")
    angles: tuple[float, ...] = (-90.0, -60.0, -35.0, -15.0, 0.0, 15.0, 35.0, 60.0, 90.0, 180.0)
    limit: int | None = None  # first N test images of every dataset (null: all)
    batch_size: int = 100  # EM routing scores 1.4x faster than in batches of 500 on a CPU
    device: str = "auto"  # auto: cuda, then mps, then cpu (capsnet.training.device.select_device)
    # torch.compile the EM routing of em-capsnet models (EMCapsNet.compile_routing); other
    # models are scored eagerly
    compile: bool = False
    confusion_angle: float = 35.0
    figure_examples: int = 8
    robustness: RobustnessParams = field(default_factory=RobustnessParams)
    equivariance: EquivarianceParams = field(default_factory=EquivarianceParams)

    def __post_init__(self):
        if not self.angles:
            raise Invalid("angles", "must list at least one angle")
        count(self, "limit", 1, MAX_ITEMS)
        count(self, "batch_size", 1, MAX_BATCH)
        if not self.device:
            raise Invalid("device", "must name a device: auto, cpu, cuda, cuda:N or mps")
        if not 1 <= self.figure_examples <= 32:
            raise Invalid("figure_examples", f"must be 1..32, got {self.figure_examples}")


@dataclass(frozen=True)
class PublishParams(Section):
    """The publish stage: W&B eval runs (offline unless an API key is configured), a W&B
    Report when online, and eval/report.html always."""

    SECTION: ClassVar[str] = "publish"

    project: str = "capsnet"
    experiment: str = ""  # W&B group of the eval runs; empty: the sweep that trained each
    mode: WandbMode = "auto"
    dir: str = "runs"  # runs/wandb/
    report: bool = True  # a W&B Report (online only)
    html: str = "eval/report.html"
    sweep_results: str = "sweep/results.csv"
    # the other sweeps the report shows, each with its table and plot
    extra_sweep_results: tuple[str, ...] = ("sweep-smallnorb/results.csv",)
