"""W&B offline-first mode selection and reading offline runs back."""

from __future__ import annotations

import re

import pytest

from pipeline import provenance, tracking


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
    assert (info["group"], info["job_type"], info["name"]) == ("g/train", "train", "train-x")
    assert info["config"]["lr"] == 0.001
    assert set(provenance.provenance()) <= set(info["config"])


def test_disabled_mode_starts_no_run(tmp_path):
    assert tracking.start_run("p", "g", "n", "disabled", tmp_path, {}) is None


def test_a_foreign_file_is_not_read_as_a_run(tmp_path):
    run_dir = tmp_path / "offline-run-x"
    run_dir.mkdir()
    (run_dir / "run-x.wandb").write_bytes(b"not a wandb log at all")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        tracking.read_history(run_dir)


RESULTS = {
    "capsnet-small": {
        "model": "capsnet-small",
        "checkpoint": "models/capsnet-small.pt",
        "mnist": {"accuracy": 0.97, "n": 1000},
    },
    "lenet5@multimnist": {
        "model": "lenet5",
        "checkpoint": "models/lenet5@multimnist.pt",
        "mnist": {"accuracy": 0.9, "n": 1000},
    },
}


def _publish(tmp_path, group="exp-1"):
    from pipeline.publish import stage as publish

    return publish.publish_runs(
        RESULTS,
        tmp_path / "figures",
        project="capsnet-test",
        group=group,
        mode="offline",
        wandb_dir=tmp_path / "runs",
    )


def test_publishing_twice_reuses_the_run_ids(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    first = {r["name"]: r["run_id"] for r in _publish(tmp_path)}
    second = {r["name"]: r["run_id"] for r in _publish(tmp_path)}
    assert first == second and len(set(first.values())) == 2
    assert first["capsnet-small"] == tracking.run_id(
        "capsnet-test",
        "exp-1/eval",
        "eval-capsnet-small",
        provenance.content_hash(RESULTS["capsnet-small"]),
    )
    # each publish wrote its own offline run under the same id: `wandb sync` of both
    # lands in one W&B run per checkpoint
    # (offline-run-<date>_<time>-<id>, with "-1" appended when both start in one second)
    names = [p.name for p in (tmp_path / "runs").glob("wandb/offline-run-*")]
    written = [
        re.fullmatch(r"offline-run-\d{8}_\d{6}-([0-9a-f]+)(-\d+)?", n).group(1) for n in names
    ]
    assert sorted(written) == sorted([*first.values(), *first.values()])
    for run_dir in (tmp_path / "runs").glob("wandb/offline-run-*"):
        info = tracking.read_run_info(run_dir)
        assert info["run_id"] in first.values() and info["job_type"] == "eval"
        assert info["group"] == "exp-1/eval" and info["config"]["dvc_experiment"] is None
        assert info["config"]["params_hash"] == provenance.params_hash()
    # another experiment gets other runs
    other = {r["name"]: r["run_id"] for r in _publish(tmp_path, group="exp-2")}
    assert not set(other.values()) & set(first.values())


def test_runs_of_a_dvc_experiment_are_its_own(tmp_path, monkeypatch):
    """Inside `dvc exp run` (DVC_EXP_NAME set) the eval runs get other ids and a group per
    experiment and stage, and record the experiment's name; other numbers, other ids."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    workspace = {r["name"]: r["run_id"] for r in _publish(tmp_path / "a")}
    monkeypatch.setenv("DVC_EXP_NAME", "tiny-exp")
    experiment = {r["name"]: r["run_id"] for r in _publish(tmp_path / "b")}
    assert not set(workspace.values()) & set(experiment.values())
    for run_dir in tracking.offline_runs(tmp_path / "b" / "runs").values():
        info = tracking.read_run_info(run_dir)
        assert info["group"] == "exp-1/tiny-exp/eval"
        assert info["config"]["dvc_experiment"] == "tiny-exp"
    changed = {**RESULTS, "capsnet-small": {**RESULTS["capsnet-small"], "mnist": {"accuracy": 0.5}}}
    from pipeline.publish import stage as publish

    again = publish.publish_runs(
        changed, tmp_path, project="capsnet-test", group="exp-1", mode="offline",
        wandb_dir=tmp_path / "c",
    )  # fmt: skip
    ids = {r["name"]: r["run_id"] for r in again}
    assert ids["capsnet-small"] != experiment["capsnet-small"]
    assert ids["lenet5@multimnist"] == experiment["lenet5@multimnist"]


def test_a_relative_wandb_dir_lands_in_the_experiments_repository(tmp_path, monkeypatch):
    """Queued experiments run in a temporary copy; DVC_ROOT names the main workspace."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    assert tracking.workspace_path("runs") == tmp_path / "runs"
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "main"))
    assert tracking.workspace_path("runs") == tmp_path / "main" / "runs"
    assert tracking.workspace_path(tmp_path / "abs") == tmp_path / "abs"


