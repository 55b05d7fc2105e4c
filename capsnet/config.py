"""params.yaml schema: one dataclass per section, loaded and validated in this one place.

``load(path)`` returns a ``Params``; any unknown key or wrong type is a ConfigError naming
the dotted key, e.g. ``params.yaml: data.mnist.shfit: unknown key``. ``from_dict(cls, d)``
is the generic validator (nested dataclasses, tuples, lists, Optional, Literal choices); a
new section is one more dataclass and one more field of ``Params``. Range checks live in
each dataclass's ``__post_init__`` and raise ``Invalid(field, message)``.

Mirror resolution (``data.mirror``): a ``--mirror`` option wins, then the ``CAPSNET_MIRROR``
environment variable, then ``data.mirror``; empty means the official URLs only.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from capsnet.errors import ConfigError
from capsnet.eval_config import EvaluateParams, PublishParams
from capsnet.sweep_config import (
    FinalTrainConfig,
    SmallnorbSweepConfig,
    SmallnorbTrainConfig,
    SweepConfig,
)
from capsnet.viewpoints_config import ViewpointsParams

Merge = Literal["sum-clip", "max"]
Strategy = Literal["none", "shift", "rotate", "affine", "elastic"]
AffnistSource = Literal["synth", "real", "auto"]


class Invalid(ValueError):
    """A value out of range: ``field`` is relative to the dataclass that raises it."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field_name = field_name
        self.message = message


def _at_least(obj, name: str, low: float) -> None:
    value = getattr(obj, name)
    if value < low:
        raise Invalid(name, f"must be >= {low:g}, got {value}")


def _range_pair(obj, name: str, low: float = float("-inf")) -> None:
    lo, hi = getattr(obj, name)
    if lo > hi or lo < low:
        raise Invalid(name, f"[{lo}, {hi}] is not a range within [{low}, inf)")


# --- data -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MnistParams:
    enabled: bool = True


@dataclass(frozen=True)
class AffnistSynthParams:
    """affnist-synth: random affine maps of MNIST test digits on a 40x40 canvas (SPEC 2.2)."""

    seed: int = 0
    rotation_degrees: float = 20.0
    shear: float = 0.2
    scale: tuple[float, float] = (0.8, 1.2)
    limit: int | None = None  # first N MNIST test digits (None: all 10,000)

    def __post_init__(self):
        _at_least(self, "rotation_degrees", 0)
        _at_least(self, "shear", 0)
        _range_pair(self, "scale", 0.01)
        if self.limit is not None:
            _at_least(self, "limit", 1)


@dataclass(frozen=True)
class AffnistParams:
    """source: synth (offline default), real (the official files), auto (real when it can be
    downloaded, otherwise synth)."""

    enabled: bool = True
    source: AffnistSource = "synth"
    include_training: bool = False  # also fetch training_and_validation_batches.zip (1.6 GB)
    expanded_seed: int = 0
    synth: AffnistSynthParams = field(default_factory=AffnistSynthParams)


@dataclass(frozen=True)
class SmallnorbParams:
    enabled: bool = False
    size: int = 48
    crop: int = 32
    brightness: float = 0.2
    contrast: float = 0.2

    def __post_init__(self):
        _at_least(self, "size", 8)
        _at_least(self, "crop", 1)
        if self.crop > self.size:
            raise Invalid("crop", f"{self.crop} is larger than size {self.size}")
        _at_least(self, "brightness", 0)
        _at_least(self, "contrast", 0)


@dataclass(frozen=True)
class MultiMnistParams:
    enabled: bool = True
    seed: int = 0
    shift: int = 4
    pad: int = 4
    merge: Merge = "sum-clip"
    train_pairs_per_digit: int = 1
    test_pairs_per_digit: int = 1
    redraw_each_epoch: bool = True

    def __post_init__(self):
        _at_least(self, "shift", 0)
        _at_least(self, "pad", 0)
        _at_least(self, "train_pairs_per_digit", 1)
        _at_least(self, "test_pairs_per_digit", 1)


def _default_angles() -> tuple[float, ...]:
    return tuple(sorted({float(a) for a in range(-180, 181, 15)} | {35.0}))


@dataclass(frozen=True)
class RotatedParams:
    enabled: bool = True
    angles: tuple[float, ...] = field(default_factory=_default_angles)

    def __post_init__(self):
        if not self.angles:
            raise Invalid("angles", "must list at least one angle")


@dataclass(frozen=True)
class DataParams:
    mirror: str = ""
    mnist: MnistParams = field(default_factory=MnistParams)
    affnist: AffnistParams = field(default_factory=AffnistParams)
    smallnorb: SmallnorbParams = field(default_factory=SmallnorbParams)
    multimnist: MultiMnistParams = field(default_factory=MultiMnistParams)
    rotated: RotatedParams = field(default_factory=RotatedParams)

    def resolved_mirror(self, option: str | None = None) -> str | None:
        """--mirror option, else $CAPSNET_MIRROR, else data.mirror, else None."""
        return option or os.environ.get("CAPSNET_MIRROR") or self.mirror or None


