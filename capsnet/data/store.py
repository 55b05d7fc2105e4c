"""Prepared-data files: tensors plus metadata in one ``.pt`` file, written atomically.

A prepared file is ``torch.save({"tensors": {...}, "meta": {...}})``, read back with
``weights_only=True`` (no pickled code, ``capsnet.io.torchfile``). A stage that writes several
files builds them in a temporary directory and swaps it into place only when everything
succeeded, so a failing stage leaves no partial output behind.

Every file is checked when loaded against the PreparedSpec its dataset declares
(``capsnet.config.dataset_specs``: keys, dtypes, shapes, value ranges) and against the
dataset and split it names in its meta, so a damaged, stale or misplaced file fails at once,
in one line naming the file and the command that rebuilds it, instead of deep inside training.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from capsnet.config.dataset_specs import PREPARES, REGISTRY
from capsnet.data.registry import resolve
from capsnet.io import torchfile
from capsnet.io.errors import DataError
from capsnet.io.files import input_problem

Bound = int | str | tuple[int, ...] | None


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: its dtype; its shape, ints fixed and names ("N") equal wherever they
    recur in the file; inclusive value bounds, an int, a meta field ("shift", "-shift"
    negated) or a tuple with one bound per column of the last axis."""

    dtype: torch.dtype
    shape: tuple[int | str, ...]
    low: Bound = None
    high: Bound = None
    required: bool = True
    columns: tuple[str, ...] = ()  # names of the last axis's columns, for messages


@dataclass(frozen=True)
class PreparedSpec:
    """The tensors of a prepared file and its meta fields, a type or a tuple of choices
    (meta ints are >= 0)."""

    tensors: dict[str, TensorSpec]
    meta: dict[str, type | tuple] = field(default_factory=dict)


def digits(side: int) -> dict[str, TensorSpec]:
    """The tensors of a prepared set of digits: side x side images and labels 0..9."""
    return {
        "images": TensorSpec(torch.uint8, ("N", side, side)),  # (N, side, side)
        "labels": TensorSpec(torch.int64, ("N",), 0, 9),  # (N,)
    }


def prepared_spec(dataset: str) -> PreparedSpec:
    """The PreparedSpec ``dataset`` declares in the registry."""
    return resolve(REGISTRY[dataset].prepared)


def save_prepared(path: str | os.PathLike, tensors: dict[str, torch.Tensor], **meta) -> Path:
    """Write ``tensors`` and JSON-like ``meta`` to ``path`` atomically."""
    payload = {"tensors": {k: v.contiguous() for k, v in tensors.items()}, "meta": meta}
    return torchfile.write(path, payload)


def rebuild_command(path: str | os.PathLike, dataset: str | None = None) -> str:
    """The command that rebuilds the prepared file ``<root>/prepared/<dataset>/<split>.pt``."""
    path = Path(path)
    dataset = dataset or path.parent.name
    if dataset not in PREPARES:
        return "capsnet data prepare DATASET"
    if path.parent.name == dataset and path.parent.parent.name == "prepared":
        return f"capsnet data prepare {dataset} --data-root {path.parent.parent.parent}"
    return f"capsnet data prepare {dataset}"


def prepared_error(path: str | os.PathLike, problem: str, dataset: str | None = None):
    """A DataError: ``path``, what is wrong with it and the command that rebuilds it."""
    return DataError(f"{path}: {problem}; rebuild it with `{rebuild_command(path, dataset)}`")


def load_prepared(
    path: str | os.PathLike, dataset: str | None = None, split: str | None = None
) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, meta) of a prepared file, checked against the spec of ``dataset`` (default:
    the folder name, ``<root>/prepared/<dataset>/<split>.pt``) and its meta's dataset and
    split against ``dataset`` and ``split`` (default: the file name); a one-line DataError
    naming the file and its rebuild command when it is missing, unreadable, malformed or
    another split's."""
    path = Path(path)
    dataset = dataset or (path.parent.name if path.parent.name in PREPARES else None)
    split = split or path.stem
    problem = input_problem(path)
    if problem is not None:
        problem = "prepared file not found" if problem == "not found" else problem
        raise prepared_error(path, problem, dataset)
    try:
        payload = torchfile.read(path)
    except torchfile.Unreadable as exc:
        raise prepared_error(path, exc.message("a prepared data file"), dataset) from None
    except OSError as exc:
        raise prepared_error(path, f"cannot be read ({exc.strerror})", dataset) from None
    problem = _structure_problem(payload)
    if problem is None and dataset is not None:
        spec = prepared_spec(dataset)
        problem = check_prepared(payload["tensors"], payload["meta"], spec, dataset)
    if problem is None and payload["meta"].get("split", split) != split:
        problem = f"it holds the {payload['meta']['split']!r} split, not {split!r}"
    if problem is not None:
        raise prepared_error(path, problem, dataset)
    return payload["tensors"], payload["meta"]


