"""Model registry: every model is registered by name beside its Config dataclass.

``build(name, shape, **overrides)`` makes a model, shaped for data of ``shape`` (channels,
image size, classes); ``names()`` lists them. A model's config
(``model.config``, a dataclass) is saved in every checkpoint so the checkpoint alone
rebuilds the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from capsnet.io.errors import ConfigError


class ModelOutput(NamedTuple):
    """What every model returns.

    scores: (B, classes): capsule lengths / activations for capsule models, logits otherwise.
    poses: (B, classes, D) class capsule poses, or None.
    reconstruction: (B, C, H, W) decoder output ((B, n, C, H, W) when masked by n labels per
        example), or None.
    """

    scores: torch.Tensor
    poses: torch.Tensor | None = None
    reconstruction: torch.Tensor | None = None


class Shape(NamedTuple):
    """What a model needs to know of its data: (channels, image size, classes)."""

    in_channels: int
    input_size: int
    num_classes: int


#: The config fields that ``Shape`` sets, where a model's config has them.
SHAPE_FIELDS = Shape._fields


class ModelSpec(NamedTuple):
    name: str
    model_cls: type[nn.Module]
    config_cls: type
    defaults: dict[str, Any]
    description: str
    capsules: bool  # a capsule network (routes between capsules), not a conventional one
    family: str  # the published model it is compared with (capsnet, em, lenet5, ...)


_REGISTRY: dict[str, ModelSpec] = {}


def register(
    name: str,
    config_cls: type,
    description: str = "",
    *,
    capsules: bool,
    family: str,
    **defaults: Any,
) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator (may be stacked) registering a model under ``name``; ``capsules``
    says whether it is a capsule network, ``family`` which published model its numbers are
    compared with (the paper numbers are keyed by family, never by a model's name)."""

    def wrap(model_cls: type[nn.Module]) -> type[nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} registered twice")
        _REGISTRY[name] = ModelSpec(
            name, model_cls, config_cls, defaults, description, capsules, family
        )
        return model_cls

    return wrap


def names() -> list[str]:
    """Registered model names, sorted."""
    _load_families()
    return sorted(_REGISTRY)


def spec(name: str) -> ModelSpec:
    _load_families()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(names())}")
    return _REGISTRY[name]


def registered(name: str) -> ModelSpec | None:
    """The registration of model ``name``, None when no model is registered under it (a
    result file may name a model this version no longer has)."""
    _load_families()
    return _REGISTRY.get(name)


def role_problem(name: str, role: str, wants_capsules: bool) -> str | None:
    """Why model ``name`` cannot fill ``role``, a role that takes a capsule network when
    ``wants_capsules`` (the viewpoint roles: config ``ROLE_CAPSULES``), or None."""
    capsules = spec(name).capsules
    if capsules == wants_capsules:
        return None
    what = "a capsule network" if capsules else "not a capsule network"
    return f"model {name!r} is {what}, so it cannot be the {role} role"


def config_fields(name: str) -> set[str]:
    """The config field names of model ``name``."""
    return {f.name for f in dataclasses.fields(spec(name).config_cls)}


def make_config(name: str, shape: Shape | tuple[int, ...] | None = None, **overrides: Any):
    """The config dataclass of ``name`` with its registered defaults, the ``shape`` fields
    the config has (a model without ``in_channels`` keeps its single channel), and
    ``overrides`` (which may not name shape fields when ``shape`` is given)."""
    model_spec = spec(name)
    fields = config_fields(name)
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ConfigError(
            f"model {name!r} has no config field(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(fields))}"
        )
    shaped = {}
    if shape is not None:
        check_shape_overrides(name, overrides)
        shaped = {k: v for k, v in zip(SHAPE_FIELDS, shape) if k in fields}
    values = {**model_spec.defaults, **shaped, **overrides}
    try:
        return model_spec.config_cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model {name!r}: {exc}") from None


def check_shape_overrides(name: str, overrides: dict[str, Any]) -> None:
    """ConfigError when ``overrides`` name a field the data sets (``SHAPE_FIELDS``)."""
    clash = sorted(set(overrides) & set(SHAPE_FIELDS))
    if clash:
        raise ConfigError(f"model {name!r}: {', '.join(clash)} follow(s) the data; do not override")


def with_shape(name: str, config: Any, shape: Shape | tuple[int, ...]) -> Any:
    """``config`` (``make_config`` without a shape) with the ``shape`` fields it has."""
    fields = config_fields(name)
    try:
        return dataclasses.replace(
            config, **{k: v for k, v in zip(SHAPE_FIELDS, shape) if k in fields}
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model {name!r}: {exc}") from None


def build(
    name: str, shape: Shape | tuple[int, int, int] | None = None, **overrides: Any
) -> nn.Module:
    """Build model ``name`` for data of ``shape``; keyword overrides replace config fields."""
    return from_config(name, make_config(name, shape, **overrides))


def from_config(name: str, config: Any) -> nn.Module:
    """Model ``name`` built from its config dataclass."""
    model = spec(name).model_cls(config)
    model.model_name = name
    return model


def build_from_config(name: str, config: dict[str, Any]) -> nn.Module:
    """Rebuild a model from a saved config dict (all fields given explicitly)."""
    model_spec = spec(name)
    config = dict(config)
    fields = {f.name for f in dataclasses.fields(model_spec.config_cls)}
    unknown = sorted(set(config) - fields)
    if unknown:
        raise ConfigError(f"model {name!r} has no config field(s) {', '.join(unknown)}")
    try:
        cfg = model_spec.config_cls(**config)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"model {name!r}: {exc}") from None
    model = model_spec.model_cls(cfg)
    model.model_name = name
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


#: Every module of this package, imported for the models it registers: a new model is its
#: module alone (and the DVC stages that build models depend on every module here).
FAMILY_MODULES = "capsnet.models.*"


def _load_families() -> None:
    import importlib
    import pkgutil

    package = importlib.import_module(FAMILY_MODULES.removesuffix(".*"))
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        importlib.import_module(f"{package.__name__}.{info.name}")


__all__ = [
    "SHAPE_FIELDS",
    "ModelOutput",
    "Shape",
    "build",
    "build_from_config",
    "config_fields",
    "count_parameters",
    "make_config",
    "names",
    "register",
    "registered",
    "spec",
]
