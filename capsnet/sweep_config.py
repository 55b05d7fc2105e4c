"""The ``sweep`` and ``train`` sections of params.yaml: pure dataclasses, no Ray.

A searched parameter is either a fixed value or a one-key mapping naming how Tune draws
it::

    routing_iterations: {grid: [1, 2, 3, 5]}   # every value, crossed with other grids
    lr: {loguniform: [0.0003, 0.003]}          # sampled num_samples times
    augment: {choice: [none, shift]}           # sampled
    m_plus: 0.9                                # fixed

``pipeline/tune.py`` turns these into Tune's search space; this module only validates.

Two sweep sections share this schema: ``sweep`` (MNIST, dynamic routing) and
``smallnorb_sweep`` (the EM paper's smallNORB ablation: routing iterations, pose matrix or
vector, coordinate addition, loss). Each class names its section (``SECTION``) so an error
names the dotted key of the section it came from; the smallNORB classes only change that
name and the defaults.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from capsnet.errors import ConfigError

#: How a searched parameter may be drawn, and how many bounds/values each kind takes.
DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint")
#: The parameters a sweep may search: the model, its routing, the loss and the data.
SEARCHABLE = (
    "model",
    "routing_iterations",
    "m_plus",
    "m_minus",
    "lam",
    "augment",
    "lr",
    "recon_weight",
    "pose",
    "coordinate_addition",
    "loss",
    "weight_decay",
)
#: The matrix-capsule ablation axes (EM paper, SPEC 1.3) and their neutral values: the
#: model and TrainConfig defaults, so a sweep that leaves them there trains as before they
#: existed (models without ``pose`` or ``coordinate_addition`` ignore those).
ABLATION = {"pose": "matrix", "coordinate_addition": True, "loss": "auto", "weight_decay": 0.0}
POSES = ("matrix", "vector")
LOSSES = ("auto", "margin", "cross-entropy", "spread")  # capsnet.train.LOSSES, without torch
DATASETS = ("mnist", "smallnorb")
_CATEGORICAL = {"model", "augment", "pose", "loss", "coordinate_addition"}


def _check_dimension(name: str, value: Any, where: str = "sweep.space") -> None:
    """A fixed value, or {kind: values} with kind one of DISTRIBUTIONS."""
    if isinstance(value, dict):
        if len(value) != 1 or next(iter(value)) not in DISTRIBUTIONS:
            raise ConfigError(
                f"{where}.{name}: expected a value or one of "
                f"{{{', '.join(DISTRIBUTIONS)}}}: [...], got {value!r}"
            )
        kind, values = next(iter(value.items()))
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{where}.{name}.{kind} must be a non-empty list")
        if kind in ("uniform", "loguniform", "randint"):
            if name in _CATEGORICAL:
                raise ConfigError(f"{where}.{name}: {kind} needs numbers; use grid or choice")
            if len(values) != 2 or not all(isinstance(v, (int, float)) for v in values):
                raise ConfigError(f"{where}.{name}.{kind} must be [low, high] numbers")
            low, high = values
            if not low < high:
                raise ConfigError(f"{where}.{name}.{kind}: low {low} must be < high {high}")
            if kind == "loguniform" and low <= 0:
                raise ConfigError(f"{where}.{name}.loguniform: bounds must be > 0")
        for item in values:
            _check_value(name, item, where)
    else:
        _check_value(name, value, where)


def _check_value(name: str, value: Any, where: str = "sweep.space") -> None:
    if name == "coordinate_addition":
        if not isinstance(value, bool):
            raise ConfigError(f"{where}.coordinate_addition: {value!r} must be true or false")
        return
    choices = {"pose": POSES, "loss": LOSSES}.get(name)
    if choices is not None and value not in choices:
        raise ConfigError(f"{where}.{name}: {value!r} unknown; choose one of {', '.join(choices)}")
    if name in _CATEGORICAL:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}.{name}: {value!r} is not a name")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{name}: {value!r} is not a number")
    if name == "routing_iterations" and (value != int(value) or value < 1):
        raise ConfigError(f"{where}.routing_iterations: {value!r} must be an integer >= 1")
    if name in ("lr",) and value <= 0:
        raise ConfigError(f"{where}.lr: {value!r} must be > 0")
    if name in ("m_plus", "m_minus", "lam", "recon_weight", "weight_decay") and value < 0:
        raise ConfigError(f"{where}.{name}: {value!r} must be >= 0")


def _space_values(value: Any) -> list:
    """The values a dimension can take: a fixed value, or a grid/choice list ([] when
    drawn from a range)."""
    if isinstance(value, dict):
        ((kind, values),) = value.items()
        return list(values) if kind in ("grid", "choice") else []
    return [value]


def _build(cls, value: Any, where: str):
    """``cls(**value)`` for a mapping (unknown keys named), ``value`` if already built."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(value).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return cls(**value)


