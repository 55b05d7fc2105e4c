"""The one params validator: each field checked against its dataclass annotation.

``from_dict(cls, data, prefix, source)`` builds dataclass ``cls`` from plain data (YAML or
Python): nested dataclasses, tuples, lists, dicts, Optional, Literal choices and
``Searched[T]`` (a sweep dimension). Unknown keys, wrong types and non-finite floats are
ConfigErrors naming the dotted key, e.g. ``params.yaml: sweep.space.lr: ...``. Range checks
live in each dataclass's ``__post_init__`` and raise ``Invalid(field, message)``; the field
is relative to that dataclass and ``from_dict`` prefixes the section's dotted key.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, ClassVar, Generic, Literal, TypeVar

from capsnet.io.errors import ConfigError

T = TypeVar("T")

#: How a sweep dimension may be drawn: every value, sampled values, or sampled from a range.
DISTRIBUTIONS = ("grid", "choice", "uniform", "loguniform", "randint")
CHOICES = ("grid", "choice")


class Searched(Generic[T]):
    """Annotation of a sweep dimension: a fixed ``T``, ``{grid: [T, ...]}`` (every value),
    ``{choice: [T, ...]}`` (sampled), or ``{uniform|loguniform|randint: [low, high]}``
    (sampled; numbers only, ``randint`` for integers, high inclusive)."""


class Invalid(ConfigError):
    """A value out of range: ``field_name`` is relative to the dataclass that raises it."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field_name = field_name
        self.message = message


class Section:
    """A params.yaml section: a class that sets its own ``SECTION`` in a module of
    capsnet/config/ is that section (a field of ``capsnet.config.Params``), and
    ``Cls.from_dict(values)`` errors name ``SECTION``'s keys."""

    SECTION: ClassVar[str] = ""

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None = None, source: str = "params"):
        return from_dict(cls, values or {}, prefix=cls.SECTION, source=source)


# --- range checks for __post_init__ ------------------------------------------------------------


def at_least(obj, name: str, low: float) -> None:
    """``obj.name >= low`` (None passes: the annotation says whether it may be null)."""
    value = getattr(obj, name)
    if value is not None and value < low:
        raise Invalid(name, f"must be >= {low:g}, got {value}")


#: Upper bounds of the settings whose size is work or memory: a larger value would run for
#: days or exhaust the machine instead of failing, so it is refused up front.
MAX_EPOCHS = 100_000
MAX_CHECKS_PER_EPOCH = 1_000  # test-error checks per epoch
MAX_RUNS = 1_000  # seeds, sweep samples, retries
MAX_SEED = 2**32 - 1  # numpy's seed range; seed + seeds - 1 stays within it
MAX_BATCH = 65_536
MAX_ITEMS = 100_000_000  # sizes and limits of image sets (far above every dataset)
MAX_STEPS = 10_000  # attack steps
MAX_PIXELS = 1_024  # image sides, shifts and paddings
MAX_WORKERS = 256


def at_most(obj, name: str, high: float) -> None:
    """``obj.name <= high`` (None passes): the bound a setting may not exceed."""
    value = getattr(obj, name)
    if value is not None and value > high:
        raise Invalid(name, f"must be <= {high:,}, got {value}")


def count(obj, name: str, low: float, high: float) -> None:
    """``low <= obj.name <= high`` (None passes)."""
    at_least(obj, name, low)
    at_most(obj, name, high)


def seeds(obj, seed: str = "seed", runs: str | None = None) -> None:
    """``obj.seed`` in [0, MAX_SEED], and with ``runs`` (a count of seeds) the last seed too."""
    count(obj, seed, 0, MAX_SEED)
    if runs is not None:
        count(obj, runs, 1, MAX_RUNS)
        last = getattr(obj, seed) + getattr(obj, runs) - 1
        if last > MAX_SEED:
            raise Invalid(runs, f"{seed} + {runs} - 1 = {last} must be <= {MAX_SEED:,}")


def above(obj, name: str, low: float) -> None:
    value = getattr(obj, name)
    if value is not None and value <= low:
        raise Invalid(name, f"must be > {low:g}, got {value}")


def range_pair(obj, name: str, low: float = float("-inf")) -> None:
    lo, hi = getattr(obj, name)
    if lo > hi or lo < low:
        raise Invalid(name, f"[{lo}, {hi}] is not a range within [{low}, inf)")


def dimension_choices(value: Any) -> list:
    """The values a sweep dimension takes: the fixed value or the grid/choice list ([] when
    drawn from a range)."""
    if isinstance(value, dict):
        ((kind, values),) = value.items()
        return list(values) if kind in CHOICES else []
    return [value]


def dimension_values(value: Any) -> list:
    """Every number a dimension names: its choices, or a range's bounds (for range checks)."""
    if isinstance(value, dict):
        ((_, values),) = value.items()
        return list(values)
    return [value]


# --- the validator ---------------------------------------------------------------------------


def _type_name(tp) -> str:
    if dataclasses.is_dataclass(tp):  # a section's mapping: named by its keys
        return "{" + ", ".join(f.name for f in dataclasses.fields(tp)) + "}"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _fail(source: str, key: str, what: str) -> typing.NoReturn:
    raise ConfigError(f"{source}: {key}: {what}")


