"""What one evaluation needs: params.yaml's ``evaluate`` section plus what only the caller
knows (where the data lives, the mirror, where progress lines go)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from capsnet.config import DataParams, EvaluateParams


@dataclass(frozen=True)
class EvalRequest:
    """``params``: the evaluate settings (datasets, angles, limits, robustness, ...);
    ``data_root`` None means the default data directory; ``data``: params.yaml's whole
    ``data`` section, each dataset reading its own part (``settings``: the preprocessing
    the models were trained with, such as smallNORB's crop and standardisation)."""

    params: EvaluateParams = field(default_factory=EvaluateParams)
    data: DataParams = field(default_factory=DataParams)
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

    def settings(self, name: str) -> Any:
        """The settings of evaluation set ``name``'s dataset: ``data.<its section>``."""
        from capsnet.config import dataset_specs

        return dataset_specs.of_evaluation(name).settings(self.data)

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)