def _check_types(obj, where: str, types: dict[str, tuple[type, ...]]) -> None:
    for name, allowed in types.items():
        value = getattr(obj, name)
        if isinstance(value, bool) and bool not in allowed:
            raise ConfigError(f"{where}.{name}: expected a number, got {value!r}")
        if not isinstance(value, allowed):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise ConfigError(f"{where}.{name}: expected {names}, got {value!r}")


@dataclass
class SearchSpace:
    """What a sweep searches; each field is a fixed value or {grid|choice|...: [...]}.

    A parameter a model does not have (routing_iterations for lenet5, pose for
    capsnet-small) is ignored by that model's trials.
    """

    SECTION: ClassVar[str] = "sweep.space"

    model: Any = "capsnet-small"
    routing_iterations: Any = field(default_factory=lambda: {"grid": [1, 3]})
    m_plus: Any = 0.9
    m_minus: Any = 0.1
    lam: Any = 0.5
    augment: Any = field(default_factory=lambda: {"grid": ["none", "shift"]})
    lr: Any = 0.001
    recon_weight: Any = 0.0005
    pose: Any = ABLATION["pose"]  # matrix | vector (em-capsnet models)
    coordinate_addition: Any = ABLATION["coordinate_addition"]  # em-capsnet models
    loss: Any = ABLATION["loss"]  # auto (the model's default) | spread | margin | cross-entropy
    weight_decay: Any = ABLATION["weight_decay"]  # Adam weight decay

    def __post_init__(self):
        for name in SEARCHABLE:
            _check_dimension(name, getattr(self, name), self.SECTION)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def searched(self) -> list[str]:
        """Names of the parameters drawn from a grid or distribution."""
        return [n for n in SEARCHABLE if isinstance(getattr(self, n), dict)]


@dataclass
class AshaConfig:
    """ASHA early stopping over epochs (max epochs is ``sweep.epochs``)."""

    SECTION: ClassVar[str] = "sweep.asha"

    enabled: bool = True
    grace_period: int = 1
    reduction_factor: int = 2

    def __post_init__(self):
        s = self.SECTION
        _check_types(
            self, s, {"enabled": (bool,), "grace_period": (int,), "reduction_factor": (int,)}
        )
        if self.grace_period < 1:
            raise ConfigError(f"{s}.grace_period must be >= 1, got {self.grace_period}")
        if self.reduction_factor < 2:
            raise ConfigError(f"{s}.reduction_factor must be >= 2, got {self.reduction_factor}")


@dataclass
class ResourcesConfig:
    """Per-trial resources; fractional GPUs share one device between trials."""

    SECTION: ClassVar[str] = "sweep.resources"

    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    max_concurrent_trials: int | None = None

    def __post_init__(self):
        s = self.SECTION
        _check_types(
            self,
            s,
            {
                "cpus_per_trial": (int, float),
                "gpus_per_trial": (int, float),
                "max_concurrent_trials": (int, type(None)),
            },
        )
        if self.cpus_per_trial <= 0:
            raise ConfigError(f"{s}.cpus_per_trial must be > 0, got {self.cpus_per_trial}")
        if self.gpus_per_trial < 0:
            raise ConfigError(f"{s}.gpus_per_trial must be >= 0, got {self.gpus_per_trial}")
        if self.gpus_per_trial > 1 and self.gpus_per_trial != int(self.gpus_per_trial):
            raise ConfigError(f"{s}.gpus_per_trial above 1 must be a whole number")
        if self.max_concurrent_trials is not None and self.max_concurrent_trials < 1:
            raise ConfigError(f"{s}.max_concurrent_trials must be >= 1 or null")


