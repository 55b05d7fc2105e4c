"""The ``sweep`` and ``train`` sections of params.yaml: pure dataclasses, no Ray.

A searched parameter is either a fixed value or a one-key mapping naming how Tune draws
it::

    routing_iterations: {grid: [1, 2, 3, 5]}   # every value, crossed with other grids
    lr: {loguniform: [0.0003, 0.003]}          # sampled num_samples times
    augment: {choice: [none, shift]}           # sampled
    m_plus: 0.9                                # fixed

``pipeline/tune.py`` turns these into Tune's search space; this module only validates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

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
)
_CATEGORICAL = {"model", "augment"}


def _check_dimension(name: str, value: Any) -> None:
    """A fixed value, or {kind: values} with kind one of DISTRIBUTIONS."""
    if isinstance(value, dict):
        if len(value) != 1 or next(iter(value)) not in DISTRIBUTIONS:
            raise ConfigError(
                f"sweep.space.{name}: expected a value or one of "
                f"{{{', '.join(DISTRIBUTIONS)}}}: [...], got {value!r}"
            )
        kind, values = next(iter(value.items()))
        if not isinstance(values, list) or not values:
            raise ConfigError(f"sweep.space.{name}.{kind} must be a non-empty list")
        if kind in ("uniform", "loguniform", "randint"):
            if name in _CATEGORICAL:
                raise ConfigError(f"sweep.space.{name}: {kind} needs numbers; use grid or choice")
            if len(values) != 2 or not all(isinstance(v, (int, float)) for v in values):
                raise ConfigError(f"sweep.space.{name}.{kind} must be [low, high] numbers")
            low, high = values
            if not low < high:
                raise ConfigError(f"sweep.space.{name}.{kind}: low {low} must be < high {high}")
            if kind == "loguniform" and low <= 0:
                raise ConfigError(f"sweep.space.{name}.loguniform: bounds must be > 0")
        for item in values:
            _check_value(name, item)
    else:
        _check_value(name, value)


def _check_value(name: str, value: Any) -> None:
    if name in _CATEGORICAL:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"sweep.space.{name}: {value!r} is not a name")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"sweep.space.{name}: {value!r} is not a number")
    if name == "routing_iterations" and (value != int(value) or value < 1):
        raise ConfigError(f"sweep.space.routing_iterations: {value!r} must be an integer >= 1")
    if name in ("lr",) and value <= 0:
        raise ConfigError(f"sweep.space.lr: {value!r} must be > 0")
    if name in ("m_plus", "m_minus", "lam", "recon_weight") and value < 0:
        raise ConfigError(f"sweep.space.{name}: {value!r} must be >= 0")


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

    A parameter a model does not have (routing_iterations for lenet5) is ignored by
    that model's trials.
    """

    model: Any = "capsnet-small"
    routing_iterations: Any = field(default_factory=lambda: {"grid": [1, 3]})
    m_plus: Any = 0.9
    m_minus: Any = 0.1
    lam: Any = 0.5
    augment: Any = field(default_factory=lambda: {"grid": ["none", "shift"]})
    lr: Any = 0.001
    recon_weight: Any = 0.0005

    def __post_init__(self):
        for name in SEARCHABLE:
            _check_dimension(name, getattr(self, name))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def searched(self) -> list[str]:
        """Names of the parameters drawn from a grid or distribution."""
        return [n for n in SEARCHABLE if isinstance(getattr(self, n), dict)]


@dataclass
class AshaConfig:
    """ASHA early stopping over epochs (max epochs is ``sweep.epochs``)."""

    enabled: bool = True
    grace_period: int = 1
    reduction_factor: int = 2

    def __post_init__(self):
        _check_types(
            self,
            "sweep.asha",
            {"enabled": (bool,), "grace_period": (int,), "reduction_factor": (int,)},
        )
        if self.grace_period < 1:
            raise ConfigError(f"sweep.asha.grace_period must be >= 1, got {self.grace_period}")
        if self.reduction_factor < 2:
            raise ConfigError(
                f"sweep.asha.reduction_factor must be >= 2, got {self.reduction_factor}"
            )


@dataclass
class ResourcesConfig:
    """Per-trial resources; fractional GPUs share one device between trials."""

    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    max_concurrent_trials: int | None = None

    def __post_init__(self):
        _check_types(
            self,
            "sweep.resources",
            {
                "cpus_per_trial": (int, float),
                "gpus_per_trial": (int, float),
                "max_concurrent_trials": (int, type(None)),
            },
        )
        if self.cpus_per_trial <= 0:
            raise ConfigError(
                f"sweep.resources.cpus_per_trial must be > 0, got {self.cpus_per_trial}"
            )
        if self.gpus_per_trial < 0:
            raise ConfigError(
                f"sweep.resources.gpus_per_trial must be >= 0, got {self.gpus_per_trial}"
            )
        if self.gpus_per_trial > 1 and self.gpus_per_trial != int(self.gpus_per_trial):
            raise ConfigError("sweep.resources.gpus_per_trial above 1 must be a whole number")
        if self.max_concurrent_trials is not None and self.max_concurrent_trials < 1:
            raise ConfigError("sweep.resources.max_concurrent_trials must be >= 1 or null")


