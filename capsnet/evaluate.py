"""Evaluation: scores over a dataset, accuracy, and the rotated-MNIST sweep."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

EVAL_BATCH_SIZE = 500


def _batches(dataset: Dataset, batch_size: int):
    """Yield (images float (B, C, H, W) in [0, 1], targets) in dataset order."""
    if hasattr(dataset, "tensors"):
        images, targets = dataset.tensors
        for start in range(0, images.shape[0], batch_size):
            yield (
                images[start : start + batch_size].float().div_(255.0),
                targets[start : start + batch_size],
            )
    else:
        yield from DataLoader(dataset, batch_size=batch_size, shuffle=False)


@torch.no_grad()
def predict(
    model: nn.Module,
    dataset: Dataset,
    batch_size: int = EVAL_BATCH_SIZE,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Class scores (N, K) float32 on the CPU and the targets, in dataset order."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    all_scores, all_targets = [], []
    try:
        for images, targets in _batches(dataset, batch_size):
            with _autocast(device):
                scores = model(images.to(device, non_blocking=True)).scores  # (B, K)
            all_scores.append(scores.float().cpu())
            all_targets.append(torch.as_tensor(targets))
    finally:
        model.train(was_training)
    return torch.cat(all_scores), torch.cat(all_targets)


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def accuracy(
    model: nn.Module, dataset: Dataset, batch_size: int = EVAL_BATCH_SIZE, device=None
) -> dict:
    """{"accuracy": fraction correct (argmax of scores), "n": number of examples}."""
    scores, targets = predict(model, dataset, batch_size, device)
    correct = (scores.argmax(dim=1) == targets).sum().item()
    n = int(targets.shape[0])
    return {"accuracy": correct / n if n else float("nan"), "n": n}


def format_angle(angle: float) -> str:
    return f"{float(angle):g}"


def rotation_sweep(
    model: nn.Module,
    dataset: Dataset,
    angles,
    batch_size: int = EVAL_BATCH_SIZE,
    device=None,
) -> dict:
    """Accuracy on copies of ``dataset`` (a TensorImageDataset) rotated by each angle.

    Returns {"n": n, "accuracy": {"<angle>": x, ...}}.
    """
    from capsnet.data.datasets import TensorImageDataset, rotate_images

    images, targets = dataset.tensors
    result: dict[str, float] = {}
    for angle in angles:
        rotated = TensorImageDataset(rotate_images(images, angle), targets)
        result[format_angle(angle)] = accuracy(model, rotated, batch_size, device)["accuracy"]
    return {"n": int(targets.shape[0]), "accuracy": result}
