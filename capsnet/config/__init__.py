"""params.yaml: one dataclass per section, validated in one place (capsnet.config.schema).

``load(path)`` returns a ``Params``; an unknown key, a wrong type, a non-finite float or a
duplicate key is a ConfigError naming the dotted key, e.g.
``params.yaml: data.mnist.shfit: unknown key``. A new section is one more dataclass (in the
module of its group) and one more field of ``Params``; its defaults live only there.
No torch here: the CLI validates params before any model code loads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from capsnet.config.data import (
    DATA_ROOT,
    STRATEGIES,
    AffineAugment,
    AffnistParams,
    AffnistSource,
    AffnistSynthParams,
    AugmentParams,
    DataParams,
    ElasticAugment,
    Merge,
    MnistParams,
    MultiMnistParams,
    RotateAugment,
    ShiftAugment,
    SmallnorbParams,
    SmallnorbSynthParams,
    Strategy,
)
from capsnet.config.evaluate import (
    EVAL_DATASETS,
    EquivarianceParams,
    EvaluateParams,
    PublishParams,
    RobustnessParams,
)
from capsnet.config.schema import (
    DISTRIBUTIONS,
    Invalid,
    Searched,
    Section,
    from_dict,
    to_dict,
)
from capsnet.config.sweep import (
    ABLATION,
    DATASETS,
    EXTRA_DATASETS,
    LOSSES,
    POSES,
    SEARCHABLE,
    SEARCHABLE_TYPES,
    AshaConfig,
    FinalTrainConfig,
    ResourcesConfig,
    SearchSpace,
    SmallnorbSearchSpace,
    SmallnorbSweepConfig,
    SmallnorbTrainConfig,
    SweepConfig,
    TrialCheckpointConfig,
    WandbConfig,
)
from capsnet.config.trace import trace
from capsnet.config.viewpoints import (
    DATA_FIELDS,
    KINDS,
    ROLES,
    PerModelFloat,
    PerModelOverrides,
    ViewpointsParams,
)
from capsnet.config.yamlfile import read_yaml
from capsnet.io.errors import ConfigError

__all__ = [
    "ABLATION",
    "DATASETS",
    "DATA_FIELDS",
    "DATA_ROOT",
    "DISTRIBUTIONS",
    "EVAL_DATASETS",
    "EXTRA_DATASETS",
    "KINDS",
    "LOSSES",
    "POSES",
    "ROLES",
    "SEARCHABLE",
    "SEARCHABLE_TYPES",
    "STRATEGIES",
    "AffineAugment",
    "AffnistParams",
    "AffnistSource",
    "AffnistSynthParams",
    "AshaConfig",
    "AugmentParams",
    "ConfigError",
    "DataParams",
    "ElasticAugment",
    "EquivarianceParams",
    "EvaluateParams",
    "FinalTrainConfig",
    "Invalid",
    "Merge",
    "MnistParams",
    "MultiMnistParams",
    "Params",
    "PerModelFloat",
    "PerModelOverrides",
    "PublishParams",
    "ResourcesConfig",
    "RobustnessParams",
    "RotateAugment",
    "SearchSpace",
    "Searched",
    "Section",
    "ShiftAugment",
    "SmallnorbParams",
    "SmallnorbSearchSpace",
    "SmallnorbSweepConfig",
    "SmallnorbSynthParams",
    "SmallnorbTrainConfig",
    "Strategy",
    "SweepConfig",
    "TrialCheckpointConfig",
    "ViewpointsParams",
    "WandbConfig",
    "from_dict",
    "load",
    "load_or_default",
    "to_dict",
]  # fmt: skip


@dataclass(frozen=True)
class Params:
    """All of params.yaml. Add a section as a dataclass field here (default: its defaults)."""

    data: DataParams = field(default_factory=DataParams)
    augment: AugmentParams = field(default_factory=AugmentParams)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    train: FinalTrainConfig = field(default_factory=FinalTrainConfig)
    evaluate: EvaluateParams = field(default_factory=EvaluateParams)
    publish: PublishParams = field(default_factory=PublishParams)
    smallnorb_sweep: SmallnorbSweepConfig = field(default_factory=SmallnorbSweepConfig)
    smallnorb_train: SmallnorbTrainConfig = field(default_factory=SmallnorbTrainConfig)
    viewpoints: ViewpointsParams = field(default_factory=ViewpointsParams)


def load(path: str | os.PathLike = "params.yaml") -> Params:
    """Read and validate a params file (a missing section takes its defaults)."""
    path = Path(path)

    def read() -> Params:
        return from_dict(Params, read_yaml(path) or {}, source=path.name)

    return trace(read(), path, read)


def load_or_default(path: str | os.PathLike | None) -> Params:
    """``load(path)`` when the file exists (or was named explicitly), else the defaults."""
    if path is None:
        return load("params.yaml") if Path("params.yaml").is_file() else Params()
    return load(path)
