"""Probes: what the evaluation measures of a model beside its test sets' accuracy
(adversarial robustness, pose equivariance), in ONE table, ``PROBES``: name -> ``Probe``.

A probe's name is its field in params.yaml's evaluate section (a dataclass of
capsnet/config/evaluate.py with ``enabled`` and ``limit``, the only home of its defaults),
its block in every metrics.json entry and its key here. ``run_probes`` runs each enabled
probe on a loaded model over the first ``limit`` test images of its probe set (the dataset
whose spec lists it, ``probe_set``); the figure drawer draws each probe's ``figure`` and the
report renders each probe's ``table``. A new metric: its function and ``Probe`` here, its
config field, its name in a dataset spec's ``probes``, its test.

The module imports torch only inside the measuring functions: the report reads the table
without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capsnet.config.dataset_specs import column_title
from capsnet.evaluation.results import Entry, EvalResults

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import Dataset

    from capsnet.evaluation.datasets import TestSets
    from capsnet.evaluation.request import EvalRequest


@dataclass(frozen=True)
class ProbeTable:
    """A probe's numbers as the report shows them: one row per checkpoint (its name and a
    fraction or None per column, shown as percentages); ``id`` is the HTML table's id."""

    id: str
    title: str
    note: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, tuple[float | None, ...]], ...]


@dataclass(frozen=True)
class Probe:
    """``measure(model, dataset, settings, request)``: the metrics.json block of a model on
    the probe set's first ``settings.limit`` images (``settings``: its evaluate section
    field); ``table(results)`` and ``figure(results, path)``: its renderers (None where it
    has no table or figure to show), ``caption`` the report's words under its figure."""

    measure: Callable[[nn.Module, Dataset, Any, EvalRequest], dict[str, Any]]
    table: Callable[[EvalResults], ProbeTable | None] | None = None
    figure: Callable[[EvalResults, Path], Path | None] | None = None
    caption: str = ""


def probe_set(name: str) -> str | None:
    """The evaluation set probe ``name`` runs on: the first of the dataset that lists it
    (its spec's ``probes``); None when no dataset does."""
    from capsnet.config import dataset_specs

    specs = dataset_specs.REGISTRY.values()
    return next((s.evaluation[0] for s in specs if name in s.probes and s.evaluation), None)


def run_probes(model, data: TestSets, request: EvalRequest) -> dict[str, dict[str, Any]]:
    """{probe name: its block} for each probe the request's evaluate settings switch on, in
    ``PROBES`` order; {"skipped": reason} where the probe set does not fit the model."""
    from capsnet.evaluation.datasets import model_fit

    blocks: dict[str, dict[str, Any]] = {}
    for name, probe in PROBES.items():
        settings = getattr(request.params, name)
        if not settings.enabled:
            continue
        test_set = probe_set(name)
        reason = "no dataset lists it" if test_set is None else model_fit(model, test_set)
        if reason is not None:
            where = f"{column_title(test_set)} does not fit: " if test_set is not None else ""
            blocks[name] = {"skipped": where + reason}
            continue
        dataset, _ = data.get(test_set)
        blocks[name] = probe.measure(model, dataset.subset(settings.limit), settings, request)
    return blocks


# --- adversarial robustness -------------------------------------------------------------------


def classification_loss(model: nn.Module, scores: torch.Tensor, targets: torch.Tensor):
    """The model's classification loss without extras (no reconstruction term): the margin
    loss for dynamic-routing capsules, cross-entropy on the scores otherwise."""
    from capsnet.nn import losses

    if getattr(model, "default_loss", "") == "margin":
        return losses.margin_loss(scores, targets)
    return losses.cross_entropy(scores, targets)