def test_run_ids_are_valid_wandb_ids():
    ids = {tracking.run_id("p", "g", name, f"models/{name}.pt") for name in ("a", "b", "a@x")}
    assert len(ids) == 3
    assert all(len(i) == 24 and i.isalnum() and i.islower() for i in ids)


def test_sweep_run_config_holds_what_every_trial_shares():
    from types import SimpleNamespace

    from capsnet.config import SweepConfig
    from pipeline.sweep.stage import base_spec

    sweep = SweepConfig.from_dict(
        {"name": "s", "epochs": 3, "batch_size": 32, "seed": 7, "train_size": 300}
    )
    split = SimpleNamespace(train=[0] * 300, val=[0] * 120)
    shared = tracking.sweep_run_config(sweep, base_spec(sweep), split)
    assert shared == {
        "sweep": "s",
        "dataset": "mnist",
        "epochs": 3,
        "batch_size": 32,
        "seed": 7,
        "train_size": 300,
        "val_size": 120,
        "cpus_per_trial": sweep.resources.cpus_per_trial,
        "gpus_per_trial": sweep.resources.gpus_per_trial,
    }


def test_trial_runs_record_the_full_config_node_and_device(tmp_path):
    from types import SimpleNamespace

    shared = {"epochs": 2, "batch_size": 64, "train_size": 256, "val_size": 128, "seed": 0}
    callback = tracking.sweep_callback("capsnet-test", "tiny", "offline", tmp_path, shared)
    trial = SimpleNamespace(trial_id="abc12_00000", config={"model": "capsnet-small", "lr": 0.01})
    callback.on_trial_start(0, [trial], trial)
    for epoch in (1, 2):
        result = {"epoch": epoch, "val_accuracy": epoch / 4, "node": "n1", "device": "cpu"}
        callback.on_trial_result(0, [trial], trial, result)
    callback.on_trial_complete(0, [trial], trial)
    callback.on_experiment_end([trial])

    (run_dir,) = tracking.offline_runs(tmp_path).values()
    info = tracking.read_run_info(run_dir)
    assert info["group"] == "tiny/sweep" and info["config"]["trial_id"] == "00000"
    assert info["name"] == "tiny-00000"  # Tune's random prefix dropped
    assert len(info["run_id"]) == 24 and "params_hash" in info["config"]
    assert {k: info["config"][k] for k in shared} == shared
    assert info["config"]["model"] == "capsnet-small" and info["config"]["lr"] == 0.01
    assert (info["config"]["node"], info["config"]["device"]) == ("n1", "cpu")
    history = tracking.read_history(run_dir)
    assert [(h["epoch"], h["val_accuracy"]) for h in history] == [(1, 0.25), (2, 0.5)]
    assert all("node" not in h and "device" not in h for h in history)


def test_run_configs_hold_only_the_settings_the_model_uses():
    from pipeline.sweep.trainable import used_settings

    best = {
        "model": "capsnet-small",
        "routing_iterations": 3,
        "m_plus": 0.9,
        "m_minus": 0.1,
        "lam": 0.5,
        "recon_weight": 0.0005,
        "augment": "shift",
        "lr": 0.001,
    }
    lenet = used_settings({**best, "model": "lenet5"}, "lenet5")
    assert lenet == {"model": "lenet5", "augment": "shift", "lr": 0.001}
    assert used_settings(best, "capsnet-small") == best
    forced = used_settings({**best, "model": "lenet5"}, "lenet5", loss="margin")
    assert "routing_iterations" not in forced and forced["m_plus"] == 0.9


def test_provenance_names_commit_params_code_and_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("a: 1  # a comment\n")
    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  prep:\n    outs:\n    - path: data/prepared/mnist\n"
        "      md5: abc.dir\n    - path: models\n      md5: def.dir\n"
    )
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "0123456789abcdef")
    provenance.git_commit.cache_clear()
    try:
        origin = provenance.provenance()
    finally:
        provenance.git_commit.cache_clear()
    assert origin["git_commit"] == "0123456789abcdef"
    assert origin["params_hash"] == provenance.content_hash({"a": 1})
    assert origin["data_hash"] == provenance.content_hash([("data/prepared/mnist", "abc.dir")])
    assert len(origin["code_hash"]) == 16
    (tmp_path / "params.yaml").write_text("a: 1\n")  # layout and comments do not count
    assert provenance.params_hash() == origin["params_hash"]
    # a rewritten dvc.lock is read again (the parse is kept per version of the file)
    lock = (tmp_path / "dvc.lock").read_text()
    (tmp_path / "dvc.lock").write_text(lock.replace("abc.dir", "abd.dir"))
    assert provenance.data_hash() == provenance.content_hash([("data/prepared/mnist", "abd.dir")])
