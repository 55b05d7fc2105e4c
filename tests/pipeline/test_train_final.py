"""The train stage: the best sweep config and the baselines, written as checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from capsnet.config import FinalTrainConfig, SweepConfig
from capsnet.io.errors import ConfigError
from capsnet.models import checkpoint
from pipeline import provenance, tracking
from pipeline.final.stage import SUMMARY_KEYS, run_summary, train_final


def best_json(path, **config):
    best = {
        "sweep": "tiny",
        "metric": "val_accuracy",
        "trial_id": "abc_00001",
        "rotation_angle": 30.0,
        "config": {
            "model": "capsnet-small",
            "routing_iterations": 2,
            "m_plus": 0.9,
            "m_minus": 0.1,
            "lam": 0.5,
            "augment": "shift",
            "lr": 0.002,
            "recon_weight": 0.0005,
            **config,
        },
    }
    path.write_text(json.dumps(best))
    return path


def test_final_model_and_baseline_are_trained_and_saved(tmp_path, mnist_root):
    final = FinalTrainConfig.from_dict(
        {
            "epochs": 1,
            "batch_size": 50,
            "train_size": 200,
            "val_size": 100,
            "out_dir": str(tmp_path / "models"),
            "seeds": 1,
            "equal_time": False,
        }
    )
    sweep = SweepConfig.from_dict(
        {"name": "tiny", "wandb": {"mode": "offline", "dir": str(tmp_path / "runs")}}
    )
    results = train_final(
        final,
        sweep,
        best_path=best_json(tmp_path / "best.json"),
        data_root=mnist_root,
        metrics_path=tmp_path / "models" / "metrics.json",
        log=lambda line: None,
    )

    assert list(results) == ["capsnet-small", "lenet5"]
    model, meta = checkpoint.load(tmp_path / "models" / "capsnet-small.pt")
    assert meta["model_name"] == "capsnet-small" and model.config.routing_iterations == 2
    assert meta["train_config"]["lr"] == 0.002 and meta["train_config"]["epochs"] == 1
    assert meta["extra"]["role"] == "best" and meta["extra"]["sweep_trial"] == "abc_00001"
    assert meta["extra"]["data"] == {}  # MNIST: no preprocessing to record
    _baseline, base_meta = checkpoint.load(tmp_path / "models" / "lenet5.pt")
    assert base_meta["metrics"]["augment"] == "shift" and base_meta["extra"]["role"] == "baseline"
    for metrics in results.values():
        assert 0 <= metrics["val_accuracy"] <= 1 and metrics["rotation_angle"] == 30.0
    assert json.loads((tmp_path / "models" / "metrics.json").read_text()) == results
    origin = json.loads((tmp_path / "models" / provenance.ORIGIN_FILE).read_text())
    assert origin == {"git_commit": provenance.git_commit(), "machine": provenance.machine()}

    runs = tracking.offline_runs(tmp_path / "runs")
    infos = [tracking.read_run_info(d) for d in runs.values()]
    assert sorted(i["name"] for i in infos) == ["train-capsnet-small", "train-lenet5"]
    assert {(i["group"], i["job_type"]) for i in infos} == {("tiny/train", "train")}
    for run_dir in runs.values():
        assert [h["epoch"] for h in tracking.read_history(run_dir)] == [1]
        summary = tracking.read_summary(run_dir)
        assert set(SUMMARY_KEYS) <= set(summary), summary
        assert summary["dataset"] == "mnist" and summary["test_accuracy"] is None


def test_missing_best_json_names_the_sweep(tmp_path):
    with pytest.raises(ConfigError, match="run the sweep first"):
        train_final(FinalTrainConfig(), SweepConfig(), best_path=tmp_path / "best.json")


def test_unknown_baseline_fails_before_training(tmp_path):
    final = FinalTrainConfig.from_dict({"baselines": ["lenet6"]})
    with pytest.raises(ConfigError, match="unknown model 'lenet6'"):
        train_final(final, SweepConfig(), best_path=best_json(tmp_path / "best.json"))


def test_extra_datasets_train_models_of_their_input_size(tmp_path, mnist_root):
    final = FinalTrainConfig.from_dict(
        {
            "epochs": 1,
            "batch_size": 32,
            "train_size": 64,
            "val_size": 32,
            "baselines": [],
            "extra_datasets": ["multimnist", "expanded-mnist"],
            "extra_train_size": 64,
            "out_dir": str(tmp_path / "models"),
            "seeds": 2,
        }
    )
    sweep = SweepConfig.from_dict(
        {"name": "tiny", "wandb": {"mode": "disabled", "dir": str(tmp_path / "runs")}}
    )
    results = train_final(
        final,
        sweep,
        best_path=best_json(tmp_path / "best.json"),
        data_root=mnist_root,
        log=lambda line: None,
    )
    assert set(results) == {  # the extra sets with the first seed only
        "capsnet-small",
        "capsnet-small@seed1",
        "capsnet-small@multimnist",
        "capsnet-small@expanded-mnist",
    }
    sizes = {}
    for key in ("capsnet-small@multimnist", "capsnet-small@expanded-mnist"):
        model, meta = checkpoint.load(tmp_path / "models" / f"{key}.pt")
        sizes[key] = model.config.input_size
        assert meta["extra"]["dataset"] == key.split("@")[1]
        assert 0 <= results[key]["val_accuracy"] <= 1
    assert sizes == {"capsnet-small@multimnist": 36, "capsnet-small@expanded-mnist": 40}


def test_unknown_extra_dataset_is_a_config_error():
    with pytest.raises(ConfigError, match=r"train\.extra_datasets\[0\]: 'affnist' unknown"):
        FinalTrainConfig.from_dict({"extra_datasets": ["affnist"]})


def test_comparison_trains_seeds_equal_time_and_augmented_baselines(tmp_path, mnist_root):
    out = tmp_path / "models"
    final = FinalTrainConfig.from_dict(
        {
            "epochs": 1,
            "batch_size": 50,
            "train_size": 100,
            "val_size": 50,
            "out_dir": str(out),
            "seed": 4,
            "seeds": 2,
            "augment": "none",
            "baseline_augments": ["rotate"],
            "lr_decay": 0.5,
            "lr_decay_steps": 7,
        }
    )
    sweep = SweepConfig.from_dict({"name": "tiny", "wandb": {"mode": "disabled"}})
    results = train_final(
        final,
        sweep,
        best_path=best_json(tmp_path / "best.json"),  # the sweep's best used shift
        data_root=mnist_root,
        log=lambda line: None,
    )

    assert list(results) == [
        "capsnet-small", "capsnet-small@seed5", "lenet5", "lenet5@seed5",
        "lenet5@equal-time", "lenet5@equal-time-seed5", "lenet5@rotate", "lenet5@rotate-seed5",
    ]  # fmt: skip
    metas = {key: checkpoint.load(out / f"{key}.pt")[1] for key in results}
    seeds = {key: meta["train_config"]["seed"] for key, meta in metas.items()}
    assert seeds == {key: 5 if key.endswith("seed5") else 4 for key in results}
    arms = {key: meta["extra"]["comparison"] for key, meta in metas.items()}
    budget = (
        results["capsnet-small"]["train_seconds"] + results["capsnet-small@seed5"]["train_seconds"]
    ) / 2
    assert arms["capsnet-small@seed5"] == {
        "arm": "equal_augmentation", "label": "capsnet-small", "reference": "capsnet-small",
    }  # fmt: skip
    assert arms["lenet5"] == {**arms["capsnet-small"], "label": "lenet5"}
    costs = arms["lenet5@equal-time"].pop("step_seconds")
    assert arms["lenet5@equal-time-seed5"].pop("step_seconds") == costs
    timed_epochs = metas["lenet5@equal-time"]["train_config"]["epochs"]
    # the rule's seconds: each model's step cost times its steps (2 steps an epoch here)
    for key in ("lenet5@equal-time", "lenet5@equal-time-seed5"):
        assert arms[key].pop("budgeted_seconds") == pytest.approx(costs[0] * 2)
        assert arms[key].pop("planned_seconds") == pytest.approx(costs[1] * 2 * timed_epochs)
    assert arms["lenet5@equal-time-seed5"] == {
        "arm": "equal_time", "label": "lenet5", "reference": "capsnet-small",
        "time_budget_seconds": pytest.approx(budget),
    }  # fmt: skip
    assert costs[0] > costs[1] > 0  # a capsnet-small step costs more than a lenet5 step
    assert arms["lenet5@rotate"]["arm"] == "baseline_augmentation"
    assert arms["lenet5@rotate"]["label"] == "lenet5 (rotate)"
    timed = metas["lenet5@equal-time"]["train_config"]
    # 1 epoch of 2 steps at capsnet-small's cost, in lenet5's steps: no time budget
    assert timed["time_budget"] is None
    assert timed["epochs"] == max(1, round(costs[0] / costs[1])) > 1
    assert results["lenet5@equal-time"]["epochs"] == len(
        metas["lenet5@equal-time"]["metrics"]["history"]
    )
    for key, meta in metas.items():  # final.augment replaced the sweep's shift
        augment = "rotate" if "@rotate" in key else "none"
        assert meta["metrics"]["augment"] == augment == meta["extra"]["run_config"]["augment"]
        assert (meta["extra"]["role"] == "best") == key.startswith("capsnet-small")
        schedule = meta["train_config"]["lr_decay"], meta["train_config"]["lr_decay_steps"]
        assert schedule == (0.5, 7)
    weights = [
        checkpoint.load(out / f"{key}.pt")[0].state_dict() for key in ("lenet5", "lenet5@seed5")
    ]
    assert not all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_smallnorb_final_training_refuses_augmentation():
    from capsnet.config import SmallnorbTrainConfig

    with pytest.raises(ConfigError, match=r"smallnorb_train\.augment: smallNORB augments itself"):
        SmallnorbTrainConfig.from_dict({"baseline_augments": ["rotate"]})


def test_unknown_forced_augmentation_names_the_strategies():
    with pytest.raises(ConfigError, match=r"train\.augment: 'spin' unknown; choose one of none"):
        FinalTrainConfig.from_dict({"augment": "spin"})


def test_every_train_run_summary_has_the_same_keys():
    """An MNIST run, an extra-set run and a smallNORB run: one set of columns in W&B."""
    mnist = {
        "model": "capsnet-small",
        "augment": "shift",
        "epochs": 2,
        "val_accuracy": 0.9,
        "rotation_angle": 30.0,
        "val_rotated_accuracy": 0.7,
        "device": "cpu",
    }
    extra = {"model": "lenet5", "dataset": "multimnist", "epochs": 1, "val_accuracy": None}
    norb = {
        "model": "smallnorb-cnn",
        "dataset": "smallnorb",
        "channels": 2,
        "loss": "auto",
        "smallnorb": {"accuracy": 0.8},
        "test_accuracy": 0.8,
        "node": "n1",
    }
    summaries = [run_summary(mnist, "mnist"), run_summary(extra, "multimnist"),
                 run_summary(norb, "smallnorb")]  # fmt: skip
    assert all(list(s) == list(SUMMARY_KEYS) for s in summaries)
    assert [s["dataset"] for s in summaries] == ["mnist", "multimnist", "smallnorb"]
    assert summaries[2]["test_accuracy"] == 0.8 and summaries[0]["test_accuracy"] is None
