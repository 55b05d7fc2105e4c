"""The published numbers the evaluation is compared with (the papers' accuracies, as in
SPEC.md), and the model family each checkpoint is compared as."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PaperNumber:
    """One published figure (SPEC.md), as an accuracy in [0, 1]."""

    metric: str  # "mnist", "rotated-mnist@35", "affnist", "expanded-mnist", "multimnist", ...
    family: str  # "capsnet" (dynamic routing), "cnn" (the paper's conv baseline), "em"
    accuracy: float
    note: str


PAPER_NUMBERS = (
    PaperNumber("mnist", "capsnet", 0.9937, "CapsNet, upright MNIST (rotated-MNIST study)"),
    PaperNumber("mnist", "cnn", 0.9868, "LeNet5 with shift-only training"),
    PaperNumber("rotated-mnist@35", "capsnet", 0.8409, "CapsNet at 35°: 84.09-92.12%"),
    PaperNumber("rotated-mnist@35", "cnn", 0.7605, "LeNet5 at 35°"),
    PaperNumber("expanded-mnist", "capsnet", 0.992, "Sabour 2017, expanded MNIST test"),
    PaperNumber("expanded-mnist", "cnn", 0.992, "Sabour 2017 baseline CNN"),
    PaperNumber("affnist", "capsnet", 0.79, "Sabour 2017, trained on expanded MNIST"),
    PaperNumber("affnist", "cnn", 0.66, "Sabour 2017 baseline CNN"),
    PaperNumber("multimnist", "capsnet", 0.948, "Sabour 2017: 5.2% error (strict)"),
    PaperNumber("multimnist", "cnn", 0.919, "Sabour 2017 baseline: 8.1% error"),
    PaperNumber("smallnorb", "em", 0.982, "Matrix capsules, 3 EM iterations: 1.8% error"),
    PaperNumber("smallnorb", "cnn", 0.948, "smallNORB baseline CNN: 5.2% error"),
    PaperNumber("smallnorb-azimuth-novel", "em", 0.865, "novel azimuths: 13.5% error"),
    PaperNumber("smallnorb-azimuth-novel", "cnn", 0.80, "novel azimuths: 20% error"),
    PaperNumber("smallnorb-elevation-novel", "em", 0.877, "novel elevations: 12.3% error"),
    PaperNumber("smallnorb-elevation-novel", "cnn", 0.822, "novel elevations: 17.8% error"),
)


def model_family(model: str) -> str:
    """capsnet (dynamic routing), em (matrix capsules) or cnn (every conv baseline)."""
    if model.startswith("em") or "em-" in model:
        return "em"
    if model.startswith("capsnet"):
        return "capsnet"
    return "cnn"


def paper_number(metric: str, model: str) -> PaperNumber | None:
    family = model_family(model)
    return next((p for p in PAPER_NUMBERS if p.metric == metric and p.family == family), None)