def adversarial_images(
    model: nn.Module,
    images: torch.Tensor,
    targets: torch.Tensor,
    epsilon: float,
    steps: int = 1,
    step_size: float | None = None,
) -> torch.Tensor:
    """Untargeted L-inf attack: FGSM for steps=1, BIM (iterated, projected) for steps>1.

    images (B, C, H, W) in [0, 1] -> adversarial images of the same shape, within epsilon
    of the originals and clipped to [0, 1].
    """
    import torch

    step_size = epsilon if steps == 1 else (step_size or epsilon / steps * 1.25)
    was_training = model.training
    model.eval()
    adv = images.detach().clone()
    try:
        for _ in range(steps):
            adv.requires_grad_(True)
            loss = classification_loss(model, model(adv).scores, targets)
            (grad,) = torch.autograd.grad(loss, adv)
            adv = adv.detach() + step_size * grad.sign()  # (B, C, H, W)
            adv = torch.min(torch.max(adv, images - epsilon), images + epsilon).clamp_(0.0, 1.0)
    finally:
        model.train(was_training)
    return adv.detach()


def robustness(
    model: nn.Module,
    dataset: Dataset,
    epsilons: tuple[float, ...],
    bim_steps: int,
    batch_size: int = 200,
    device=None,
) -> dict:
    """Accuracy under FGSM and BIM at each epsilon: {"fgsm": {"<eps>": x}, "bim": {...}, "n"}."""
    import torch

    from capsnet.training.scoring import batches, format_angle, model_device

    device = model_device(model, device)
    counts = {attack: {format_angle(e): 0 for e in epsilons} for attack in ("fgsm", "bim")}
    n = 0
    for images, targets in batches(dataset, batch_size, device):  # (B, C, H, W), (B,)
        n += images.shape[0]
        for eps in epsilons:
            for attack, steps in (("fgsm", 1), ("bim", bim_steps)):
                adv = adversarial_images(model, images, targets, eps, steps)
                with torch.no_grad():
                    predicted = model.eval()(adv).scores.argmax(dim=1)  # (B,)
                counts[attack][format_angle(eps)] += int((predicted == targets).sum())
    result = {attack: {k: v / n for k, v in per_eps.items()} for attack, per_eps in counts.items()}
    result["n"] = n
    return result


def _attack_batch(request: EvalRequest) -> int:
    """The FGSM/BIM batch: the evaluation batch on a GPU, at most 200 elsewhere (each step
    keeps a batch's activations for the input gradient)."""
    if request.device.type == "cuda":
        return request.params.batch_size
    return min(request.params.batch_size, 200)


def _measure_robustness(model, dataset, settings, request: EvalRequest) -> dict[str, Any]:
    result = robustness(
        model,
        dataset,
        epsilons=tuple(settings.epsilons),
        bim_steps=settings.bim_steps,
        batch_size=_attack_batch(request),
        device=request.device,
    )
    return {"attack": "untargeted L-inf", "bim_steps": settings.bim_steps, **result}


ATTACKS = ("fgsm", "bim")


def attacks(entry: Entry) -> dict[str, dict[str, float | None]]:
    """{attack ("fgsm", "bim"): {epsilon: accuracy}}; {} when robustness was skipped."""
    block = entry.block("robustness")
    return {a: block[a] for a in ATTACKS if isinstance(block.get(a), dict)}


def robustness_table(results: EvalResults) -> ProbeTable | None:
    """Accuracy under each attack and epsilon, one row per checkpoint that was attacked."""
    found = {n: a for n, e in results.checkpoints().items() if "fgsm" in (a := attacks(e))}
    if not found:
        return None
    epsilons = sorted({k for r in found.values() for k in r["fgsm"]}, key=float)
    return ProbeTable(
        "robustness",
        "Adversarial robustness",
        "Accuracy under untargeted L-inf attacks on the "
        f"{column_title(probe_set('robustness') or '')} test images (pixel range [0, 1]).",
        tuple(f"{a.upper()} ε={k}" for a in ATTACKS for k in epsilons),
        tuple(
            (n, tuple(r.get(a, {}).get(k) for a in ATTACKS for k in epsilons))
            for n, r in found.items()
        ),
    )


# --- pose equivariance ------------------------------------------------------------------------


