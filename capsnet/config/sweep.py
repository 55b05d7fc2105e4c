"""The ``sweep``, ``train``, ``smallnorb_sweep`` and ``smallnorb_train`` sections.

A searched parameter (``Searched[T]``, validated by capsnet.config.schema) is a fixed value
or a one-key mapping naming how Tune draws it::

    routing_iterations: {grid: [1, 2, 3, 5]}   # every value, crossed with other grids
    lr: {loguniform: [0.0003, 0.003]}          # sampled num_samples times
    augment: {choice: [none, shift]}           # sampled
    m_plus: 0.9                                # fixed

``pipeline/tune.py`` turns these into Tune's search space. The smallNORB classes are the
same schema with the EM paper's defaults; ``SECTION`` names the section that
``Cls.from_dict`` errors point to.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from capsnet.config import dataset_specs
from capsnet.config.data import Strategy
from capsnet.config.schema import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_ITEMS,
    MAX_RUNS,
    Invalid,
    Searched,
    Section,
    above,
    at_least,
    at_most,
    count,
    dimension_choices,
    dimension_values,
    seeds,
)

Dataset = Literal[dataset_specs.SWEEP_DATASETS]  # the dataset specs'
Metric = Literal["val_accuracy", "val_rotated_accuracy"]
Pose = Literal["matrix", "vector"]
RoutingScope = Literal["global", "window"]
Loss = Literal["auto", "margin", "cross-entropy", "spread"]
WandbMode = Literal["auto", "offline", "online", "disabled"]
OptimizerState = Literal["auto", "always", "never"]
ExtraDataset = Literal[dataset_specs.EXTRA_DATASETS]
Precision = Literal["auto", "bf16", "fp32"]

DATASETS: tuple[str, ...] = typing.get_args(Dataset)
POSES: tuple[str, ...] = typing.get_args(Pose)
#: The training losses (capsnet.training.fit reads them from here): auto is the model's own.
LOSSES: tuple[str, ...] = typing.get_args(Loss)
EXTRA_DATASETS: tuple[str, ...] = typing.get_args(ExtraDataset)
#: Training and evaluation precisions (TrainConfig.amp; docs/guides/gpu.md).
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)

#: The ablation axes and their neutral values: the matrix-capsule axes of the EM paper
#: (Hinton et al. 2018; ``routing_scope``: EM assignments normalised over all windows a child feeds,
#: or per window) and ``detach_inner`` of dynamic routing (stop gradients through the votes in
#: all but the last iteration), each at the model or TrainConfig default, so a sweep that
#: leaves them there trains as before they existed (models without the field ignore it).
ABLATION = {
    "pose": "matrix",
    "coordinate_addition": True,
    "loss": "auto",
    "weight_decay": 0.0,
    "detach_inner": True,
    "routing_scope": "global",
}
#: Lower bounds (inclusive) of the numeric dimensions; ``lr`` must be > 0.
_AT_LEAST = {
    "routing_iterations": 1,
    "m_plus": 0,
    "m_minus": 0,
    "lam": 0,
    "recon_weight": 0,
    "weight_decay": 0,
}
#: Upper bounds (inclusive) of the numeric dimensions whose size is work.
_AT_MOST = {"routing_iterations": 100}


@dataclass
class SearchSpace:
    """What a sweep searches; each field is a fixed value or {grid|choice|...: [...]}.

    A parameter a model does not have (routing_iterations for lenet5, pose for
    capsnet-small) is ignored by that model's trials.
    """

    model: Searched[str] = "capsnet-small"
    routing_iterations: Searched[int] = field(default_factory=lambda: {"grid": [1, 3]})
    m_plus: Searched[float] = 0.9
    m_minus: Searched[float] = 0.1
    lam: Searched[float] = 0.5
    augment: Searched[str] = field(default_factory=lambda: {"grid": ["none", "shift"]})
    lr: Searched[float] = 0.001
    recon_weight: Searched[float] = 0.0005
    pose: Searched[Pose] = ABLATION["pose"]  # em-capsnet models
    coordinate_addition: Searched[bool] = ABLATION["coordinate_addition"]  # em-capsnet models
    loss: Searched[Loss] = ABLATION["loss"]  # auto: the model's default
    weight_decay: Searched[float] = ABLATION["weight_decay"]  # Adam weight decay
    detach_inner: Searched[bool] = ABLATION["detach_inner"]  # dynamic-routing models
    routing_scope: Searched[RoutingScope] = ABLATION["routing_scope"]  # em-capsnet models

    def __post_init__(self):
        for name, low in _AT_LEAST.items():
            for value in dimension_values(getattr(self, name)):
                if value < low:
                    raise Invalid(name, f"{value!r} must be >= {low}")
        for name, high in _AT_MOST.items():
            for value in dimension_values(getattr(self, name)):
                if value > high:
                    raise Invalid(name, f"{value!r} must be <= {high}")
        for value in dimension_values(self.lr):
            if value <= 0:
                raise Invalid("lr", f"{value!r} must be > 0")
        for name in ("model", "augment"):  # names checked when the sweep starts
            if not all(dimension_values(getattr(self, name))):
                raise Invalid(name, "needs a name")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def searched(self) -> list[str]:
        """Names of the parameters drawn from a grid or distribution."""
        return [n for n in SEARCHABLE if isinstance(getattr(self, n), dict)]


def _value_type(hint: Any) -> type:
    """The type of one value of ``Searched[T]``: T, or str for a Literal of names."""
    (inner,) = typing.get_args(hint)
    return str if typing.get_origin(inner) is Literal else inner


#: The parameters a sweep may search (the model, its routing, the loss and the data), each
#: with the type of one of its values: read from ``SearchSpace``, their one home.
SEARCHABLE_TYPES: dict[str, type] = {
    name: _value_type(hint) for name, hint in typing.get_type_hints(SearchSpace).items()
}
SEARCHABLE: tuple[str, ...] = tuple(SEARCHABLE_TYPES)


@dataclass
class AshaConfig:
    """ASHA early stopping over epochs (max epochs is ``sweep.epochs``)."""

    enabled: bool = True
    grace_period: int = 1
    reduction_factor: int = 2

    def __post_init__(self):
        count(self, "grace_period", 1, MAX_EPOCHS)
        count(self, "reduction_factor", 2, MAX_RUNS)


@dataclass
class ResourcesConfig:
    """Per-trial resources; fractional GPUs share one device between trials."""

    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    max_concurrent_trials: int | None = None

    def __post_init__(self):
        above(self, "cpus_per_trial", 0)
        at_least(self, "gpus_per_trial", 0)
        if self.gpus_per_trial > 1 and self.gpus_per_trial != int(self.gpus_per_trial):
            raise Invalid(
                "gpus_per_trial", f"above 1 must be a whole number, got {self.gpus_per_trial}"
            )
        count(self, "max_concurrent_trials", 1, MAX_RUNS)


@dataclass
class TrialCheckpointConfig:
    """What a trial saves for resuming (after a lost node or an interrupted driver).

    Weights every ``every_epochs`` epochs and at the trial's last; the optimizer state
    (Adam's moments, twice the weights' size) with them, but for the last epoch, ``always``,
    ``never`` (a resumed trial restarts Adam from its weights) or, ``auto``, when the
    sweep retries failed trials (``max_failures`` != 0)."""

    every_epochs: int = 1
    optimizer_state: OptimizerState = "auto"

    def __post_init__(self):
        count(self, "every_epochs", 1, MAX_EPOCHS)

    def keeps_optimizer(self, max_failures: int) -> bool:
        if self.optimizer_state == "auto":
            return max_failures != 0
        return self.optimizer_state == "always"


@dataclass
class WandbConfig:
    """W&B tracking: offline unless an API key is configured (mode auto)."""

    project: str = "capsnet"
    mode: WandbMode = "auto"
    dir: str = "runs"  # W&B writes <dir>/wandb/


@dataclass
class SweepConfig(Section):
    """params.yaml ``sweep``: the search, the trial budget, resources and storage."""

    SECTION: ClassVar[str] = "sweep"

    name: str = "capsnet-sweep"
    dataset: Dataset = "mnist"  # smallnorb: the prepared training set, EM-paper crops
    channels: int = 2  # smallnorb: 1 (left image) or 2 (stereo pair); ignored for mnist
    space: SearchSpace = field(default_factory=SearchSpace)
    num_samples: int = 1
    epochs: int = 2  # max epochs per trial (ASHA's max_t)
    batch_size: int = 128
    train_size: int | None = 2000  # the first N training images (null: all)
    val_size: int = 1000  # held out from the end of the training set
    metric: Metric = "val_accuracy"  # val_rotated_accuracy: mnist only (mode max)
    rotation_angle: float = 45.0  # degrees, for val_rotated_accuracy
    asha: AshaConfig = field(default_factory=AshaConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    # Tune's state and trial checkpoints (not a DVC output): a directory, relative ones under
    # the repository the experiment started in ($DVC_ROOT), a shared filesystem or s3://...
    storage_path: str = "runs/ray"
    max_failures: int = 2  # retries of a failed trial (a lost node, an OOM kill)
    checkpoint: TrialCheckpointConfig = field(default_factory=TrialCheckpointConfig)
    reuse_actors: bool = True  # a finished trial's process runs the next one
    seed: int = 0
    compile: bool = False  # torch.compile what the model compiles (TrainConfig.compile)
    amp: Precision | None = None  # auto | bf16 | fp32 (TrainConfig.amp); null: TrainConfig's
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self):
        if not self.name or "/" in self.name:
            raise Invalid("name", f"{self.name!r} must be a non-empty name without '/'")
        if self.channels not in (1, 2):
            raise Invalid(
                "channels", f"must be 1 (left image) or 2 (stereo pair), got {self.channels}"
            )
        count(self, "num_samples", 1, MAX_RUNS)
        count(self, "epochs", 1, MAX_EPOCHS)
        count(self, "batch_size", 1, MAX_BATCH)
        for name in ("val_size", "train_size"):
            count(self, name, 1, MAX_ITEMS)
        if self.max_failures < -1:
            raise Invalid(
                "max_failures", f"must be >= 0 (or -1: retry forever), got {self.max_failures}"
            )
        at_most(self, "max_failures", MAX_RUNS)
        seeds(self)
        data = dataset_specs.get(self.dataset)
        if self.metric not in self.metrics():
            raise Invalid(
                "metric",
                f"{self.metric!r}: a {self.dataset} sweep reports only val_accuracy "
                f"(there is no rotated validation set)",
            )
        if data.self_augmenting and dimension_choices(self.space.augment) != ["none"]:
            raise Invalid(
                "space.augment",
                f"must be none for {self.dataset}: its training items are random crops with "
                f"brightness and contrast (data.{data.section})",
            )
        if self.asha.grace_period > self.epochs:
            raise Invalid(
                "asha.grace_period",
                f"{self.asha.grace_period} exceeds {self.SECTION}.epochs {self.epochs}",
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def metrics(self) -> tuple[str, ...]:
        """What every trial reports after each epoch (all maximised)."""
        if not dataset_specs.get(self.dataset).rotated_validation:
            return ("val_accuracy",)
        return ("val_accuracy", "val_rotated_accuracy")

    def parameters(self) -> list[str]:
        """The searchable parameters recorded per trial (results.csv, best.json): all of
        them for smallnorb; for mnist the ablation axes only when set away from their
        neutral values, so an MNIST sweep's outputs keep the columns they always had."""
        if dataset_specs.get(self.dataset).sweep_records_all:
            return list(SEARCHABLE)
        return [
            name
            for name in SEARCHABLE
            if name not in ABLATION or getattr(self.space, name) != ABLATION[name]
        ]


