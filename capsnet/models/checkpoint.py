"""Checkpoints: weights plus everything needed to rebuild and judge the model.

A checkpoint is a plain dict of tensors and primitives, loaded with
``torch.load(weights_only=True)`` (``capsnet.io.torchfile``), so a file carrying a pickled
object is refused without running it. It holds the model name and config, the training
config, metrics and the package version; ``load(path)`` alone rebuilds the model.

Nothing is built from a file before it is checked: the header's types, the config against
its dataclass, then the weights' names, shapes and dtypes against the same model built on
the ``meta`` device (no memory), so a small file cannot ask for a huge model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import types
import typing
from pathlib import Path
from typing import Any

import torch
from torch import nn

import capsnet
from capsnet import models
from capsnet.io import torchfile
from capsnet.io.errors import CapsnetError, CheckpointError, NonFiniteOutputs
from capsnet.io.files import input_problem

FORMAT = "capsnet-checkpoint"
FORMAT_VERSION = 1


def save(
    path: str | os.PathLike,
    model: nn.Module,
    *,
    train_config: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` (registered name + config + weights) and metadata atomically."""
    name = getattr(model, "model_name", None)
    if name is None:
        raise CheckpointError("model has no registered name (build it with capsnet.models.build)")
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model_name": name,
        "model_config": dataclasses.asdict(model.config),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "train_config": dict(train_config or {}),
        "metrics": dict(metrics or {}),
        "extra": dict(extra or {}),
        "capsnet_version": capsnet.__version__,
        "torch_version": str(torch.__version__),
    }
    return torchfile.write(path, payload)


def read(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The raw checkpoint dict with its header checked; CheckpointError naming the file when
    it is missing, no PyTorch file, truncated, damaged, foreign, unsafe or badly typed."""
    path = Path(path)
    problem = input_problem(path)
    if problem is not None:
        problem = "checkpoint not found" if problem == "not found" else problem
        raise CheckpointError(f"{path}: {problem}")
    try:
        payload = torchfile.read(path, map_location)
    except torchfile.Unreadable as exc:
        raise CheckpointError(f"{path}: {exc.message('a capsnet checkpoint')}") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint ({exc.strerror})") from None
    _check_header(path, payload)
    _check_sections(path, payload)
    _check_config(path, payload["model_name"], payload["model_config"])
    _check_state(path, payload["state_dict"])
    # A field the file predates means what the model was trained with, not today's default.
    legacy = getattr(models.spec(payload["model_name"]).config_cls, "missing_field_defaults", {})
    payload["model_config"] = {**legacy, **payload["model_config"]}
    return payload


def load(
    path: str | os.PathLike, map_location: str | torch.device = "cpu"
) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model of a checkpoint; returns (model in eval mode, metadata)."""
    payload = read(path, map_location)
    name, config, state = payload["model_name"], payload["model_config"], payload["state_dict"]
    _check_weights_fit(path, name, config, state)
    model = models.build_from_config(name, config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1].strip()
        raise CheckpointError(f"{path}: weights do not load into {name!r} ({reason})") from None
    model.eval()
    meta = {k: v for k, v in payload.items() if k != "state_dict"}
    return model, meta


@contextlib.contextmanager
def scoring(path: str | os.PathLike):
    """Score the model loaded from ``path``: non-finite outputs become a CheckpointError
    naming the file, like non-finite weights."""
    try:
        yield
    except NonFiniteOutputs as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def _check_header(path: Path, payload: Any) -> None:
    """A dict with the capsnet header: format, version and a registered model name."""
    if not isinstance(payload, dict):
        raise CheckpointError(
            f"{path}: not a capsnet checkpoint: a PyTorch file holding a "
            f"{type(payload).__name__}, not the capsnet header"
        )
    if "format" not in payload:
        if payload and all(isinstance(v, torch.Tensor) for v in payload.values()):
            raise CheckpointError(
                f"{path}: not a capsnet checkpoint: a plain state_dict of {len(payload)} "
                "tensor(s), without the model name and config (write checkpoints with "
                "`capsnet train` or capsnet.models.checkpoint.save)"
            )
        keys = ", ".join(sorted(str(k) for k in payload)[:5]) or "none"
        raise CheckpointError(
            f"{path}: not a capsnet checkpoint (no '{FORMAT}' header; keys: {keys})"
        )
    if payload["format"] != FORMAT:
        raise CheckpointError(
            f"{path}: not a capsnet checkpoint (format {payload['format']!r}, expected {FORMAT!r})"
        )
    version = payload.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {version!r} is not supported "
            f"(expected {FORMAT_VERSION})"
        )
    for key in ("model_name", "model_config", "state_dict"):
        if key not in payload:
            raise CheckpointError(f"{path}: checkpoint lacks '{key}'")
    name = payload["model_name"]
    if not isinstance(name, str):
        raise CheckpointError(f"{path}: model_name is {_a(type(name))}, expected a string")
    if name not in models.names():
        raise CheckpointError(
            f"{path}: unknown model {name!r}; this capsnet knows: {', '.join(models.names())}"
        )


