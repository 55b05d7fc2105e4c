"""The sweep/train sections of params.yaml: defaults, distributions, rejected values."""

from __future__ import annotations

import pytest

from capsnet.errors import ConfigError
from capsnet.sweep_config import FinalTrainConfig, SweepConfig


def test_defaults_and_searched_parameters():
    sweep = SweepConfig.from_dict({})
    assert sweep.space.searched() == ["routing_iterations", "augment"]
    assert sweep.resources.gpus_per_trial == 0 and sweep.metric == "val_accuracy"
    assert FinalTrainConfig.from_dict({}).baselines == ["lenet5"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"epoch": 2}, "unknown key"),
        ({"space": {"routing": 3}}, "unknown key"),
        ({"space": {"lr": {"normal": [0, 1]}}}, "expected a value or one of"),
        ({"space": {"lr": {"loguniform": [0, 1]}}}, "bounds must be > 0"),
        ({"space": {"lr": {"uniform": [1, 0.1]}}}, "must be < high"),
        ({"space": {"augment": {"uniform": [0, 1]}}}, "needs numbers"),
        ({"space": {"routing_iterations": {"grid": [1, 2.5]}}}, "integer >= 1"),
        ({"space": {"model": {"grid": []}}}, "non-empty list"),
        ({"resources": {"gpus_per_trial": 1.5}}, "whole number"),
        ({"resources": {"cpus_per_trial": 0}}, "must be > 0"),
        ({"epochs": True}, "expected"),
        ({"metric": "loss"}, "val_accuracy or val_rotated_accuracy"),
        ({"epochs": 2, "asha": {"grace_period": 3}}, "exceeds sweep.epochs"),
        ({"wandb": {"mode": "cloud"}}, "auto, offline, online or disabled"),
        ({"name": "a/b"}, "without '/'"),
    ],
)
def test_invalid_sweep_values_are_rejected(values, message):
    with pytest.raises(ConfigError, match=message):
        SweepConfig.from_dict(values)


def test_params_file_sections_validate_through_capsnet_config(tmp_path):
    from capsnet import config

    path = tmp_path / "params.yaml"
    path.write_text(
        "sweep:\n  epochs: 3\n  space:\n    lr: {loguniform: [0.0001, 0.01]}\n"
        "train:\n  epochs: 2\n  baselines: [lenet5]\n"
    )
    params = config.load(path)
    assert params.sweep.epochs == 3 and params.sweep.space.lr == {"loguniform": [1e-4, 1e-2]}
    assert params.train.epochs == 2
    path.write_text("sweep:\n  epochz: 3\n")
    with pytest.raises(ConfigError, match=r"sweep\.epochz: unknown key"):
        config.load(path)


def test_fingerprint_follows_results_not_resources():
    base = SweepConfig.from_dict({})
    assert (
        base.fingerprint()
        == SweepConfig.from_dict(
            {"resources": {"cpus_per_trial": 2}, "storage_path": "s3://bucket/sweeps"}
        ).fingerprint()
    )
    assert base.fingerprint() != SweepConfig.from_dict({"epochs": 3}).fingerprint()
