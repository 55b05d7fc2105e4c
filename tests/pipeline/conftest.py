"""Fixtures for the sweep tests: a tiny sweep config and its data, loaded once."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.tune", reason="the pipeline extra (ray[tune]) is not installed")
pytest.importorskip("wandb", reason="the pipeline extra (wandb) is not installed")

from capsnet.config import SweepConfig

TRAIN_SIZE, VAL_SIZE = 300, 200


def make_tiny_sweep(tmp_path, **overrides) -> SweepConfig:
    """capsnet-small on 300 images, routing 1 vs 3: two one-epoch trials by default."""
    values = {
        "name": "tiny",
        "space": {
            "model": "capsnet-small",
            "routing_iterations": {"grid": [1, 3]},
            "augment": "none",
        },
        "epochs": 1,
        "batch_size": 50,
        "train_size": TRAIN_SIZE,
        "val_size": VAL_SIZE,
        "asha": {"enabled": False},
        "storage_path": str(tmp_path / "ray"),
        "wandb": {"mode": "offline", "dir": str(tmp_path / "runs")},
    }
    values.update(overrides)
    return SweepConfig.from_dict(values)


@pytest.fixture(scope="session")
def sweep_data(mnist_root):
    """The tiny sweep's data (train, val, rotated val), shared by every sweep test."""
    from sweephelpers import base

    from pipeline.sweep.stage import load_data

    sweep = SweepConfig.from_dict({"train_size": TRAIN_SIZE, "val_size": VAL_SIZE})
    return load_data(sweep, base(sweep, mnist_root))


@pytest.fixture
def tiny_sweep(tmp_path):
    """A factory: tiny_sweep(**overrides) -> SweepConfig storing under tmp_path."""
    return lambda **overrides: make_tiny_sweep(tmp_path, **overrides)