def pose_equivariance(
    model: nn.Module, dataset: Dataset, angles, batch_size: int | None = None, device=None
) -> dict | None:
    """How the true class capsule's pose moves as the input rotates.

    For each image the pose p(angle) of its true class is taken at every angle. Returns
    per-dimension Pearson correlation between angle and pose (pooled over images after
    removing each image's mean pose), the share of pose-change variance explained by the
    first principal direction, and the mean pose change |p(angle) - p(0)| per angle.
    None for models without poses. ``batch_size`` None: the evaluation's default.
    """
    import torch

    from capsnet.training.scoring import EVAL_BATCH_SIZE

    with torch.no_grad():
        stacked, angles = _poses(
            model, dataset, angles, batch_size or EVAL_BATCH_SIZE, device
        )  # (N, A, D)
    if stacked is None:
        return None
    centred = stacked - stacked.mean(dim=1, keepdim=True)  # (N, A, D)
    angle_t = torch.tensor(angles)
    angle_c = (angle_t - angle_t.mean()).view(1, -1, 1)  # (1, A, 1)
    cov = (centred * angle_c).sum(dim=(0, 1))  # (D,)
    denom = (
        centred.pow(2).sum(dim=(0, 1)).sqrt()
        * angle_c.pow(2).sum().sqrt()
        * (stacked.shape[0] ** 0.5)
    )
    correlation = torch.where(denom > 0, cov / denom, torch.zeros_like(cov))  # (D,)
    reference = angles.index(0.0) if 0.0 in angles else 0
    change = stacked - stacked[:, reference : reference + 1]  # (N, A, D)
    flat = change.reshape(-1, change.shape[-1])  # (N*A, D)
    singular = torch.linalg.svdvals(flat - flat.mean(dim=0))
    explained = (singular[0] ** 2 / singular.pow(2).sum()).item() if singular.sum() > 0 else 0.0
    return {
        "angles": angles,
        "dim_correlation": correlation.tolist(),
        "first_direction_explained": explained,
        "mean_pose_change": change.norm(dim=-1).mean(dim=0).tolist(),
        "n": int(stacked.shape[0]),
    }


def _poses(model, dataset, angles, batch_size: int, device):
    """(poses (N, A, D) of each image's true class at each angle, on the CPU, the angles as
    floats); (None, angles) for a model without poses."""
    import torch

    from capsnet.data.datasets import rotated
    from capsnet.training.scoring import batches, model_device

    device = model_device(model, device)
    model.eval()
    angles = [float(a) for a in angles]
    poses = []
    for angle in angles:
        per_angle = []
        for batch, labels in batches(rotated(dataset, angle), batch_size, device):
            out = model(batch)
            if out.poses is None:
                return None, angles
            index = labels.view(-1, 1, 1).expand(-1, 1, out.poses.shape[-1])  # (B, 1, D)
            per_angle.append(out.poses.float().gather(1, index).squeeze(1))  # (B, D)
        poses.append(torch.cat(per_angle).cpu())  # (N, D)
    return torch.stack(poses, dim=1), angles  # (N, A, D)


def _measure_equivariance(model, dataset, settings, request: EvalRequest) -> dict[str, Any]:
    result = pose_equivariance(
        model, dataset, settings.angles, request.params.batch_size, request.device
    )
    return result if result is not None else {"skipped": "the model has no capsule poses"}


def has_pose_diagnostic(entry: Entry) -> bool:
    """Whether the equivariance diagnostic ran on ``entry``: its model has class-capsule
    poses."""
    return "dim_correlation" in entry.block("equivariance")


def equivariance_figure(results: EvalResults, path: Path) -> Path | None:
    """equivariance.png: each checkpoint's pose diagnostic; None when no model has poses."""
    from capsnet.evaluation.plots import equivariance_plot

    diagnostics = {
        name: e.block("equivariance")
        for name, e in results.checkpoints().items()
        if has_pose_diagnostic(e)
    }
    return equivariance_plot(diagnostics, path) if diagnostics else None


#: Every probe by name, in the order an entry of metrics.json holds their blocks.
PROBES: dict[str, Probe] = {
    "robustness": Probe(_measure_robustness, table=robustness_table),
    "equivariance": Probe(
        _measure_equivariance,
        figure=equivariance_figure,
        caption="Equivariance diagnostic: correlation of each pose dimension with the "
        "rotation angle, and how far the pose moves.",
    ),
}
