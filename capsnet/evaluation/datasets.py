"""Test sets for the evaluation, loaded once and shared by every checkpoint, and whether a
model fits a dataset (image size, channels, classes)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from capsnet.evaluation.request import EvalRequest
from capsnet.io.errors import CheckpointError, DataError

MNIST_CLASSES = 10  # what a dataset that does not say has
#: The standardisation of a smallNORB checkpoint that does not record it: every smallNORB
#: checkpoint written since data.smallnorb.standardize exists was trained with its default,
#: on; the record came later (docs/guides/evaluation.md).
UNRECORDED_STANDARDIZE = True
#: What a checkpoint's data record holds when it does not record a setting.
UNRECORDED = {"standardize": UNRECORDED_STANDARDIZE}


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
            data=self.request.data,
            **kwargs,
        )

    def get(self, name: str, channels: int = 1) -> tuple[Any, dict]:
        """(dataset, info) for an evaluation name; a stereo dataset keeps ``channels``
        views."""
        from capsnet.config import dataset_specs

        key = (name, channels if dataset_specs.of_evaluation(name).channels_from_model else 1)
        if key not in self._cache:
            self._cache[key] = self._read(name, channels)
        return self._cache[key]

    def _read(self, name: str, channels: int) -> tuple[Any, dict]:
        from capsnet.config import dataset_specs
        from capsnet.data.datasets import DEFAULT_ROOT
        from capsnet.data.registry import resolve

        spec = dataset_specs.of_evaluation(name)
        if spec.evaluation_set is not None:
            root = self.root if self.root is not None else DEFAULT_ROOT
            hook = resolve(spec.evaluation_set)
            return hook(name, self.request, root, self._load, channels)
        # rotations are applied in memory, to the rotated dataset's source
        return self._load(spec.rotations_of or spec.name).subset(self.request.params.limit), {}


def image_shape(name: str) -> tuple[int, int] | None:
    """(size, classes) a dataset needs, known without loading it (None: ask the data)."""
    from capsnet.config import dataset_specs

    shape = dataset_specs.of_evaluation(name).shape
    return None if shape is None else (shape[1], shape[2])


def _dataset_shape(dataset) -> tuple[int, int, int, str | None]:
    """(channels, size, classes, non-square reason) of a loaded dataset; the classes are
    what the dataset declares."""
    channels, height, width = dataset[0][0].shape  # (C, H, W)
    square = None if width == height else f"images are {height}x{width}"
    return channels, height, int(getattr(dataset, "num_classes", MNIST_CLASSES)), square


def model_fit(model, name: str, dataset=None) -> str | None:
    """Why ``model`` cannot take dataset ``name`` (image size, channels, classes), or None."""
    from capsnet.config import dataset_specs

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
    declared = dataset_specs.of_evaluation(name)
    if declared.crops and need_classes == classes and need_size != size:
        raise DataError(
            f"{name}: the model takes {size}x{size} crops but data.{declared.section}.crop is "
            f"{need_size}: evaluate with the crop it was trained with"
        )
    reasons = []
    if need_size != size:
        reasons.append(f"images are {need_size}x{need_size}, the model takes {size}x{size}")
    if need_channels != channels and not declared.channels_from_model:
        reasons.append(f"images have {need_channels} channel(s), the model {channels}")
    if need_classes != classes:
        reasons.append(f"{need_classes} classes, the model has {classes}")
    return "; ".join(reasons) or None


def check_preprocessing(path, meta: dict, name: str, request: EvalRequest) -> None:
    """CheckpointError naming ``path`` (never a skip) when set ``name`` would be preprocessed
    otherwise than the model was trained: its dataset's ``data_record`` of the request's
    settings against the checkpoint's ``extra["data"]`` record."""
    from capsnet.config import dataset_specs
    from capsnet.data.registry import resolve

    spec = dataset_specs.of_evaluation(name)
    if spec.data_record is None:
        return
    record = meta.get("extra", {}).get("data", {})
    for key, asked in resolve(spec.data_record)(request.settings(name)).items():
        trained = record.get(key, UNRECORDED.get(key))
        if trained != asked:
            raise CheckpointError(
                f"{path}: trained with data.{spec.section}.{key} {_text(trained)} but evaluated "
                f"with {_text(asked)}: evaluate with the setting it was trained with"
            )


def _text(value) -> str:
    """A setting as params.yaml spells it (``false``)."""
    return str(value).lower() if isinstance(value, bool) else str(value)
