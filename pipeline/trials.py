"""One training run from a flat config dict: the conversion a Tune trial and the final
training share, and the MNIST split both use. No Ray here.

A run config is the flat dict Tune samples (``model``, ``routing_iterations``, ``m_plus``,
``m_minus``, ``lam``, ``augment``, ``lr``, ``recon_weight``); ``plan`` turns it into the
model overrides and the ``TrainConfig`` of ``capsnet.train.fit``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch

from capsnet import models
from capsnet.data.datasets import TensorImageDataset
from capsnet.errors import ConfigError
from capsnet.train import TrainConfig

#: Run-config keys that are fields of TrainConfig.
TRAIN_KEYS = ("lr", "m_plus", "m_minus", "lam", "recon_weight")


@dataclass
class RunPlan:
    """What ``fit`` needs for one run: the model, its overrides and the TrainConfig."""

    model_name: str
    overrides: dict[str, Any]
    train_config: TrainConfig
    augment: str

    def build_model(self) -> torch.nn.Module:
        return models.build(self.model_name, **self.overrides)


def plan(
    run: dict[str, Any], *, epochs: int, batch_size: int, seed: int, progress: bool | None = False
) -> RunPlan:
    """Convert a flat run config into a RunPlan (parameters a model lacks are ignored)."""
    name = run.get("model")
    if name not in models.names():
        raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(models.names())}")
    fields = {f.name for f in dataclasses.fields(models.spec(name).config_cls)}
    overrides = {}
    if "routing_iterations" in fields and run.get("routing_iterations") is not None:
        overrides["routing_iterations"] = int(run["routing_iterations"])
    augment = str(run.get("augment", "none"))
    check_augment(augment)
    values = {key: float(run[key]) for key in TRAIN_KEYS if run.get(key) is not None}
    config = TrainConfig(
        epochs=epochs,
        batch_size=batch_size,
        seed=seed,
        progress=progress,
        **values,
    )
    return RunPlan(name, overrides, config, augment)


def augment_names() -> tuple[str, ...]:
    """Augmentation strategies by name (capsnet.data.augment)."""
    from capsnet.data import augment

    return augment.STRATEGIES


def check_augment(name: str) -> None:
    if name not in augment_names():
        raise ConfigError(
            f"unknown augmentation {name!r}; choose one of: {', '.join(augment_names())}"
        )


def training_set(images: torch.Tensor, labels: torch.Tensor, augment: str, seed: int, params=None):
    """The training Dataset: the in-memory tensors for "none" (fit's fast path), else the
    data issue's AugmentedDataset with the strategy's settings from params.yaml
    ``augment`` (``params``: an AugmentParams, defaults when None)."""
    base = TensorImageDataset(images, labels, "mnist-train")
    if augment == "none":
        return base
    from capsnet.data.augment import AugmentedDataset

    return AugmentedDataset(base, augment, params, seed=seed)


def split_mnist(root, mirror, train_size: int | None, val_size: int, progress: bool = False):
    """(train images, train labels, val images, val labels): the validation images are the
    last ``val_size`` of the MNIST training set, the training images the first
    ``train_size`` of the rest."""
    from capsnet.data.datasets import load

    full = load("mnist", "train", root, mirror=mirror, progress=progress)
    images, labels = full.tensors
    if val_size >= images.shape[0]:
        raise ConfigError(f"val_size {val_size} >= {images.shape[0]} training images")
    cut = images.shape[0] - val_size
    stop = cut if train_size is None else min(cut, train_size)
    return (
        images[:stop].clone(),
        labels[:stop].clone(),
        images[cut:].clone(),
        labels[cut:].clone(),
    )


def default_mirror(mirror: str | None) -> str | None:
    return mirror or os.environ.get("CAPSNET_MIRROR") or None
