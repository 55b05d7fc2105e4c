"""What a trial reports and saves: its device, its peak GPU memory, and checkpoints at the
``sweep.checkpoint`` cadence with the optimizer state only where asked (quick suite: the
trial function runs in this process with Tune's report captured)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sweephelpers import base

from capsnet.config import SweepConfig
from pipeline.sweep import trainable

EPOCHS = 5


@pytest.fixture
def captured(monkeypatch, tmp_path):
    """Tune's report and checkpoint calls, recorded: [(metrics, saved checkpoint dir)]."""
    import ray
    from ray import tune

    reports: list[tuple[dict, Path | None]] = []
    state = {"resume": None}

    def report(metrics, checkpoint=None):
        kept = None
        if checkpoint is not None:  # the trial deletes its directory after reporting
            kept = tmp_path / f"saved-{len(reports)}"
            shutil.copytree(checkpoint.path, kept)
        reports.append((dict(metrics), kept))

    monkeypatch.setattr(tune, "report", report)
    monkeypatch.setattr(tune, "get_checkpoint", lambda: state["resume"])
    context = SimpleNamespace(get_node_id=lambda: "node-under-test")
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    return SimpleNamespace(reports=reports, state=state)


def run_trial(sweep_data, captured, epochs=EPOCHS, **options):
    sweep = SweepConfig.from_dict({"epochs": epochs, "batch_size": 100, "train_size": 300,
                                   "val_size": 200})  # fmt: skip
    spec = base(sweep)
    spec = dataclasses.replace(spec, train=dataclasses.replace(spec.train, device="cpu"))
    config = {"model": "lenet5", "augment": "none", "lr": 0.001}
    trainable.train_trial(
        config, base=spec, split=sweep_data.split, rotated=sweep_data.rotated, **options
    )
    return captured.reports


def test_reports_name_the_device_and_no_gpu_memory_on_a_cpu(sweep_data, captured):
    reports = run_trial(sweep_data, captured, epochs=2, checkpoint_every=1)
    assert [m["epoch"] for m, _ in reports] == [1, 2]
    for metrics, _ in reports:
        assert metrics["device"] == "cpu" and metrics["peak_gpu_memory_mb"] is None
        assert metrics["node"] == "node-under-test"
    assert trainable.device_label(torch.device("cpu")) == "cpu"
    assert trainable.peak_gpu_memory_mb(torch.device("cpu")) is None


@pytest.mark.parametrize("keep_optimizer", [False, True])
def test_checkpoints_every_n_epochs_and_the_last_weights_only(sweep_data, captured, keep_optimizer):
    reports = run_trial(sweep_data, captured, checkpoint_every=2, keep_optimizer=keep_optimizer)
    assert [m["epoch"] for m, _ in reports] == [1, 2, 3, 4, 5]
    saved = {m["epoch"]: path for m, path in reports if path is not None}
    assert sorted(saved) == [2, 4, 5]
    payload = torch.load(saved[4] / trainable.CHECKPOINT_FILE, weights_only=True)
    from capsnet import models

    weights = models.build("lenet5", (1, 28, 10)).state_dict()
    assert {k: v.shape for k, v in payload["model"].items()} == {
        k: v.shape for k, v in weights.items()
    }
    state = payload["state"]
    assert state["epoch"] == 4 and [h["epoch"] for h in state["history"]] == [1, 2, 3, 4]
    if keep_optimizer:
        moments = state["optimizer"]["state"]
        assert len(moments) == len(weights)  # Adam's moments for every parameter
    else:
        assert state["optimizer"] is None
    assert state["scheduler"] is not None and state["rng"] is not None
    last = torch.load(saved[5] / trainable.CHECKPOINT_FILE, weights_only=True)
    assert last["state"]["epoch"] == 5 and last["model"].keys() == weights.keys()
    assert last["state"]["optimizer"] is None  # nothing resumes from the last epoch


def test_a_weights_only_checkpoint_resumes_the_epochs(sweep_data, captured):
    from ray import tune

    reports = run_trial(sweep_data, captured, epochs=3, checkpoint_every=2, keep_optimizer=False)
    saved = next(path for _, path in reports if path is not None)  # epoch 2
    captured.reports.clear()
    captured.state["resume"] = tune.Checkpoint.from_directory(saved)
    resumed = run_trial(sweep_data, captured, epochs=3, checkpoint_every=2, keep_optimizer=False)
    assert [m["epoch"] for m, _ in resumed] == [3]  # epochs 1 and 2 are not trained again


def test_checkpoint_settings_validate_and_decide_the_optimizer_state():
    config = SweepConfig.from_dict({"checkpoint": {"every_epochs": 3}})
    assert config.checkpoint.every_epochs == 3
    assert config.checkpoint.keeps_optimizer(2) and not config.checkpoint.keeps_optimizer(0)
    never = SweepConfig.from_dict({"checkpoint": {"optimizer_state": "never"}}).checkpoint
    always = SweepConfig.from_dict({"checkpoint": {"optimizer_state": "always"}}).checkpoint
    assert not never.keeps_optimizer(2) and always.keeps_optimizer(0)
    from capsnet.io.errors import ConfigError

    with pytest.raises(ConfigError, match=r"sweep\.checkpoint\.every_epochs: must be >= 1"):
        SweepConfig.from_dict({"checkpoint": {"every_epochs": 0}})
    with pytest.raises(ConfigError, match=r"sweep\.checkpoint\.optimizer_state: 'sometimes'"):
        SweepConfig.from_dict({"checkpoint": {"optimizer_state": "sometimes"}})


def test_cuda_devices_are_labelled_with_index_and_name_and_report_peak_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"GPU-{index}")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 1536 * 2**20)
    assert trainable.device_label(torch.device("cuda", 0)) == "cuda:0 GPU-0"
    assert trainable.device_label(torch.device("cuda")) == "cuda:1 GPU-1"  # the current one
    assert trainable.peak_gpu_memory_mb(torch.device("cuda", 0)) == 1536.0


def test_final_runs_are_scored_before_the_model_leaves_its_device(monkeypatch):
    from torch import nn

    import capsnet.training.run
    from pipeline.final.stage import fit_and_score

    order: list[str] = []

    class Model(nn.Linear):
        def cpu(self):
            order.append("cpu")
            return super().cpu()

    def fake_train_run(spec, split, on_epoch=None, to_cpu=True):
        order.append(f"trained, to_cpu={to_cpu}")
        return capsnet.training.run.RunResult(Model(2, 2), [{"epoch": 1}], 1.0, spec.train, 4)

    def score(model, spec):
        order.append("score")
        return {"val_rotated_accuracy": 0.5}

    monkeypatch.setattr(capsnet.training.run, "train_run", fake_train_run)
    spec = capsnet.training.run.RunSpec(model="lenet5")
    _result, scores, device = fit_and_score(spec, None, score)
    assert order == ["trained, to_cpu=False", "score", "cpu"]
    assert scores == {"val_rotated_accuracy": 0.5} and device == "cpu"
