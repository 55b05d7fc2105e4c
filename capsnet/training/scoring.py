"""Scoring: class scores over a dataset, accuracy, and the rotated-MNIST sweep (the probes,
robustness and equivariance, are ``capsnet.evaluation.probes``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from capsnet.config import EvaluateParams
from capsnet.io.errors import NonFiniteOutputs
from capsnet.training.device import autocast, mark_step

EVAL_BATCH_SIZE = EvaluateParams.batch_size

#: ``predict``'s results inside ``remembering_predictions``: key -> (model, dataset, result);
#: the model and dataset are kept so that their ids stay theirs while remembered.
_REMEMBERED: ContextVar[dict | None] = ContextVar("remembered_predictions", default=None)


@contextmanager
def remembering_predictions() -> Iterator[None]:
    """Inside the block ``predict`` computes once per model, dataset object, batch size,
    device and precision: the evaluation stage scores a test set and then draws its
    confusion matrix from the same predictions (an EM model's test set is the stage's
    costliest forward pass). The model must not change inside the block."""
    token = _REMEMBERED.set({})
    try:
        yield
    finally:
        _REMEMBERED.reset(token)


def batches(dataset: Dataset, batch_size: int, device: torch.device | None = None):
    """Yield (images float (B, C, H, W) in [0, 1], targets) in dataset order, on ``device``
    (default: the CPU); an in-memory set is moved there once, as uint8."""
    device = device or torch.device("cpu")
    if hasattr(dataset, "tensors"):
        images, targets = (t.to(device) for t in dataset.tensors)  # (N, C, H, W) uint8, (N,)
        for start in range(0, images.shape[0], batch_size):
            yield (
                images[start : start + batch_size].float().div_(255.0),
                targets[start : start + batch_size],
            )
    else:
        for batch in DataLoader(dataset, batch_size=batch_size, shuffle=False):
            # items may carry more (MultiMNIST digit components)
            yield batch[0].to(device, non_blocking=True), torch.as_tensor(batch[1]).to(device)


def model_device(model: nn.Module, device: torch.device | str | None = None) -> torch.device:
    """``device``, else the device of the model's parameters."""
    return torch.device(device) if device is not None else next(model.parameters()).device


@torch.no_grad()
def predict(
    model: nn.Module,
    dataset: Dataset,
    batch_size: int = EVAL_BATCH_SIZE,
    device: torch.device | str | None = None,
    amp: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Class scores (N, K) float32 on the CPU and the targets, in dataset order;
    NonFiniteOutputs when a score is NaN or infinite (a score of 0.1 would look real).

    Runs on ``device`` (default: the model's) under the ``amp`` precision policy; scores and
    targets stay there until one transfer at the end. Inside ``remembering_predictions`` a
    repeated call returns the first call's tensors."""
    device = model_device(model, device)
    remembered = _REMEMBERED.get()
    key = (id(model), id(dataset), batch_size, str(device), amp)
    if remembered is not None and key in remembered:
        return remembered[key][2]
    result = _predict(model, dataset, batch_size, device, amp)
    if remembered is not None:
        remembered[key] = (model, dataset, result)
    return result


def _predict(model, dataset, batch_size: int, device: torch.device, amp: str | None):
    """``predict`` computed."""
    was_training = model.training
    model.eval()
    all_scores, all_targets = [], []
    try:
        for images, targets in batches(dataset, batch_size, device):
            mark_step(device)  # a compiled model's new step
            with autocast(device, amp):
                scores = model(images).scores  # (B, K)
            all_scores.append(scores.float().clone())
            all_targets.append(targets)
    finally:
        model.train(was_training)
    if not all_scores:
        return torch.zeros(0, 0), torch.zeros(0, dtype=torch.long)
    scores = torch.cat(all_scores).cpu()  # (N, K)
    bad = int((~torch.isfinite(scores)).any(dim=1).sum())
    if bad:
        raise NonFiniteOutputs(
            f"the model's class scores are NaN or infinite for {bad} of {scores.shape[0]} "
            "image(s); not scored"
        )
    return scores, torch.cat(all_targets).cpu()


def accuracy(
    model: nn.Module,
    dataset: Dataset,
    batch_size: int = EVAL_BATCH_SIZE,
    device=None,
    amp: str | None = None,
) -> dict:
    """{"accuracy": fraction correct (argmax of scores), "n": number of examples}.

    For multi-hot targets (MultiMNIST) the accuracy is the strict one: both true classes
    are the two highest scores. ``device`` and ``amp`` as for ``predict``.
    """
    scores, targets = predict(model, dataset, batch_size, device, amp)
    if targets.dim() == 2:
        multi = multimnist_scores(scores, targets)
        return {"accuracy": multi["strict_accuracy"], "n": multi["n"]}
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
    amp: str | None = None,
) -> dict:
    """Accuracy on copies of ``dataset`` (a TensorImageDataset) rotated by each angle.

    Returns {"n": n, "accuracy": {"<angle>": x, ...}}.
    """
    from capsnet.data.datasets import rotated

    targets = dataset.tensors[1]
    result: dict[str, float] = {}
    for angle in angles:
        scored = accuracy(model, rotated(dataset, angle), batch_size, device, amp)
        result[format_angle(angle)] = scored["accuracy"]
    return {"n": int(targets.shape[0]), "accuracy": result}


def multimnist_scores(scores: torch.Tensor, targets: torch.Tensor) -> dict:
    """MultiMNIST accuracy from class scores (N, K) and multi-hot targets (N, K).

    strict_accuracy: both true digits are the two highest scores (the paper's measure);
    at_least_one: at least one of them is; half_credit: half a point per digit found.
    """
    top2 = scores.topk(2, dim=1).indices  # (N, 2)
    hits = targets.float().gather(1, top2).sum(dim=1)  # (N,) in {0, 1, 2}
    n = int(scores.shape[0])
    if n == 0:
        return {
            "strict_accuracy": float("nan"),
            "at_least_one": float("nan"),
            "half_credit": float("nan"),
            "n": 0,
        }
    return {
        "strict_accuracy": (hits == 2).float().mean().item(),
        "at_least_one": (hits >= 1).float().mean().item(),
        "half_credit": (hits / 2).mean().item(),
        "n": n,
    }


def evaluate_multimnist(
    model: nn.Module,
    dataset: Dataset,
    batch_size: int = EVAL_BATCH_SIZE,
    device=None,
    amp: str | None = None,
) -> dict:
    """``multimnist_scores`` of the model on ``dataset`` (``device`` and ``amp`` as for
    ``predict``)."""
    scores, targets = predict(model, dataset, batch_size, device, amp)
    return multimnist_scores(scores, targets)


def score(
    model: nn.Module,
    name: str,
    dataset: Dataset,
    batch_size: int = EVAL_BATCH_SIZE,
    device=None,
    amp: str | None = None,
    angles=(),
) -> dict:
    """The model's numbers on evaluation set ``name`` as its registry declaration says: a
    rotation sweep over ``angles`` (``rotations_of``), the multi-label scores, or accuracy."""
    from capsnet.config import dataset_specs

    spec = dataset_specs.of_evaluation(name)
    if spec.rotations_of is not None:
        return rotation_sweep(model, dataset, angles, batch_size, device, amp)
    if spec.multi_label:
        return evaluate_multimnist(model, dataset, batch_size, device, amp)
    return accuracy(model, dataset, batch_size, device, amp)