@dataclass
class WandbConfig:
    """W&B tracking: offline unless an API key is configured (mode auto)."""

    SECTION: ClassVar[str] = "sweep.wandb"

    project: str = "capsnet"
    mode: str = "auto"  # auto | offline | online | disabled
    dir: str = "runs"  # W&B writes <dir>/wandb/

    def __post_init__(self):
        _check_types(self, self.SECTION, {"project": (str,), "mode": (str,), "dir": (str,)})
        if self.mode not in ("auto", "offline", "online", "disabled"):
            raise ConfigError(
                f"{self.SECTION}.mode {self.mode!r}: auto, offline, online or disabled"
            )


@dataclass
class SweepConfig:
    """params.yaml ``sweep``: the search, the trial budget, resources and storage."""

    SECTION: ClassVar[str] = "sweep"

    name: str = "capsnet-sweep"
    dataset: str = "mnist"  # mnist | smallnorb (prepared training set; EM-paper crops)
    channels: int = 2  # smallnorb: 1 (left image) or 2 (stereo pair); ignored for mnist
    space: SearchSpace = field(default_factory=SearchSpace)
    num_samples: int = 1
    epochs: int = 2  # max epochs per trial (ASHA's max_t)
    batch_size: int = 128
    train_size: int | None = 2000  # the first N training images (null: all)
    val_size: int = 1000  # held out from the end of the training set
    metric: str = "val_accuracy"  # val_accuracy | val_rotated_accuracy (mnist only; mode max)
    rotation_angle: float = 45.0  # degrees, for val_rotated_accuracy
    asha: AshaConfig = field(default_factory=AshaConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    storage_path: str = "sweep/ray"  # local dir, shared filesystem or s3://bucket/prefix
    max_failures: int = 2  # retries of a failed trial (a lost node, an OOM kill)
    reuse_actors: bool = True  # a finished trial's process runs the next one
    seed: int = 0
    compile: bool = False  # EM models: torch.compile their routing (TrainConfig.compile)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self):
        s = self.SECTION
        for name in ("space", "asha", "resources", "wandb"):  # nested sections, by field type
            cls = self.__dataclass_fields__[name].default_factory
            setattr(self, name, _build(cls, getattr(self, name), f"{s}.{name}"))
        _check_types(
            self,
            s,
            {
                "name": (str,),
                "dataset": (str,),
                "channels": (int,),
                "num_samples": (int,),
                "epochs": (int,),
                "batch_size": (int,),
                "train_size": (int, type(None)),
                "val_size": (int,),
                "metric": (str,),
                "rotation_angle": (int, float),
                "storage_path": (str,),
                "max_failures": (int,),
                "reuse_actors": (bool,),
                "seed": (int,),
                "compile": (bool,),
            },
        )
        if not self.name or "/" in self.name:
            raise ConfigError(f"{s}.name {self.name!r} must be a non-empty name without '/'")
        if self.dataset not in DATASETS:
            raise ConfigError(f"{s}.dataset {self.dataset!r} unknown; choose mnist or smallnorb")
        if self.channels not in (1, 2):
            raise ConfigError(
                f"{s}.channels must be 1 (left image) or 2 (stereo pair), got {self.channels}"
            )
        for name in ("num_samples", "epochs", "batch_size", "val_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{s}.{name} must be >= 1, got {getattr(self, name)}")
        if self.train_size is not None and self.train_size < 1:
            raise ConfigError(f"{s}.train_size must be >= 1 or null, got {self.train_size}")
        if self.max_failures < -1:
            raise ConfigError(f"{s}.max_failures must be >= 0 (or -1: retry forever)")
        if self.metric not in ("val_accuracy", "val_rotated_accuracy"):
            raise ConfigError(f"{s}.metric {self.metric!r}: val_accuracy or val_rotated_accuracy")
        if self.dataset == "smallnorb" and self.metric != "val_accuracy":
            raise ConfigError(
                f"{s}.metric {self.metric!r}: a smallnorb sweep reports only val_accuracy "
                f"(there is no rotated validation set)"
            )
        if self.dataset == "smallnorb" and _space_values(self.space.augment) != ["none"]:
            raise ConfigError(
                f"{s}.space.augment must be none for smallnorb: its training items are "
                f"random crops with brightness and contrast (data.smallnorb)"
            )
        if self.asha.grace_period > self.epochs:
            raise ConfigError(
                f"{s}.asha.grace_period {self.asha.grace_period} exceeds {s}.epochs {self.epochs}"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> SweepConfig:
        return _build(cls, values or {}, cls.SECTION)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def metrics(self) -> tuple[str, ...]:
        """What every trial reports after each epoch (all maximised)."""
        if self.dataset == "smallnorb":
            return ("val_accuracy",)
        return ("val_accuracy", "val_rotated_accuracy")

    def parameters(self) -> list[str]:
        """The searchable parameters recorded per trial (results.csv, best.json): all of
        them for smallnorb; for mnist the ablation axes only when set away from their
        neutral values, so an MNIST sweep's outputs keep the columns they always had."""
        if self.dataset != "mnist":
            return list(SEARCHABLE)
        return [
            name
            for name in SEARCHABLE
            if name not in ABLATION or getattr(self.space, name) != ABLATION[name]
        ]

    def fingerprint(self) -> str:
        """Hash of everything that changes trial results (not resources, storage, W&B).

        The Tune experiment directory is named after it, so a changed search space starts
        a new experiment while an interrupted run of the same one is restored. An MNIST
        sweep that leaves the smallNORB settings and the ablation axes at their neutral
        values hashes as it did before they existed, so its saved state still restores.
        """
        keep = self.to_dict()
        for name in (
            "resources", "storage_path", "max_failures", "reuse_actors", "wandb", "compile"
        ):  # fmt: skip
            keep.pop(name)
        if self.dataset == "mnist":
            keep.pop("dataset")
            keep.pop("channels")
            for name, neutral in ABLATION.items():
                if keep["space"][name] == neutral:
                    keep["space"].pop(name)
        blob = json.dumps(keep, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


EXTRA_DATASETS = ("multimnist", "expanded-mnist")


@dataclass
class FinalTrainConfig:
    """params.yaml ``train``: the final model (best sweep config) and the baselines."""

    SECTION: ClassVar[str] = "train"

    epochs: int = 3
    batch_size: int = 128
    train_size: int | None = None  # the first N training images (null: all)
    val_size: int = 5000
    baselines: list[str] = field(default_factory=lambda: ["lenet5"])
    seed: int = 0
    out_dir: str = "models"
    # Also train the same runs on these sets, for the evaluations that need other input
    # sizes: multimnist (36x36, scored on MultiMNIST) and expanded-mnist (40x40, the
    # Sabour affNIST protocol, scored on affNIST). Checkpoints: <model>@<dataset>.pt.
    extra_datasets: list[str] = field(default_factory=list)
    extra_train_size: int | None = 5000  # the first N training items of each extra set
    compile: bool = False  # EM models: torch.compile their routing (TrainConfig.compile)

    def __post_init__(self):
        s = self.SECTION
        _check_types(
            self,
            s,
            {
                "compile": (bool,),
                "extra_datasets": (list,),
                "extra_train_size": (int, type(None)),
                "epochs": (int,),
                "batch_size": (int,),
                "train_size": (int, type(None)),
                "val_size": (int,),
                "baselines": (list,),
                "seed": (int,),
                "out_dir": (str,),
            },
        )
        for name in ("epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{s}.{name} must be >= 1, got {getattr(self, name)}")
        if self.val_size < 0:
            raise ConfigError(f"{s}.val_size must be >= 0, got {self.val_size}")
        if self.train_size is not None and self.train_size < 1:
            raise ConfigError(f"{s}.train_size must be >= 1 or null, got {self.train_size}")
        if not all(isinstance(b, str) and b for b in self.baselines):
            raise ConfigError(
                f"{s}.baselines must be a list of model names, got {self.baselines!r}"
            )
        unknown = [d for d in self.extra_datasets if d not in EXTRA_DATASETS]
        if unknown:
            raise ConfigError(
                f"{s}.extra_datasets: {unknown[0]!r} unknown; choose from "
                f"{', '.join(EXTRA_DATASETS)}"
            )
        if self.extra_train_size is not None and self.extra_train_size < 1:
            raise ConfigError(
                f"{s}.extra_train_size must be >= 1 or null, got {self.extra_train_size}"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> FinalTrainConfig:
        return _build(cls, values or {}, cls.SECTION)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- the smallNORB ablation (params.yaml smallnorb_sweep, smallnorb_train) -------------------
# The same schema under other section names and with the EM paper's defaults (SPEC 1.3):
# em-capsnet-small, batch 64, weight decay 2e-7, every ablation axis of the paper's table.


@dataclass
class SmallnorbSearchSpace(SearchSpace):
    """The EM paper's ablation axes, each crossed with the others (36 trials)."""

    SECTION: ClassVar[str] = "smallnorb_sweep.space"

    model: Any = "em-capsnet-small"
    routing_iterations: Any = field(default_factory=lambda: {"grid": [1, 2, 3]})
    augment: Any = "none"  # smallNORB augments itself (random crops, brightness, contrast)
    lr: Any = 0.003
    pose: Any = field(default_factory=lambda: {"grid": ["matrix", "vector"]})
    coordinate_addition: Any = field(default_factory=lambda: {"grid": [True, False]})
    loss: Any = field(default_factory=lambda: {"grid": ["spread", "margin", "cross-entropy"]})
    weight_decay: Any = 2.0e-7


@dataclass
class SmallnorbAshaConfig(AshaConfig):
    SECTION: ClassVar[str] = "smallnorb_sweep.asha"


@dataclass
class SmallnorbResourcesConfig(ResourcesConfig):
    SECTION: ClassVar[str] = "smallnorb_sweep.resources"


@dataclass
class SmallnorbWandbConfig(WandbConfig):
    SECTION: ClassVar[str] = "smallnorb_sweep.wandb"


@dataclass
class SmallnorbSweepConfig(SweepConfig):
    """params.yaml ``smallnorb_sweep``: the smallNORB ablation sweep."""

    SECTION: ClassVar[str] = "smallnorb_sweep"

    name: str = "smallnorb-sweep"
    dataset: str = "smallnorb"
    space: SmallnorbSearchSpace = field(default_factory=SmallnorbSearchSpace)
    epochs: int = 10
    batch_size: int = 64  # the EM paper's batch
    train_size: int | None = None
    val_size: int = 2000
    asha: SmallnorbAshaConfig = field(default_factory=SmallnorbAshaConfig)
    resources: SmallnorbResourcesConfig = field(default_factory=SmallnorbResourcesConfig)
    storage_path: str = "sweep-smallnorb/ray"
    wandb: SmallnorbWandbConfig = field(default_factory=SmallnorbWandbConfig)


@dataclass
class SmallnorbTrainConfig(FinalTrainConfig):
    """params.yaml ``smallnorb_train``: the best smallNORB config and the CNN baseline,
    scored on the smallNORB test set (centre crops)."""

    SECTION: ClassVar[str] = "smallnorb_train"

    epochs: int = 10
    batch_size: int = 64
    val_size: int = 2000  # the sweep's validation images, so the two are comparable
    baselines: list[str] = field(default_factory=lambda: ["smallnorb-cnn"])
    out_dir: str = "models-smallnorb"
    test_size: int | None = None  # the first N smallNORB test images (null: all 24,300)

    def __post_init__(self):
        super().__post_init__()
        s = self.SECTION
        _check_types(self, s, {"test_size": (int, type(None))})
        if self.test_size is not None and self.test_size < 1:
            raise ConfigError(f"{s}.test_size must be >= 1 or null, got {self.test_size}")
        if self.extra_datasets:
            raise ConfigError(
                f"{s}.extra_datasets must be []: multimnist and expanded-mnist are MNIST sets"
            )