@dataclass
class WandbConfig:
    """W&B tracking: offline unless an API key is configured (mode auto)."""

    project: str = "capsnet"
    mode: str = "auto"  # auto | offline | online | disabled
    dir: str = "runs"  # W&B writes <dir>/wandb/

    def __post_init__(self):
        _check_types(self, "wandb", {"project": (str,), "mode": (str,), "dir": (str,)})
        if self.mode not in ("auto", "offline", "online", "disabled"):
            raise ConfigError(f"wandb.mode {self.mode!r}: auto, offline, online or disabled")


@dataclass
class SweepConfig:
    """params.yaml ``sweep``: the search, the trial budget, resources and storage."""

    name: str = "capsnet-sweep"
    space: SearchSpace = field(default_factory=SearchSpace)
    num_samples: int = 1
    epochs: int = 2  # max epochs per trial (ASHA's max_t)
    batch_size: int = 128
    train_size: int | None = 2000  # the first N training images (null: all)
    val_size: int = 1000  # held out from the end of the MNIST training set
    metric: str = "val_accuracy"  # val_accuracy | val_rotated_accuracy (mode max)
    rotation_angle: float = 45.0  # degrees, for val_rotated_accuracy
    asha: AshaConfig = field(default_factory=AshaConfig)
    resources: ResourcesConfig = field(default_factory=ResourcesConfig)
    storage_path: str = "sweep/ray"  # local dir, shared filesystem or s3://bucket/prefix
    max_failures: int = 2  # retries of a failed trial (a lost node, an OOM kill)
    reuse_actors: bool = True  # a finished trial's process runs the next one
    seed: int = 0
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self):
        self.space = _build(SearchSpace, self.space, "sweep.space")
        self.asha = _build(AshaConfig, self.asha, "sweep.asha")
        self.resources = _build(ResourcesConfig, self.resources, "sweep.resources")
        self.wandb = _build(WandbConfig, self.wandb, "sweep.wandb")
        _check_types(
            self,
            "sweep",
            {
                "name": (str,),
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
            },
        )
        if not self.name or "/" in self.name:
            raise ConfigError(f"sweep.name {self.name!r} must be a non-empty name without '/'")
        for name in ("num_samples", "epochs", "batch_size", "val_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"sweep.{name} must be >= 1, got {getattr(self, name)}")
        if self.train_size is not None and self.train_size < 1:
            raise ConfigError(f"sweep.train_size must be >= 1 or null, got {self.train_size}")
        if self.max_failures < -1:
            raise ConfigError("sweep.max_failures must be >= 0 (or -1: retry forever)")
        if self.metric not in ("val_accuracy", "val_rotated_accuracy"):
            raise ConfigError(f"sweep.metric {self.metric!r}: val_accuracy or val_rotated_accuracy")
        if self.asha.grace_period > self.epochs:
            raise ConfigError(
                f"sweep.asha.grace_period {self.asha.grace_period} exceeds sweep.epochs "
                f"{self.epochs}"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> SweepConfig:
        return _build(cls, values or {}, "sweep")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """Hash of everything that changes trial results (not resources, storage, W&B).

        The Tune experiment directory is named after it, so a changed search space starts
        a new experiment while an interrupted run of the same one is restored.
        """
        keep = self.to_dict()
        for name in ("resources", "storage_path", "max_failures", "reuse_actors", "wandb"):
            keep.pop(name)
        blob = json.dumps(keep, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:10]


EXTRA_DATASETS = ("multimnist", "expanded-mnist")


@dataclass
class FinalTrainConfig:
    """params.yaml ``train``: the final model (best sweep config) and the baselines."""

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

    def __post_init__(self):
        _check_types(
            self,
            "train",
            {
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
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.val_size < 0:
            raise ConfigError(f"train.val_size must be >= 0, got {self.val_size}")
        if self.train_size is not None and self.train_size < 1:
            raise ConfigError(f"train.train_size must be >= 1 or null, got {self.train_size}")
        if not all(isinstance(b, str) and b for b in self.baselines):
            raise ConfigError(
                f"train.baselines must be a list of model names, got {self.baselines!r}"
            )
        unknown = [d for d in self.extra_datasets if d not in EXTRA_DATASETS]
        if unknown:
            raise ConfigError(
                f"train.extra_datasets: {unknown[0]!r} unknown; choose from "
                f"{', '.join(EXTRA_DATASETS)}"
            )
        if self.extra_train_size is not None and self.extra_train_size < 1:
            raise ConfigError(
                f"train.extra_train_size must be >= 1 or null, got {self.extra_train_size}"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> FinalTrainConfig:
        return _build(cls, values or {}, "train")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
