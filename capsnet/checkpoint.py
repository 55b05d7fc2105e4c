"""Checkpoints: weights plus everything needed to rebuild and judge the model.

A checkpoint is a plain dict of tensors and primitives, loaded with
``torch.load(weights_only=True)``, so a file carrying a pickled object is refused
without running it. It holds the model name and config, the training config, metrics
and the package version; ``load(path)`` alone rebuilds the model.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

import capsnet
from capsnet import models
from capsnet.errors import CapsnetError, CheckpointError
from capsnet.io import atomic_open

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
    with atomic_open(path) as fh:
        torch.save(payload, fh)
    return Path(path)


def read(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The raw checkpoint dict, validated; CheckpointError with the path on any problem."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: checkpoint not found")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a file")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).strip().splitlines()
        detail = next((line for line in reason if "Unsupported global" in line), "")
        raise CheckpointError(
            f"{path}: refused to load: it holds Python objects that weights_only loading "
            f"does not allow ({detail.strip() or 'unsafe pickle payload'})"
        ) from None
    except Exception as exc:  # torch.load raises many types for foreign or truncated files
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: truncated or not a PyTorch checkpoint ({first})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a capsnet checkpoint (no '{FORMAT}' header)")
    if payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format version {payload.get('format_version')} is not "
            f"supported (expected {FORMAT_VERSION})"
        )
    for key in ("model_name", "model_config", "state_dict"):
        if key not in payload:
            raise CheckpointError(f"{path}: checkpoint lacks '{key}'")
    return payload


def load(
    path: str | os.PathLike, map_location: str | torch.device = "cpu"
) -> tuple[nn.Module, dict[str, Any]]:
    """Rebuild the model of a checkpoint; returns (model in eval mode, metadata)."""
    payload = read(path, map_location)
    name = payload["model_name"]
    try:
        model = models.build_from_config(name, payload["model_config"])
    except CapsnetError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    state = payload["state_dict"]
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = sorted(
        k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape)
    )
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:3])}")
        if unexpected:
            parts.append(f"unexpected {', '.join(unexpected[:3])}")
        if mismatched:
            parts.append(f"shape mismatch in {', '.join(mismatched[:3])}")
        raise CheckpointError(
            f"{path}: weights do not fit model {name!r} with the saved config ({'; '.join(parts)})"
        )
    model.load_state_dict(state)
    model.eval()
    meta = {k: v for k, v in payload.items() if k != "state_dict"}
    return model, meta
