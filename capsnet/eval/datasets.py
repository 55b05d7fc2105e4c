"""Test sets for the evaluation, loaded once and shared by every checkpoint, and whether a
model fits a dataset (image size, channels, classes)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from capsnet.errors import DataError
from capsnet.eval.request import EvalRequest

MNIST_CLASSES = 10


def _default_root() -> Path:
    from capsnet.data.datasets import DEFAULT_ROOT

    return DEFAULT_ROOT


class TestSets:
    """Evaluation name -> (TensorImageDataset limited to ``params.limit``, extra info)."""

    __test__ = False  # not a pytest class

    def __init__(self, request: EvalRequest):
        self.request = request
        self.root = Path(request.data_root) if request.data_root is not None else None
        self._cache: dict[tuple, tuple[Any, dict]] = {}

    def _load(self, name: str, **kwargs):
        from capsnet.data.datasets import load

        return load(
            name,
            "test",
            self.root,
            mirror=self.request.mirror,
            progress=sys.stderr.isatty(),
            **kwargs,
        )

    def get(self, name: str, channels: int = 1) -> tuple[Any, dict]:
        """(dataset, info) for an evaluation name; smallNORB keeps ``channels`` views."""
        key = (name, channels if name.startswith("smallnorb") else 1)
        if key not in self._cache:
            self._cache[key] = self._read(name, channels)
        return self._cache[key]

    def _read(self, name: str, channels: int) -> tuple[Any, dict]:
        limit = self.request.params.limit
        if name in ("mnist", "rotated-mnist"):
            return self._load("mnist").subset(limit), {}  # rotations are applied in memory
        if name == "affnist":
            from capsnet.data import affnist

            root = self.root if self.root is not None else _default_root()
            dataset, source = affnist.evaluation_set(root, mirror=self.request.mirror)
            return dataset.subset(limit), {"source": source}
        if name == "affnist-synth":
            return self._load("affnist-synth").subset(limit), {"source": "affnist-synth"}
        if name == "expanded-mnist":
            return self._load("expanded-mnist").subset(limit), {}
        if name == "multimnist":
            return self._load("multimnist").materialize(limit), {}
        if name.startswith("smallnorb"):
            subset = name[len("smallnorb-") :] if name != "smallnorb" else "all"
            dataset = self._load("smallnorb", subset=subset, channels=tuple(range(channels)))
            return dataset.subset(limit), {"subset": subset}
        from capsnet.config import EVAL_DATASETS

        raise DataError(f"unknown dataset {name!r}; choose one of {', '.join(EVAL_DATASETS)}")


def image_shape(name: str) -> tuple[int, int] | None:
    """(size, classes) a dataset needs, known without loading it (None: ask the data)."""
    if name in ("mnist", "rotated-mnist"):
        return 28, MNIST_CLASSES
    if name in ("affnist", "affnist-synth", "expanded-mnist"):
        return 40, MNIST_CLASSES
    return None


def _dataset_shape(dataset) -> tuple[int, int, int, str | None]:
    """(channels, size, classes, non-square reason) of a loaded dataset; the classes are
    what the dataset declares."""
    _, channels, height, width = dataset.tensors[0].shape  # (N, C, H, W)
    square = None if width == height else f"images are {height}x{width}"
    return channels, height, int(getattr(dataset, "num_classes", MNIST_CLASSES)), square


def model_fit(model, name: str, dataset=None) -> str | None:
    """Why ``model`` cannot take dataset ``name`` (image size, channels, classes), or None."""
    config = model.config
    size, channels = int(config.input_size), int(config.in_channels)
    classes = int(config.num_classes)
    if dataset is not None:
        need_channels, need_size, need_classes, square = _dataset_shape(dataset)
        if square is not None:
            return f"{square}, the model takes square {size}x{size}"
    else:
        need_size, need_classes = image_shape(name)
        need_channels = 1
    reasons = []
    if need_size != size:
        reasons.append(f"images are {need_size}x{need_size}, the model takes {size}x{size}")
    if need_channels != channels and not name.startswith("smallnorb"):
        reasons.append(f"images have {need_channels} channel(s), the model {channels}")
    if need_classes != classes:
        reasons.append(f"{need_classes} classes, the model has {classes}")
    return "; ".join(reasons) or None
