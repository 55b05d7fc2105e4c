"""Helpers the sweep tests share."""

from __future__ import annotations

#: Sweep resources running trials one after another in one reused actor: one Ray worker
#: process (most of a tiny trial's cost is its start) instead of one per trial.
ONE_PROCESS = {"cpus_per_trial": 1, "max_concurrent_trials": 1}


def base(sweep, data_root=None):
    """The base RunSpec of ``sweep`` with params.yaml's defaults."""
    from pipeline.sweep.stage import base_spec

    return base_spec(sweep, data_root=data_root)


def lenet5_space(trials: int) -> dict:
    """A search space of ``trials`` (at most 4) lenet5 trials, one per learning rate: the
    cheapest vehicle for tests of where and how trials run, not of what they train."""
    rates = [0.001, 0.002, 0.003, 0.004]
    assert 1 <= trials <= len(rates)
    return {"model": "lenet5", "routing_iterations": 1, "augment": "none",
            "lr": {"grid": rates[:trials]}}  # fmt: skip