# --- augment ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShiftAugment:
    pixels: int = 2

    def __post_init__(self):
        _at_least(self, "pixels", 0)


@dataclass(frozen=True)
class RotateAugment:
    degrees: float = 15.0

    def __post_init__(self):
        _at_least(self, "degrees", 0)


@dataclass(frozen=True)
class AffineAugment:
    degrees: float = 15.0
    shear_degrees: float = 10.0
    scale: tuple[float, float] = (0.9, 1.1)
    translate_pixels: int = 2

    def __post_init__(self):
        _at_least(self, "degrees", 0)
        _at_least(self, "shear_degrees", 0)
        _range_pair(self, "scale", 0.01)
        _at_least(self, "translate_pixels", 0)


@dataclass(frozen=True)
class ElasticAugment:
    alpha: float = 34.0
    sigma: float = 4.0

    def __post_init__(self):
        _at_least(self, "alpha", 0)
        if self.sigma <= 0:
            raise Invalid("sigma", f"must be > 0, got {self.sigma}")


@dataclass(frozen=True)
class AugmentParams:
    """Training augmentation: ``strategy`` picks one of the parameter blocks below."""

    strategy: Strategy = "shift"
    seed: int = 0
    shift: ShiftAugment = field(default_factory=ShiftAugment)
    rotate: RotateAugment = field(default_factory=RotateAugment)
    affine: AffineAugment = field(default_factory=AffineAugment)
    elastic: ElasticAugment = field(default_factory=ElasticAugment)


# --- the whole file ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """All of params.yaml. Add a section as a dataclass field here (default: its defaults)."""

    data: DataParams = field(default_factory=DataParams)
    augment: AugmentParams = field(default_factory=AugmentParams)
    sweep: SweepConfig = field(default_factory=SweepConfig)  # issue 4: capsnet/sweep_config.py
    train: FinalTrainConfig = field(default_factory=FinalTrainConfig)
    evaluate: EvaluateParams = field(default_factory=EvaluateParams)  # issue 5: eval_config.py
    publish: PublishParams = field(default_factory=PublishParams)
    # issue 6: the smallNORB ablation sweep and its final training (capsnet/sweep_config.py)
    smallnorb_sweep: SmallnorbSweepConfig = field(default_factory=SmallnorbSweepConfig)
    smallnorb_train: SmallnorbTrainConfig = field(default_factory=SmallnorbTrainConfig)
    viewpoints: ViewpointsParams = field(default_factory=ViewpointsParams)  # issue 6


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp, value, key: str, source: str):
    """``value`` checked against (and converted to) type ``tp``; ConfigError naming ``key``."""

    def fail(what: str):
        raise ConfigError(f"{source}: {key}: {what}")

    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            fail("must not be empty")
        options = [a for a in args if a is not type(None)]
        for option in options:
            try:
                return _convert(option, value, key, source)
            except ConfigError:
                pass
        names = [_type_name(o) for o in options] + (["null"] if type(None) in args else [])
        fail(f"expected {' or '.join(names)}, got {value!r}")
    if origin is Literal:
        if value not in args:
            fail(f"{value!r} unknown; choose one of {', '.join(map(str, args))}")
        return value
    if dataclasses.is_dataclass(tp):
        if value is None:
            return tp()
        return from_dict(tp, value, prefix=key, source=source)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            fail(f"expected a list, got {value!r}")
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(value) != len(args):
                fail(f"expected {len(args)} values, got {len(value)}")
            items = [
                _convert(a, v, f"{key}[{i}]", source) for i, (a, v) in enumerate(zip(args, value))
            ]
        else:
            item_type = args[0] if args else Any
            items = [_convert(item_type, v, f"{key}[{i}]", source) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            fail(f"expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            fail(f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            fail(f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fail(f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            fail(f"expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and not isinstance(value, tp):
        fail(f"expected {_type_name(tp)}, got {value!r}")
    return value


def from_dict(cls, data, prefix: str = "", source: str = "params"):
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and wrong types."""
    where = prefix or "(top level)"
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: {where}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    dotted = (lambda k: f"{prefix}.{k}") if prefix else (lambda k: str(k))
    for key in data:
        if key not in names:
            raise ConfigError(f"{source}: {dotted(key)}: unknown key (known: {', '.join(names)})")
    kwargs = {k: _convert(hints[k], v, dotted(k), source) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except Invalid as exc:
        raise ConfigError(f"{source}: {dotted(exc.field_name)}: {exc.message}") from None


def to_dict(obj) -> dict:
    """A params dataclass as plain YAML-ready data (tuples become lists)."""

    def plain(value):
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(dataclasses.asdict(obj))


def load(path: str | os.PathLike = "params.yaml") -> Params:
    """Read and validate a params file (a missing section takes its defaults)."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path.name}:{where} not valid YAML") from None
    return from_dict(Params, data or {}, source=path.name)


def load_or_default(path: str | os.PathLike | None) -> Params:
    """``load(path)`` when the file exists (or was named explicitly), else the defaults."""
    if path is None:
        return load("params.yaml") if Path("params.yaml").is_file() else Params()
    return load(path)