def _structure_problem(payload: Any) -> str | None:
    if not isinstance(payload, dict) or not isinstance(payload.get("tensors"), dict):
        return "not a prepared data file (no 'tensors' dict)"
    if not isinstance(payload.get("meta", {}), dict):
        return "its 'meta' is not a dict"
    payload.setdefault("meta", {})
    for key, value in payload["tensors"].items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            return f"its tensors entry {key!r} is a {type(value).__name__}, not a tensor"
        if not torchfile.within_storage(value):
            return f"tensor '{key}' claims {value.numel():,} values that the file does not hold"
    return None


def check_prepared(tensors: dict, meta: dict, spec: PreparedSpec, dataset: str) -> str | None:
    """What is wrong with ``tensors`` and ``meta`` under ``spec``, or None."""
    if meta.get("dataset", dataset) != dataset:
        return f"it holds {meta['dataset']!r} data, not {dataset!r}"
    for key, kind in spec.meta.items():
        problem = _meta_problem(meta, key, kind)
        if problem:
            return problem
    sizes: dict[str, int] = {}
    for key, tensor_spec in spec.tensors.items():
        if key not in tensors:
            if tensor_spec.required:
                return f"tensor '{key}' is missing"
            continue
        problem = _shape_problem(key, tensors[key], tensor_spec, sizes)
        problem = problem or _range_problem(key, tensors[key], tensor_spec, meta)
        if problem:
            return problem
    empty = [name for name, size in sizes.items() if size == 0]
    return f"it holds no items ({empty[0]} = 0)" if empty else None


def _meta_problem(meta: dict, key: str, kind: type | tuple) -> str | None:
    if key not in meta:
        return f"meta field '{key}' is missing"
    value = meta[key]
    if isinstance(kind, tuple):
        return None if value in kind else f"meta {key} = {value!r} is not one of {kind}"
    if type(value) is not kind:
        article = "an" if kind.__name__[0] in "aeiou" else "a"
        return f"meta {key} = {value!r} is not {article} {kind.__name__}"
    if kind is int and value < 0:
        return f"meta {key} = {value} is negative"
    return None


def _shape_problem(key: str, tensor: torch.Tensor, spec: TensorSpec, sizes: dict) -> str | None:
    if tensor.dtype != spec.dtype:
        wanted = str(spec.dtype).removeprefix("torch.")
        return f"tensor '{key}' is {str(tensor.dtype).removeprefix('torch.')}, expected {wanted}"
    shape = tuple(tensor.shape)
    if len(shape) == len(spec.shape):
        for size, want in zip(shape, spec.shape):
            if isinstance(want, str):
                sizes.setdefault(want, size)
    wanted = tuple(sizes.get(d, d) if isinstance(d, str) else d for d in spec.shape)
    if shape != wanted:
        text = "(" + ", ".join(str(d) for d in wanted) + ("," if len(wanted) == 1 else "") + ")"
        return f"tensor '{key}' has shape {tuple(shape)}, expected {text}"
    return None


def _range_problem(key: str, tensor: torch.Tensor, spec: TensorSpec, meta: dict) -> str | None:
    if tensor.numel() == 0 or (spec.low is None and spec.high is None):
        return None
    flat = tensor.reshape(-1, tensor.shape[-1]) if tensor.ndim > 1 else tensor.reshape(-1, 1)
    lows, highs = flat.amin(0).tolist(), flat.amax(0).tolist()  # per last-axis column
    for column, (smallest, largest) in enumerate(zip(lows, highs)):
        low, high = _bound(spec.low, column, meta), _bound(spec.high, column, meta)
        if (low is not None and smallest < low) or (high is not None and largest > high):
            per_column = isinstance(spec.low, tuple) or isinstance(spec.high, tuple)
            where = f" column {column}" if per_column else ""
            where += f" ({spec.columns[column]})" if spec.columns else ""
            value = smallest if low is not None and smallest < low else largest
            limits = f"{'' if low is None else low}..{'' if high is None else high}"
            return f"tensor '{key}'{where} holds {value}, outside {limits}"
    return None


def _bound(bound: Bound, column: int, meta: dict) -> int | None:
    if isinstance(bound, tuple):
        return bound[column]
    if isinstance(bound, str):
        return -meta[bound[1:]] if bound.startswith("-") else meta[bound]
    return bound