@dataclass
class FinalTrainConfig(Section):
    """params.yaml ``train``: the final model (best sweep config) and the baselines."""

    SECTION: ClassVar[str] = "train"

    epochs: int = 3
    batch_size: int = 128
    train_size: int | None = None  # the first N training images (null: all)
    val_size: int = 5000
    baselines: list[str] = field(default_factory=lambda: ["lenet5"])
    # the baselines' Adam learning rate; None: the best sweep config's (a CNN can need a
    # smaller one than the capsules: docs/guides/em.md)
    baseline_lr: float | None = None
    seed: int = 0
    out_dir: str = "models"
    # Also train the same runs on these sets, for the evaluations that need other input
    # sizes: multimnist (36x36, scored on MultiMNIST) and expanded-mnist (40x40, the
    # Sabour affNIST protocol, scored on affNIST). Checkpoints: <model>@<dataset>.pt.
    extra_datasets: list[ExtraDataset] = field(default_factory=list)
    extra_train_size: int | None = 5000  # the first N training items of each extra set
    compile: bool = False  # torch.compile what the model compiles (TrainConfig.compile)
    amp: Precision | None = None  # auto | bf16 | fp32 (TrainConfig.amp); null: TrainConfig's
    # The comparison (docs/guides/evaluation.md): every run below is trained with the seeds seed,
    # seed + 1, ..., seed + seeds - 1 (the extra sets with the first seed only).
    seeds: int = 3
    augment: Strategy | None = None  # every run's augmentation; None: the best sweep config's
    equal_time: bool = True  # each baseline also trained for the best model's mean training time
    baseline_augments: list[Strategy] = field(default_factory=list)  # each baseline also with these
    # Adam's learning rate times lr_decay every lr_decay_steps steps; None: TrainConfig's
    # (the official CapsNet code's 0.96 every 2,000 steps).
    lr_decay: float | None = None
    lr_decay_steps: int | None = None

    def __post_init__(self):
        count(self, "epochs", 1, MAX_EPOCHS)
        count(self, "batch_size", 1, MAX_BATCH)
        for name in ("train_size", "extra_train_size"):
            count(self, name, 1, MAX_ITEMS)
        seeds(self, "seed", "seeds")
        check_schedule(self)
        count(self, "val_size", 0, MAX_ITEMS)
        if not all(self.baselines):
            raise Invalid("baselines", f"must be a list of model names, got {self.baselines!r}")
        if self.baseline_lr is not None:
            above(self, "baseline_lr", 0)
        if len(set(self.baseline_augments)) != len(self.baseline_augments):
            raise Invalid("baseline_augments", f"lists a strategy twice: {self.baseline_augments}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def seed_list(seed: int, seeds: int) -> list[int]:
    """The seeds of a section's runs: ``seed``, ``seed + 1``, ..., ``seeds`` of them."""
    return [seed + i for i in range(seeds)]


def check_schedule(section) -> None:
    """A section's ``lr_decay`` (in (0, 1]) and ``lr_decay_steps`` (>= 1), each or null."""
    count(section, "lr_decay_steps", 1, MAX_ITEMS)
    if section.lr_decay is not None and not 0 < section.lr_decay <= 1:
        raise Invalid("lr_decay", f"must be in (0, 1], got {section.lr_decay}")


def schedule(section) -> dict[str, Any]:
    """The TrainConfig fields of the learning-rate schedule a section sets (its non-null
    ``lr_decay`` and ``lr_decay_steps``)."""
    fields = {"lr_decay": section.lr_decay, "lr_decay_steps": section.lr_decay_steps}
    return {name: value for name, value in fields.items() if value is not None}


# --- the smallNORB ablation: Hinton et al. 2018's defaults: em-capsnet-small, batch 64,
# weight decay 2e-7, every ablation axis of the paper's table.


@dataclass
class SmallnorbSearchSpace(SearchSpace):
    """The EM paper's ablation axes, each crossed with the others (72 trials)."""

    model: Searched[str] = "em-capsnet-small"
    routing_iterations: Searched[int] = field(default_factory=lambda: {"grid": [1, 2, 3]})
    augment: Searched[str] = "none"  # smallNORB augments itself (crops, brightness)
    lr: Searched[float] = 0.003
    pose: Searched[Pose] = field(default_factory=lambda: {"grid": ["matrix", "vector"]})
    coordinate_addition: Searched[bool] = field(default_factory=lambda: {"grid": [True, False]})
    loss: Searched[Loss] = field(
        default_factory=lambda: {"grid": ["spread", "margin", "cross-entropy"]}
    )
    weight_decay: Searched[float] = 2.0e-7
    routing_scope: Searched[RoutingScope] = field(
        default_factory=lambda: {"grid": ["global", "window"]}
    )


@dataclass
class SmallnorbSweepConfig(SweepConfig):
    """params.yaml ``smallnorb_sweep``: the smallNORB ablation sweep."""

    SECTION: ClassVar[str] = "smallnorb_sweep"

    name: str = "smallnorb-sweep"
    dataset: Dataset = "smallnorb"
    space: SmallnorbSearchSpace = field(default_factory=SmallnorbSearchSpace)
    epochs: int = 10
    batch_size: int = 64  # the EM paper's batch
    train_size: int | None = None
    val_size: int = 2000


@dataclass
class SmallnorbTrainConfig(FinalTrainConfig):
    """params.yaml ``smallnorb_train``: the best smallNORB config and the CNN baseline,
    scored on the smallNORB test set (centre crops)."""

    SECTION: ClassVar[str] = "smallnorb_train"

    epochs: int = 10
    batch_size: int = 64
    val_size: int = 2000  # the sweep's validation images, so the two are comparable
    baselines: list[str] = field(default_factory=lambda: ["smallnorb-cnn"])
    # at the capsules' 3e-3, 87% of the CNN's FC units died in one seed of three, which
    # stayed at chance; at 1e-3 every seed learned (docs/notes/2026-11-28-em-learning.md)
    baseline_lr: float | None = 1e-3
    out_dir: str = "models-smallnorb"
    test_size: int | None = None  # the first N smallNORB test images (null: all 24,300)
    equal_time: bool = False

    def __post_init__(self):
        super().__post_init__()
        count(self, "test_size", 1, MAX_ITEMS)
        if self.extra_datasets:
            raise Invalid(
                "extra_datasets", "must be []: multimnist and expanded-mnist are MNIST sets"
            )
        if self.augment not in (None, "none") or self.baseline_augments:
            raise Invalid(
                "augment", "smallNORB augments itself (data.smallnorb): leave augment null "
                "and baseline_augments []",
            )  # fmt: skip
