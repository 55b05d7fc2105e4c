"""params.yaml: one dataclass per section, validated in one place (capsnet.config.schema).

``load(path)`` returns a ``Params``; an unknown key, a wrong type, a non-finite float or a
duplicate key is a ConfigError naming the dotted key, e.g.
``params.yaml: data.mnist.shfit: unknown key``. A new section is one more dataclass with a
``SECTION`` name in a module of this package; ``Params`` has a field for each (``SECTIONS``)
and its defaults live only there.
No torch here: the CLI validates params before any model code loads.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
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
    ROLE_CAPSULES,
    ROLES,
    PerModelCount,
    PerModelEpochs,
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
    "ROLE_CAPSULES",
    "SEARCHABLE",
    "SEARCHABLE_TYPES",
    "SECTIONS",
    "SECTION_MODULES",
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
    "PerModelCount",
    "PerModelEpochs",
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
    "find_sections",
    "from_dict",
    "load",
    "load_or_default",
    "to_dict",
]  # fmt: skip


#: The modules a section may live in: every module of this package (``pipeline.dvc.deps``
#: reads the pattern, so every stage that loads params depends on each of them).
SECTION_MODULES = "capsnet.config.*"


def find_sections(modules: str = SECTION_MODULES) -> dict[str, type]:
    """Section name -> its dataclass: each class that sets its own ``SECTION`` in a module
    of the package ``modules`` names (``"package.*"``), modules by name and classes in
    their order there."""
    package = importlib.import_module(modules.removesuffix(".*"))
    found: dict[str, type] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for value in vars(module).values():
            own = isinstance(value, type) and value.__module__ == module.__name__
            name = vars(value).get("SECTION") if own else None
            if not name:
                continue
            if name in found:
                raise ConfigError(
                    f"{module.__file__}: section {name!r} is already declared by "
                    f"{found[name].__module__}.{found[name].__name__}"
                )
            found[name] = value
    return found


#: Every params.yaml section, found in this package's modules (a new section is a
#: dataclass with ``SECTION`` in a module here; its defaults live only there).
SECTIONS: dict[str, type] = find_sections()

#: All of params.yaml: one field per section, defaulting to the section's defaults.
Params = dataclasses.make_dataclass(
    "Params",
    [(name, cls, dataclasses.field(default_factory=cls)) for name, cls in SECTIONS.items()],
    frozen=True,
    namespace={"__module__": __name__, "__doc__": "All of params.yaml, one field per section."},
)


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
