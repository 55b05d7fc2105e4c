"""best.json's trial: the best metric at the last epoch, ties broken by a fixed rule."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from capsnet.config import SweepConfig
from pipeline.sweep.results import best_result


def _trial(accuracy: float, epoch: int, routing: int, augment: str, error=None):
    return SimpleNamespace(
        error=error,
        metrics={"val_accuracy": accuracy, "epoch": epoch, "trial_id": f"random{routing}{augment}"},
        config={"routing_iterations": routing, "augment": augment},
    )


SWEEP = SweepConfig.from_dict(
    {"space": {"routing_iterations": {"grid": [1, 3]}, "augment": {"grid": ["none", "shift"]}}}
)


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]])
def test_ties_pick_the_same_trial_in_any_order(order):
    trials = [
        _trial(0.9, 2, 3, "shift"),
        _trial(0.9, 2, 1, "shift"),
        _trial(0.9, 1, 1, "none"),  # as good, fewer epochs: loses the tie
        _trial(0.95, 1, 3, "none", error=RuntimeError("lost node")),  # errored: never picked
    ]
    best = best_result([trials[i] for i in order], SWEEP)
    chosen = {k: best["config"][k] for k in ("routing_iterations", "augment")}
    assert chosen == {"routing_iterations": 1, "augment": "shift"}
    assert (best["metrics"]["epoch"], best["metrics"]["val_accuracy"]) == (2, 0.9)


def test_the_best_metric_wins_over_epochs_and_settings():
    trials = [_trial(0.8, 2, 1, "none"), _trial(0.85, 1, 3, "shift")]
    assert best_result(trials, SWEEP)["config"]["routing_iterations"] == 3
    assert best_result([_trial(0.9, 1, 1, "none", error=ValueError("x"))], SWEEP) is None
