"""One training run from a flat config dict: the conversion a Tune trial and the final
training share, and the MNIST and smallNORB splits both use. No Ray here.

A run config is the flat dict Tune samples (``model``, ``routing_iterations``, ``m_plus``,
``m_minus``, ``lam``, ``augment``, ``lr``, ``recon_weight``, and the EM ablation axes
``pose``, ``coordinate_addition``, ``loss``, ``weight_decay``); ``plan`` turns it into the
model overrides and the ``TrainConfig`` of ``capsnet.train.fit``.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from capsnet import models
from capsnet.data.datasets import TensorImageDataset
from capsnet.errors import ConfigError
from capsnet.train import TrainConfig

#: Run-config keys that are fields of TrainConfig (numbers).
TRAIN_KEYS = ("lr", "m_plus", "m_minus", "lam", "recon_weight", "weight_decay")
#: Run-config keys that are model config fields, applied to models that have them.
MODEL_KEYS = {"routing_iterations": int, "pose": str, "coordinate_addition": bool}
SMALLNORB_CLASSES = 5
#: Fields of params.yaml ``data.smallnorb`` a smallNORB run uses, with their defaults.
SMALLNORB_DEFAULTS = {"crop": 32, "brightness": 0.2, "contrast": 0.2}


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
    run: dict[str, Any],
    *,
    epochs: int,
    batch_size: int,
    seed: int,
    progress: bool | None = False,
    shape: dict[str, int] | None = None,
    compile: bool = False,
) -> RunPlan:
    """Convert a flat run config into a RunPlan (parameters a model lacks are ignored).

    ``shape`` holds the data's model shape fields (``data_shape``: in_channels,
    input_size, num_classes), applied to models that have them; ``compile`` compiles the
    routing of models that support it (EM).
    """
    name = run.get("model")
    if name not in models.names():
        raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(models.names())}")
    fields = {f.name for f in dataclasses.fields(models.spec(name).config_cls)}
    overrides = {}
    for key, convert in MODEL_KEYS.items():
        if key in fields and run.get(key) is not None:
            overrides[key] = convert(run[key])
    overrides.update({k: v for k, v in (shape or {}).items() if k in fields})
    augment = str(run.get("augment", "none"))
    check_augment(augment)
    values: dict[str, Any] = {k: float(run[k]) for k in TRAIN_KEYS if run.get(k) is not None}
    if run.get("loss") is not None:
        values["loss"] = str(run["loss"])
    config = TrainConfig(
        epochs=epochs,
        batch_size=batch_size,
        seed=seed,
        progress=progress,
        compile=compile,
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


def data_shape(dataset: str, channels: int = 2, crop: int = 32) -> dict[str, int]:
    """The model shape fields a dataset needs ({} for mnist: the models' defaults)."""
    if dataset == "smallnorb":
        return {"in_channels": channels, "input_size": crop, "num_classes": SMALLNORB_CLASSES}
    return {}


def smallnorb_settings(smallnorb=None) -> dict[str, Any]:
    """crop, brightness and contrast from params.yaml ``data.smallnorb`` (a
    SmallnorbParams, or None for the defaults)."""
    return {k: getattr(smallnorb, k, v) for k, v in SMALLNORB_DEFAULTS.items()}


def smallnorb_channels(channels: int) -> tuple[int, ...]:
    """Stereo channels used: 1 -> the left image, 2 -> both."""
    return (0,) if channels == 1 else (0, 1)


def smallnorb_disabled(enabled: bool, root) -> str | None:
    """Why smallNORB cannot be used (switched off in params, or its prepared directory
    holds only DISABLED.txt), or None when it is on."""
    from capsnet.data.datasets import DEFAULT_ROOT
    from capsnet.data.store import DISABLED_MARKER, is_disabled

    if not enabled:
        return "data.smallnorb.enabled is false in params.yaml"
    prepared = Path(root if root is not None else DEFAULT_ROOT) / "prepared" / "smallnorb"
    if is_disabled(prepared):
        why = (prepared / DISABLED_MARKER).read_text().strip()
        return f"{prepared} is switched off ({why})"
    return None


def split_smallnorb(root, channels: int, train_size: int | None, val_size: int, crop: int = 32):
    """(train images uint8 (N, C, 48, 48), train labels, train info, val images uint8
    (M, C, crop, crop), val labels): validation is the last ``val_size`` items of the
    prepared smallNORB training set as centre crops (as ``capsnet train --dataset
    smallnorb`` holds it out), training the first ``train_size`` of the rest, kept at full
    size for the random crops of ``smallnorb_training_set``."""
    from capsnet.data import smallnorb
    from capsnet.data.datasets import load

    full = load("smallnorb", "train", root, channels=smallnorb_channels(channels), augment=True)
    images, labels, info = full.images, full.labels, full.info
    if val_size >= images.shape[0]:
        raise ConfigError(f"val_size {val_size} >= {images.shape[0]} smallnorb training images")
    cut = images.shape[0] - val_size
    stop = cut if train_size is None else min(cut, train_size)
    return (
        images[:stop].clone(),
        labels[:stop].clone(),
        info[:stop].clone(),
        smallnorb.centre_crop(images[cut:], crop).contiguous(),
        labels[cut:].clone(),
    )


def smallnorb_training_set(images, labels, info, seed: int, crop=32, brightness=0.2, contrast=0.2):
    """Random ``crop`` crops with random brightness and contrast (EM paper), seeded per item
    from (seed, epoch, index); ``fit`` moves it to the next epoch's draws."""
    from capsnet.data.smallnorb import SmallNORBTrain

    return SmallNORBTrain(
        images, labels, info, crop, brightness, contrast, seed, name="smallnorb-train"
    )
