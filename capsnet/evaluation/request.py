"""What one evaluation needs: params.yaml's ``evaluate`` section plus what only the caller
knows (where the data lives, the mirror, where progress lines go)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from capsnet.config import EvaluateParams, SmallnorbParams


@dataclass(frozen=True)
class EvalRequest:
    """``params``: the evaluate settings (datasets, angles, limits, robustness, ...);
    ``data_root`` None means the default data directory; ``smallnorb``: the data.smallnorb
    settings the models were trained with (crop, standardisation)."""

    params: EvaluateParams = field(default_factory=EvaluateParams)
    smallnorb: SmallnorbParams = field(default_factory=SmallnorbParams)
    data_root: str | Path | None = None
    mirror: str | None = None
    log: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    @functools.cached_property
    def device(self) -> torch.device:
        """The device models are scored on: ``params.device`` (auto: cuda, then mps, then
        cpu), checked once by ``capsnet.training.device.select_device``."""
        from capsnet.io.errors import ConfigError
        from capsnet.training.device import select_device

        try:
            return select_device(self.params.device)
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("--device", "evaluate.device", 1)) from None

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` moved to ``device``, its EM routing compiled when ``params.compile``
        asks (``EMCapsNet.compile_routing``; other models are scored eagerly)."""
        from capsnet.models.em import EMCapsNet

        model.to(self.device)
        if isinstance(model, EMCapsNet):
            model.compile_routing(self.params.compile)
        return model

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)