#: Header entries beside the weights and their types (absent ones are allowed).
SECTIONS = {
    "model_config": dict,
    "state_dict": dict,
    "train_config": dict,
    "metrics": dict,
    "extra": dict,
    "capsnet_version": str,
    "torch_version": str,
}


def _check_sections(path: Path, payload: dict) -> None:
    """Every header entry of its type; the metadata dicts hold only plain values."""
    for key, kind in SECTIONS.items():
        if key in payload and not isinstance(payload[key], kind):
            raise CheckpointError(
                f"{path}: '{key}' is {_a(type(payload[key]))}, expected {_a(kind)}"
            )
    for key in ("model_config", "train_config", "metrics", "extra"):
        if key in payload and not _plain(payload[key]):
            raise CheckpointError(
                f"{path}: '{key}' holds values other than strings, numbers, booleans, "
                "lists and dicts"
            )


def _plain(value: Any, depth: int = 0) -> bool:
    """JSON-like: str, int, float, bool, None, and lists, tuples and str-keyed dicts of them."""
    if depth > 32:
        return False
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    return False


def _check_config(path: Path, name: str, config: dict) -> None:
    """Every config field known to model ``name`` and of its dataclass type."""
    config_cls = models.spec(name).config_cls
    hints = typing.get_type_hints(config_cls)
    fields = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(config) - fields)
    if unknown:
        raise CheckpointError(f"{path}: model {name!r} has no config field(s) {', '.join(unknown)}")
    for key, value in config.items():
        if not _fits(value, hints[key]):
            raise CheckpointError(
                f"{path}: model_config.{key} = {_short(value)} is not a valid "
                f"{_hint_name(hints[key])}"
            )


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is a plain value of type ``hint`` (ints fit float fields; ints are
    int64, floats finite)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return type(value) is int and -(2**63) <= value < 2**63
    if hint is float:
        return type(value) in (int, float) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if hint is type(None):
        return value is None
    if origin in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    return _plain(value)


def _hint_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _a(kind: type) -> str:
    """'an int', 'a list': a type name with its article."""
    name = kind.__name__
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_state(path: Path, state: dict) -> None:
    """Named tensors, each within its own storage (no expanded views), all finite."""
    for key, tensor in state.items():
        if not isinstance(key, str) or not isinstance(tensor, torch.Tensor):
            raise CheckpointError(
                f"{path}: state_dict entry {_short(key)} is {_a(type(tensor))}, "
                "expected a named tensor"
            )
        if not torchfile.within_storage(tensor):
            raise CheckpointError(
                f"{path}: weight {key} claims {tensor.numel():,} values that its stored "
                "data does not hold"
            )
        if (tensor.is_floating_point() or tensor.is_complex()) and not bool(
            torch.isfinite(tensor).all()
        ):
            raise CheckpointError(
                f"{path}: weight {key} holds NaN or infinite values (did training diverge?)"
            )


class _NoRandomFill(torch.overrides.TorchFunctionMode):
    """In-place random fills (weight initialisation) do nothing: meta tensors hold no values,
    and the meta kernel of ``normal_`` imports torch._dynamo (about 2 CPU-s a process)."""

    FILLS = frozenset(
        {torch.Tensor.normal_, torch.Tensor.uniform_, nn.init.normal_, nn.init.uniform_}
    )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FILLS:
            return args[0] if args else kwargs["tensor"]  # unfilled
        return func(*args, **kwargs)


def _check_weights_fit(path: Path, name: str, config: dict, state: dict) -> None:
    """The saved weights are exactly those of model ``name`` built from ``config``: compared
    with the model built on the meta device, so nothing is allocated for a bogus config."""
    try:
        with torch.device("meta"), _NoRandomFill():
            expected = models.build_from_config(name, config).state_dict()
    except CapsnetError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    except (ArithmeticError, RuntimeError, ValueError, TypeError, MemoryError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: config does not build model {name!r} ({reason})") from None
    wanted = sum(t.numel() for t in expected.values())
    held = sum(t.numel() for t in state.values())
    if wanted > held:
        raise CheckpointError(
            f"{path}: its config asks model {name!r} for {wanted:,} weights but the file "
            f"holds {held:,}; not built"
        )
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    common = sorted(set(expected) & set(state))
    mismatched = [k for k in common if tuple(expected[k].shape) != tuple(state[k].shape)]
    dtypes = [k for k in common if expected[k].dtype != state[k].dtype]
    parts = []
    for label, keys in (
        ("missing", missing),
        ("unexpected", unexpected),
        ("shape mismatch in", mismatched),
        ("dtype mismatch in", dtypes),
    ):
        if keys:
            more = f" (+{len(keys) - 3} more)" if len(keys) > 3 else ""
            parts.append(f"{label} {', '.join(keys[:3])}{more}")
    if parts:
        raise CheckpointError(
            f"{path}: weights do not fit model {name!r} with the saved config ({'; '.join(parts)})"
        )
