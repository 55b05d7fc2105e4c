"""A PNG grid of dataset samples with their labels (``capsnet data show``)."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch

from capsnet.config import Params
from capsnet.io.errors import DataError


def _label(target, names: tuple[str, ...] | None = None) -> str:
    if isinstance(target, torch.Tensor) and target.dim() == 1:  # multi-hot
        return "+".join(str(int(i)) for i in target.nonzero().flatten())
    return f"{int(target)} {names[int(target)]}" if names else str(int(target))


def _load(dataset: str, split: str, root: Path, **kwargs):
    """(data, note): ``dataset``, or, for a test set whose real files are missing, the
    stand-in ``capsnet eval`` scores in its place (the dataset's evaluation-set hook, so
    both fall back alike), with a note saying so."""
    from capsnet.config import dataset_specs
    from capsnet.data.datasets import load
    from capsnet.data.registry import resolve

    try:
        return load(dataset, split, root, **kwargs), None
    except DataError as exc:
        spec = dataset_specs.REGISTRY[dataset]
        if split != "test" or spec.evaluation_set is None or spec.stand_in_source is None:
            raise
        hook = resolve(spec.evaluation_set)
        request = SimpleNamespace(mirror=None, params=SimpleNamespace(limit=None))
        settings = kwargs.get("data")
        data, info = hook(
            dataset, request, root, lambda name, **kw: load(name, split, root, data=settings, **kw)
        )
        source = info.get("source")
        if not dataset_specs.is_stand_in(dataset, source):
            raise
        data.source = source
        return data, f"{exc}; showing {source}, the stand-in `capsnet eval` scores instead"


def show(
    dataset: str,
    out: str | os.PathLike,
    *,
    split: str = "test",
    count: int = 16,
    angle: float | None = None,
    subset: str = "all",
    strategy: str | None = None,
    seed: int = 0,
    params: Params | None = None,
    root: str | os.PathLike | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Render ``count`` items of ``dataset`` (optionally augmented) into a PNG at ``out``,
    each titled with its label (and class name where the dataset has them); ``say`` hears
    when a stand-in is shown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from capsnet.config import dataset_specs
    from capsnet.data.datasets import DEFAULT_ROOT
    from capsnet.io.files import atomic_write_bytes

    params = params or Params()
    root = Path(root) if root is not None else DEFAULT_ROOT
    kwargs = {"angle": angle} if dataset == "rotated-mnist" else {}
    kwargs["data"] = params.data
    if dataset == "smallnorb":
        kwargs["subset"] = subset
    data, note = _load(
        dataset, split, root, seed=seed if dataset == "expanded-mnist" else None, **kwargs
    )
    if note is not None and say is not None:
        say(note)
    title = getattr(data, "name", dataset)
    source = getattr(data, "source", None)
    if dataset_specs.is_stand_in(dataset, source):
        title += f" ({source}: the stand-in for {dataset})"
    names = getattr(data, "class_names", None)
    if strategy is not None:
        from capsnet.data.augment import AugmentedDataset

        data = AugmentedDataset(data, strategy, params.augment, seed)
        title += f" + augment {strategy}"
    count = min(count, len(data))
    columns = min(8, count)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(
        rows, columns, figsize=(1.3 * columns, 1.5 * rows + 0.4), squeeze=False
    )
    for axis in axes.flat:
        axis.axis("off")
    for i in range(count):
        image, target = data[i]  # (C, H, W) float
        axis = axes.flat[i]
        picture = image[0] if image.shape[0] != 3 else image.permute(1, 2, 0)
        axis.imshow(picture.numpy(), cmap="gray", vmin=0, vmax=1)
        axis.set_title(_label(target, names), fontsize=9)
    figure.suptitle(title, fontsize=10)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    atomic_write_bytes(out, buffer.getvalue())
    return Path(out)
