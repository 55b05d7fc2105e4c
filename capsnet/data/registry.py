"""The datasets, each declared once: what every stage, loader, validator and evaluator reads.

A declaration names its functions as "module:attribute" strings, imported on use, so this
module imports no dataset module (and nothing heavier than the standard library): the
config package validates names against it and the CLI lists them without importing torch.

Loader signature: ``load(request: LoadRequest, **options) -> torch Dataset``;
download: ``download(out_dir, section_params, mirror, progress, stand_in)``;
prepare: ``prepare(root, out_dir, section_params)``; the prepared spec is a
``capsnet.data.store.PreparedSpec``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from capsnet.errors import DataError


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: its name, what a model needs for it, where its files come from, how it
    is prepared and loaded, and where it is evaluated."""

    name: str
    section: str  # params.yaml data.<section> (enabled, source, ...)
    loader: str  # "module:function"
    shape: tuple[int, int, int] | None = None  # (channels, size, classes); None: from the data
    splits: tuple[str, ...] = ("train", "test")
    options: tuple[str, ...] = ()  # keyword options the loader takes
    download: str | None = None  # "module:function": the raw files (a download stage)
    stand_in: str | None = None  # "module:function" rendering stand-in raw files offline
    prepare: str | None = None  # "module:function": the prepared files (a prepare stage)
    prepared: str | None = None  # "module:ATTR": the PreparedSpec its files are checked against
    train: bool = False  # a run can train on it (capsnet train, sweeps, final training)
    extra: bool = False  # the final training also trains on it (train.extra_datasets)
    sweep: bool = False  # a sweep can search on it (sweep.dataset)
    evaluation: tuple[str, ...] = ()  # the evaluation set names it offers (evaluate.datasets)
    channels_from_model: bool = False  # evaluation keeps the model's channels (stereo)
    confusion: bool = False  # evaluation draws each scored model's confusion matrix on it


REGISTRY: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "mnist", "mnist", "capsnet.data.mnist:load_dataset", shape=(1, 28, 10),
            download="capsnet.data.mnist:download_stage", prepare="capsnet.data.mnist:prepare_stage",  # noqa: E501
            prepared="capsnet.data.mnist:PREPARED", train=True, sweep=True,
            evaluation=("mnist",),
        ),
        DatasetSpec(
            "rotated-mnist", "mnist", "capsnet.data.rotated:load_dataset", shape=(1, 28, 10),
            evaluation=("rotated-mnist",),
        ),
        DatasetSpec(
            "affnist", "affnist", "capsnet.data.affnist:load_real_dataset", shape=(1, 40, 10),
            splits=("test", "test-centered"), download="capsnet.data.affnist:download_stage",
            prepare="capsnet.data.affnist:prepare_stage", prepared="capsnet.data.affnist:PREPARED",
            evaluation=("affnist",),
        ),
        DatasetSpec(
            "affnist-synth", "affnist", "capsnet.data.affnist:load_synth_dataset",
            shape=(1, 40, 10), splits=("test",), prepare="capsnet.data.affnist:prepare_synth_stage",
            prepared="capsnet.data.affnist:PREPARED_SYNTH", evaluation=("affnist-synth",),
        ),
        DatasetSpec(
            "expanded-mnist", "mnist", "capsnet.data.affnist:load_expanded", shape=(1, 40, 10),
            train=True, extra=True, evaluation=("expanded-mnist",),
        ),
        DatasetSpec(
            "multimnist", "multimnist", "capsnet.data.multimnist:load_dataset",
            options=("merge", "redraw", "components"),
            prepare="capsnet.data.multimnist:prepare_stage",
            prepared="capsnet.data.multimnist:PREPARED", train=True, extra=True,
            evaluation=("multimnist",),
        ),
        DatasetSpec(
            "smallnorb", "smallnorb", "capsnet.data.smallnorb:load_dataset",
            options=("channels", "standardize", "augment", "crop", "brightness", "contrast"),
            download="capsnet.data.smallnorb:download_stage",
            stand_in="capsnet.data.smallnorb_synth:obtain",
            prepare="capsnet.data.smallnorb:prepare_stage",
            prepared="capsnet.data.smallnorb:PREPARED", train=True, sweep=True,
            evaluation=(
                "smallnorb", "smallnorb-azimuth-familiar", "smallnorb-azimuth-novel",
                "smallnorb-elevation-familiar", "smallnorb-elevation-novel",
            ),
            channels_from_model=True, confusion=True,
        ),
    )
}  # fmt: skip

DATASETS: tuple[str, ...] = tuple(REGISTRY)
DOWNLOADS: tuple[str, ...] = tuple(n for n, s in REGISTRY.items() if s.download)
PREPARES: tuple[str, ...] = tuple(n for n, s in REGISTRY.items() if s.prepare)
TRAIN_DATASETS: tuple[str, ...] = tuple(n for n, s in REGISTRY.items() if s.train)
EXTRA_DATASETS: tuple[str, ...] = tuple(n for n, s in REGISTRY.items() if s.extra)
SWEEP_DATASETS: tuple[str, ...] = tuple(n for n, s in REGISTRY.items() if s.sweep)
EVAL_DATASETS: tuple[str, ...] = tuple(e for s in REGISTRY.values() for e in s.evaluation)
#: The evaluation sets (each dataset's first) on which every scored model's confusion matrix
#: is drawn; MNIST's is drawn rotated (``evaluate.confusion_angle``) with its other figures.
CONFUSION_SETS: tuple[str, ...] = tuple(s.evaluation[0] for s in REGISTRY.values() if s.confusion)


def get(name: str, among: tuple[str, ...] = DATASETS, what: str = "dataset") -> DatasetSpec:
    """The declaration of ``name``; a DataError naming the choices when it is not one of
    ``among``."""
    if name not in among:
        raise DataError(f"unknown {what} {name!r}; choose one of: {', '.join(among)}")
    return REGISTRY[name]


def of_evaluation(name: str) -> DatasetSpec:
    """The dataset behind an evaluation set name (``smallnorb-azimuth-novel`` -> smallnorb)."""
    for spec in REGISTRY.values():
        if name in spec.evaluation:
            return spec
    raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(EVAL_DATASETS)}")


def resolve(reference: str) -> Any:
    """The object a "module:attribute" string names."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)
