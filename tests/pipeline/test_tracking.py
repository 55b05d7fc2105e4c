"""W&B offline-first mode selection and reading offline runs back."""

from __future__ import annotations

import pytest

from pipeline import tracking


def test_mode_is_offline_without_an_api_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "missing"))
    assert tracking.resolve_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert tracking.resolve_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracking.resolve_mode("auto") == "offline"
    assert tracking.resolve_mode("disabled") == "disabled"


def test_prepare_environment_exports_the_mode(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracking.prepare_environment("auto") == "offline"
    import os

    assert os.environ["WANDB_MODE"] == "offline"


def test_offline_run_history_and_info_read_back(tmp_path):
    run = tracking.start_run("capsnet", "g", "train-x", "offline", tmp_path, {"lr": 0.001})
    big = "y" * 40000  # rows spanning several 32 KiB blocks of the log
    for epoch in (1, 2, 3):
        run.log({"epoch": epoch, "val_accuracy": epoch / 10, "blob": big}, step=epoch)
    run_id = run.id
    tracking.finish_all([run])  # finish, then wait for W&B's service to write everything

    runs = tracking.offline_runs(tmp_path)
    assert list(runs) == [run_id]
    history = tracking.read_history(runs[run_id])
    assert [(h["epoch"], h["val_accuracy"]) for h in history] == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert all(h["blob"] == big for h in history)
    info = tracking.read_run_info(runs[run_id])
    assert (info["group"], info["job_type"], info["name"]) == ("g", "train", "train-x")
    assert info["config"]["lr"] == 0.001


def test_disabled_mode_starts_no_run(tmp_path):
    assert tracking.start_run("p", "g", "n", "disabled", tmp_path, {}) is None


def test_a_foreign_file_is_not_read_as_a_run(tmp_path):
    run_dir = tmp_path / "offline-run-x"
    run_dir.mkdir()
    (run_dir / "run-x.wandb").write_bytes(b"not a wandb log at all")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        tracking.read_history(run_dir)
