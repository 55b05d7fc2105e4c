"""What one evaluation needs: params.yaml's ``evaluate`` section plus what only the caller
knows (where the data lives, the mirror, where progress lines go)."""

from __future__ import annotations

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

    @property
    def device(self) -> torch.device:
        return torch.device(self.params.device)

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)