def _finite(value, key: str, source: str):
    """``value`` (any plain data) with every float finite and no string holding NUL."""
    if isinstance(value, float) and not math.isfinite(value):
        _fail(source, key, f"must be a finite number, got {value}")
    if isinstance(value, str) and "\x00" in value:
        _fail(source, key, "contains a NUL byte, which no path or name may hold")
    if isinstance(value, dict):
        for k, v in value.items():
            _finite(k, key, source)
            _finite(v, f"{key}.{k}", source)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _finite(v, f"{key}[{i}]", source)
    return value


def _scalar(tp, value, key: str, source: str):
    if tp is bool:
        if not isinstance(value, bool):
            _fail(source, key, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(source, key, f"expected an integer, got {value!r}")
        if not -(2**63) <= value < 2**63:
            _fail(source, key, f"{value} is too large (integers are 64-bit)")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(source, key, f"expected a number, got {value!r}")
        return _finite(float(value), key, source)
    if tp is str:
        if not isinstance(value, str):
            _fail(source, key, f"expected a string, got {value!r}")
        return _finite(value, key, source)
    if isinstance(tp, type) and not isinstance(value, tp):
        _fail(source, key, f"expected {_type_name(tp)}, got {value!r}")
    return _finite(value, key, source)


def _union(args, value, key: str, source: str):
    if value is None:
        if type(None) in args:
            return None
        _fail(source, key, "must not be empty")
    options = [a for a in args if a is not type(None)]
    if len(options) == 1 and typing.get_origin(options[0]) is Literal:  # names the choices
        return _convert(options[0], value, key, source)
    mappings = [o for o in options if dataclasses.is_dataclass(o)]
    if isinstance(value, dict) and len(mappings) == 1:  # its own errors name the key inside
        return _convert(mappings[0], value, key, source)
    for option in options:
        try:
            return _convert(option, value, key, source)
        except ConfigError:
            pass
    names = [_type_name(o) for o in options] + (["null"] if type(None) in args else [])
    _fail(source, key, f"expected {' or '.join(names)}, got {value!r}")


def _sequence(origin, args, value, key: str, source: str):
    if not isinstance(value, (list, tuple)):
        _fail(source, key, f"expected a list, got {value!r}")
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        if len(value) != len(args):
            _fail(source, key, f"expected {len(args)} values, got {len(value)}")
        types_ = args
    else:
        types_ = [args[0] if args else Any] * len(value)
    items = [_convert(t, v, f"{key}[{i}]", source) for i, (t, v) in enumerate(zip(types_, value))]
    return tuple(items) if origin is tuple else items


def _dimension(inner, value, key: str, source: str):
    """A ``Searched[inner]`` value: fixed, or {kind: values} (see ``Searched``)."""
    if not isinstance(value, dict):
        return _convert(inner, value, key, source)
    if len(value) != 1 or next(iter(value)) not in DISTRIBUTIONS:
        kinds = ", ".join(DISTRIBUTIONS)
        _fail(source, key, f"expected a value or one of {{{kinds}}}: [...], got {value!r}")
    ((kind, values),) = value.items()
    where = f"{key}.{kind}"
    if not isinstance(values, (list, tuple)) or not values:
        _fail(source, where, f"must be a non-empty list, got {values!r}")
    if kind in CHOICES:
        return {kind: [_convert(inner, v, f"{where}[{i}]", source) for i, v in enumerate(values)]}
    if inner not in (int, float):
        _fail(source, key, f"{kind} needs numbers; use grid or choice")
    if inner is int and kind != "randint":
        _fail(source, key, f"{kind} draws fractions; use randint, grid or choice")
    if len(values) != 2:
        _fail(source, where, f"must be [low, high], got {values!r}")
    bound = int if kind == "randint" else float
    low, high = (_convert(bound, v, f"{where}[{i}]", source) for i, v in enumerate(values))
    if not low < high:
        _fail(source, where, f"low {low} must be < high {high}")
    if kind == "loguniform" and low <= 0:
        _fail(source, where, f"bounds must be > 0, got {low}")
    return {kind: [low, high]}


def _convert(tp, value, key: str, source: str):
    """``value`` checked against (and converted to) type ``tp``; ConfigError naming ``key``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return _finite(value, key, source)
    if origin in (typing.Union, types.UnionType):
        return _union(args, value, key, source)
    if origin is Literal:
        if isinstance(value, bool) or value not in args:
            _fail(source, key, f"{value!r} unknown; choose one of {', '.join(map(str, args))}")
        return value
    if origin is Searched:
        return _dimension(args[0], value, key, source)
    if dataclasses.is_dataclass(tp):
        if value is None:
            return tp()
        if isinstance(value, tp):
            return value
        return from_dict(tp, value, prefix=key, source=source)
    if origin in (tuple, list):
        return _sequence(origin, args, value, key, source)
    if origin is dict:
        if not isinstance(value, dict):
            _fail(source, key, f"expected a mapping, got {value!r}")
        key_type, value_type = args or (Any, Any)
        return {
            _convert(key_type, k, key, source): _convert(value_type, v, f"{key}.{k}", source)
            for k, v in value.items()
        }
    return _scalar(tp, value, key, source)


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
