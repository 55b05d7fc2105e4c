"""``TrainConfig``: the settings of one training run (no torch, so the CLI reads its
defaults without loading model code). ``capsnet.training.fit.fit`` consumes it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from capsnet.config.data import STRATEGIES, AugmentParams
from capsnet.config.evaluate import EvaluateParams
from capsnet.config.schema import MAX_BATCH, MAX_EPOCHS, MAX_SEED, MAX_WORKERS
from capsnet.config.sweep import LOSSES, PRECISIONS
from capsnet.io.errors import ConfigError

__all__ = ["LOSSES", "PRECISIONS", "TrainConfig"]


@dataclass
class TrainConfig:
    """Training settings (defaults: the official CapsNet code of Sabour et al. 2017)."""

    epochs: int = 1
    batch_size: int = 128
    lr: float = 1e-3
    lr_decay: float = 0.96
    lr_decay_steps: int = 2000
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "auto"
    # auto: bf16 autocast on CUDA and on CPUs with native bf16 (avx512_bf16 or AMX), fp32
    # elsewhere; bf16: autocast on CUDA and any CPU; fp32: none (docs/guides/gpu.md). Squash, the
    # routing softmax and the losses stay fp32 under autocast.
    amp: str = "auto"
    augment: str = "none"  # capsnet.data.augment strategy, applied to every batch in fit
    augment_params: AugmentParams = field(default_factory=AugmentParams)
    loss: str = "auto"  # auto (the model's default) | margin | cross-entropy | spread
    m_plus: float = 0.9
    m_minus: float = 0.1
    lam: float = 0.5
    recon_weight: float = 0.0005
    spread_margin: tuple[float, float] = (0.2, 0.9)
    spread_schedule: str = "linear"  # linear | sigmoid (official EM code)
    eval_batch_size: int = EvaluateParams.batch_size
    num_workers: int = 0
    # Models with compile_routing() (CapsNet: the whole forward; EM: the routing) are
    # torch.compiled (on CUDA with CUDA graphs); a compiled run trains on one batch shape,
    # so it drops the last partial batch of each epoch.
    compile: bool = False
    progress: bool | None = None  # None: a bar only when stderr is a terminal
    # Seconds of fit's clock (capsnet.training.run.budget_clock: CPU or GPU time): stop after the
    # epoch that ends nearest this time (validation included), ``epochs`` at most. None:
    # train exactly ``epochs``.
    time_budget: float | None = None

    def __post_init__(self):
        self.spread_margin = tuple(float(m) for m in self.spread_margin)
        for name in ("epochs", "batch_size", "lr_decay_steps", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        bounds = {"epochs": (1, MAX_EPOCHS), "batch_size": (1, MAX_BATCH),
                  "eval_batch_size": (1, MAX_BATCH), "num_workers": (0, MAX_WORKERS),
                  "seed": (0, MAX_SEED)}  # fmt: skip
        for name, (low, high) in bounds.items():
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(f"train.{name} must be in [{low}, {high:,}], got {value}")
        if self.time_budget is not None and not 0 < self.time_budget < float("inf"):
            raise ConfigError(f"train.time_budget must be > 0 seconds, got {self.time_budget}")
        if self.lr <= 0:
            raise ConfigError(f"train.lr must be > 0, got {self.lr}")
        if not 0 < self.lr_decay <= 1:
            raise ConfigError(f"train.lr_decay must be in (0, 1], got {self.lr_decay}")
        if self.augment not in STRATEGIES:
            raise ConfigError(
                f"augment.strategy {self.augment!r} unknown; choose one of {', '.join(STRATEGIES)}"
            )
        if self.loss not in LOSSES:
            raise ConfigError(
                f"train.loss {self.loss!r} unknown; choose one of {', '.join(LOSSES)}"
            )
        if self.amp not in PRECISIONS:
            raise ConfigError(
                f"train.amp {self.amp!r} unknown; choose one of {', '.join(PRECISIONS)}"
            )
        if self.spread_schedule not in ("linear", "sigmoid"):
            raise ConfigError(f"train.spread_schedule {self.spread_schedule!r}: linear or sigmoid")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
