"""A PNG grid of dataset samples with their labels (``capsnet data show``)."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import torch

from capsnet.config import Params


def _label(target) -> str:
    if isinstance(target, torch.Tensor) and target.dim() == 1:  # multi-hot
        return "+".join(str(int(i)) for i in target.nonzero().flatten())
    return str(int(target))


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
) -> Path:
    """Render ``count`` items of ``dataset`` (optionally augmented) into a PNG at ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from capsnet.data.datasets import DEFAULT_ROOT, load
    from capsnet.io.files import atomic_write_bytes

    params = params or Params()
    root = Path(root) if root is not None else DEFAULT_ROOT
    kwargs = {"angle": angle} if dataset == "rotated-mnist" else {}
    if dataset == "smallnorb":
        kwargs["subset"] = subset
    data = load(dataset, split, root, seed=seed if dataset == "expanded-mnist" else None, **kwargs)
    title = getattr(data, "name", dataset)
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
        axis.set_title(_label(target), fontsize=9)
    figure.suptitle(title, fontsize=10)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(figure)
    atomic_write_bytes(out, buffer.getvalue())
    return Path(out)
