"""The smallNORB ablation in the sweep and final-training stages: plan() mapping of the
ablation axes, a real tiny Ray sweep and train-final on smallNORB-format data, and the
switched-off path (exit 0, outputs marked DISABLED, nothing that looks like a result)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import torch
from clihelpers import assert_one_line_error, invoke_cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from datahelpers import write_smallnorb_raw
from sweephelpers import ONE_PROCESS

from capsnet import models
from capsnet.config import (
    DataParams,
    Params,
    SmallnorbParams,
    SmallnorbSweepConfig,
    SmallnorbTrainConfig,
    SweepConfig,
)
from capsnet.data.datasets import shape_of
from capsnet.io.errors import ConfigError
from capsnet.models import checkpoint
from capsnet.training.run import build_model
from pipeline.final.stage import final_runs, read_best, train_final
from pipeline.sweep.stage import base_spec, load_data, run_sweep
from pipeline.sweep.trainable import run_spec

N_TRAIN = 72  # items per split of the tiny raw files
SHAPE = models.Shape(2, 32, 5)  # stereo 32x32 crops, five classes


@pytest.fixture(scope="module")
def norb_root(tmp_path_factory) -> Path:
    """A data root with tiny smallNORB files (official format) prepared at 48x48."""
    from capsnet.data import stages

    root = tmp_path_factory.mktemp("norb") / "data"
    write_smallnorb_raw(root / "raw" / "smallnorb", n=N_TRAIN, side=96)
    stages.prepare("smallnorb", Params(data=DataParams(smallnorb=SmallnorbParams(True))), root)
    return root


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# --- run_spec(): the ablation axes reach the model and the TrainConfig ------------------------

AXES = {
    "pose": "vector",
    "coordinate_addition": False,
    "loss": "margin",
    "weight_decay": 2e-7,
    "routing_scope": "window",
}


def norb_base(**changes):
    sweep = SmallnorbSweepConfig.from_dict({"epochs": 1, "batch_size": 8, **changes})
    return base_spec(sweep)


def test_run_spec_maps_ablation_axes_to_model_and_train_config():
    run = {"model": "em-capsnet-small", "routing_iterations": 2, "augment": "none", **AXES}
    spec = run_spec(run, norb_base())
    assert spec.overrides == {
        "routing_iterations": 2,
        "pose": "vector",
        "coordinate_addition": False,
        "routing_scope": "window",
    }
    assert spec.train.loss == "margin" and spec.train.weight_decay == 2e-7
    model = build_model(spec, SHAPE)
    assert model.config.pose == "vector" and model.config.coordinate_addition is False
    assert model.config.routing_scope == "window" == model.caps1.routing_scope
    assert (model.config.in_channels, model.config.input_size) == (2, 32)


def test_compile_setting_reaches_the_train_config():
    run = {"model": "em-capsnet-small", "augment": "none", **AXES}
    assert run_spec(run, norb_base(compile=True)).train.compile is True
    assert run_spec(run, norb_base()).train.compile is False


@pytest.mark.parametrize("name", ["smallnorb-cnn", "lenet5", "capsnet-small"])
def test_models_without_the_fields_ignore_pose_and_coordinate_addition(name):
    spec = run_spec({"model": name, **AXES}, norb_base())
    assert "pose" not in spec.overrides and "coordinate_addition" not in spec.overrides
    assert spec.train.loss == "margin" and spec.train.weight_decay == 2e-7
    model = build_model(spec, SHAPE)
    assert (model.config.num_classes, model.config.in_channels) == (5, 2)


def test_mnist_runs_keep_the_defaults():
    """A run without the ablation keys (every MNIST sweep) trains with the defaults."""
    spec = run_spec({"model": "capsnet-small", "routing_iterations": 3}, base_spec(SweepConfig()))
    assert spec.overrides == {"routing_iterations": 3}
    assert spec.train.loss == "auto" and spec.train.weight_decay == 0.0


def test_baselines_train_with_their_own_loss():
    best = {"config": {"model": "em-capsnet-small", "loss": "spread", "pose": "vector"}}
    runs = final_runs(best, SmallnorbTrainConfig(baseline_lr=None))
    assert runs[0]["loss"] == "spread"
    assert runs[1] == {"model": "smallnorb-cnn", "loss": "auto", "pose": "vector"}


def test_baselines_train_at_their_own_learning_rate():
    best = {"config": {"model": "em-capsnet-small", "lr": 0.003}}
    runs = final_runs(best, SmallnorbTrainConfig())  # default: 1e-3 for the CNN
    assert [r["lr"] for r in runs] == [0.003, 0.001]
    assert final_runs(best, SmallnorbTrainConfig(baseline_lr=None))[1]["lr"] == 0.003
    with pytest.raises(ConfigError, match=r"smallnorb_train\.baseline_lr.*> 0"):
        SmallnorbTrainConfig.from_dict({"baseline_lr": 0})


# --- the data split -----------------------------------------------------------------------


def test_load_data_splits_smallnorb_like_capsnet_train(norb_root):
    sweep = SmallnorbSweepConfig.from_dict({"train_size": 30, "val_size": 12, "channels": 1})
    data = load_data(sweep, base_spec(sweep, data_root=norb_root))
    train, val = data.split.train, data.split.val
    assert train.images.shape == (30, 1, 48, 48)  # cropped per item in training
    assert val.images.shape == (12, 1, 32, 32) and val.images.dtype == torch.uint8
    assert val.targets.tolist() == [i % 5 for i in range(N_TRAIN - 12, N_TRAIN)]
    assert data.rotated is None
    image, label = train[0]
    assert image.shape == (1, 32, 32) and label == 0
    assert shape_of(train) == shape_of(val) == (1, 32, 5)


# --- a real tiny Ray sweep ------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def tiny_norb_sweep(tmp_path, **overrides) -> SweepConfig:
    values = {
        "name": "tiny-norb",
        "space": {
            "model": "em-capsnet-small",
            "routing_iterations": 1,
            "pose": {"grid": ["matrix", "vector"]},
            "coordinate_addition": False,
            "loss": "spread",
            "routing_scope": "global",
        },
        "epochs": 1,
        "batch_size": 8,
        "train_size": 24,
        "val_size": 16,
        "asha": {"enabled": False},
        "resources": ONE_PROCESS,
        "storage_path": str(tmp_path / "ray"),
        "wandb": {"mode": "disabled"},
        **overrides,
    }
    return SmallnorbSweepConfig.from_dict(values)


@pytest.mark.slow
def test_tiny_smallnorb_sweep_searches_pose(local_ray, norb_root, tmp_path):
    sweep = tiny_norb_sweep(tmp_path)
    out = tmp_path / "sweep-smallnorb"
    (out / "DISABLED.txt").parent.mkdir(parents=True)
    (out / "DISABLED.txt").write_text("stale marker from a run with the data off\n")
    outcome = run_sweep(sweep, base_spec(sweep, data_root=norb_root), out_dir=out)

    rows = read_csv(out / "results.csv")
    assert sorted(r["pose"] for r in rows) == ["matrix", "vector"]
    assert {r["status"] for r in rows} == {"TERMINATED"}
    for row in rows:
        assert row["model"] == "em-capsnet-small" and row["routing_iterations"] == "1"
        assert (row["coordinate_addition"], row["loss"]) == ("False", "spread")
        assert float(row["weight_decay"]) == 2e-7  # the section's default (the paper's)
        assert 0.0 <= float(row["final_val_accuracy"]) <= 1.0 and row["epochs"] == "1"
    assert not any("rotated" in column for column in rows[0])

    # each trial built the model with its own pose: the checkpoint Tune saved has the
    # parameter count of em-capsnet-small with that pose
    for row in rows:
        (saved,) = Path(outcome.experiment_path).glob(
            f"trial_{row['trial_id']}/checkpoint_*/trial.pt"
        )
        weights = torch.load(saved, weights_only=True)["model"]
        expected = models.build(
            "em-capsnet-small",
            SHAPE,
            pose=row["pose"],
            coordinate_addition=False,
            routing_iterations=1,
        )
        assert sum(w.numel() for w in weights.values()) == sum(
            p.numel() for p in expected.state_dict().values()
        )

    best = json.loads((out / "best.json").read_text())
    top = max(rows, key=lambda r: float(r["final_val_accuracy"]))
    assert best["dataset"] == "smallnorb" and best["channels"] == 2
    assert best["config"]["pose"] == top["pose"] and best["config"]["loss"] == "spread"
    assert set(best["metrics"]) == {"epoch", "val_accuracy"}
    assert best["metrics"]["val_accuracy"] == pytest.approx(
        max(float(r["final_val_accuracy"]) for r in rows)
    )

    ablation = read_csv(out / "plots" / "ablation.csv")
    assert [r["setting"] for r in ablation] == ["pose=matrix", "pose=vector"]
    assert all(r["trials"] == "1" for r in ablation)
    assert [r["routing_iterations"] for r in read_csv(out / "plots" / "by_routing.csv")] == [
        "em-capsnet-small/1"
    ]
    assert not (out / "plots" / "by_augment.csv").exists()
    assert not (out / "DISABLED.txt").exists()  # the stale marker is gone


# --- train-final on smallNORB -----------------------------------------------------------------


def write_params(path: Path, tmp_path: Path, enabled: bool = True) -> Path:
    path.write_text(
        f"""
data:
  smallnorb:
    enabled: {str(enabled).lower()}
smallnorb_sweep:
  space:
    model: em-capsnet-small
    routing_iterations: 1
    pose: vector
    coordinate_addition: true
    loss: margin
  epochs: 1
  batch_size: 8
  train_size: 24
  val_size: 16
  asha: {{enabled: false}}
  storage_path: {tmp_path / "sweep-smallnorb" / "ray"}
  wandb: {{mode: disabled}}
smallnorb_train:
  epochs: 1
  batch_size: 8
  train_size: 24
  val_size: 16
  test_size: 20
  seeds: 1
  out_dir: {tmp_path / "models-smallnorb"}
"""
    )
    return path


def norb_best(path: Path) -> Path:
    best = {
        "sweep": "smallnorb-sweep",
        "metric": "val_accuracy",
        "mode": "max",
        "dataset": "smallnorb",
        "channels": 2,
        "trial_id": "abc_00003",
        "config": {
            "model": "em-capsnet-small",
            "routing_iterations": 2,
            "augment": "none",
            "lr": 0.003,
            "pose": "vector",
            "coordinate_addition": False,
            "loss": "margin",
            "weight_decay": 2e-7,
        },
    }
    path.write_text(json.dumps(best))
    return path


@pytest.mark.slow
def test_train_final_on_smallnorb_writes_loadable_checkpoints(norb_root, tmp_path):
    params = write_params(tmp_path / "params.yaml", tmp_path)
    best = norb_best(tmp_path / "best.json")
    result = invoke_cli(
        "train-final", "--params", params, "--section", "smallnorb_train",
        "--sweep-section", "smallnorb_sweep", "--best", best, "--data-root", norb_root,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = tmp_path / "models-smallnorb"
    assert sorted(p.name for p in out.iterdir()) == [
        "ORIGIN.json",
        "em-capsnet-small.pt",
        "metrics.json",
        "smallnorb-cnn.pt",
    ]
    model, meta = checkpoint.load(out / "em-capsnet-small.pt")
    assert (model.config.in_channels, model.config.input_size, model.config.num_classes) == (
        2,
        32,
        5,
    )
    assert model.config.pose == "vector" and model.config.coordinate_addition is False
    assert model.config.routing_iterations == 2
    assert meta["train_config"]["loss"] == "margin" and meta["train_config"]["weight_decay"] == 2e-7
    assert meta["extra"]["role"] == "best" and meta["extra"]["dataset"] == "smallnorb"
    assert meta["extra"]["data"] == {"standardize": True}  # data.smallnorb.standardize
    assert meta["metrics"]["smallnorb"]["n"] == 20
    assert 0.0 <= meta["metrics"]["smallnorb"]["accuracy"] <= 1.0
    cnn, cnn_meta = checkpoint.load(out / "smallnorb-cnn.pt")
    assert (cnn.config.in_channels, cnn.config.num_classes) == (2, 5)
    assert cnn_meta["extra"]["role"] == "baseline" and cnn_meta["train_config"]["loss"] == "auto"
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"em-capsnet-small", "smallnorb-cnn"}
    assert metrics["smallnorb-cnn"]["smallnorb"] == cnn_meta["metrics"]["smallnorb"]
    assert "smallnorb test accuracy" in result.stdout


def test_best_json_of_another_dataset_is_refused(norb_root, tmp_path):
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"config": {"model": "capsnet-small"}}))  # an MNIST sweep's
    sweep = SmallnorbSweepConfig.from_dict({"wandb": {"mode": "disabled"}})
    with pytest.raises(ConfigError, match="best config of a mnist sweep"):
        train_final(SmallnorbTrainConfig(), sweep, best_path=path, data_root=norb_root)


# --- smallNORB switched off ---------------------------------------------------------------------


def assert_disabled_outputs(tmp_path: Path, reason_fragment: str) -> None:
    sweep_out = tmp_path / "sweep-smallnorb"
    assert reason_fragment in (sweep_out / "DISABLED.txt").read_text()
    best = json.loads((sweep_out / "best.json").read_text())
    assert list(best) == ["disabled"] and reason_fragment in best["disabled"]
    with open(sweep_out / "results.csv", newline="") as fh:
        header, *rows = list(csv.reader(fh))
    assert rows == [] and "pose" in header and "final_val_accuracy" in header
    for name in ("by_routing", "ablation"):
        assert len((sweep_out / "plots" / f"{name}.csv").read_text().splitlines()) == 1
    # every declared output and nothing else; Tune's state is no output, so none is made
    assert sorted(p.name for p in sweep_out.iterdir()) == [
        "DISABLED.txt", "best.json", "plots", "results.csv"
    ]  # fmt: skip
    models_out = tmp_path / "models-smallnorb"
    assert sorted(p.name for p in models_out.iterdir()) == ["DISABLED.txt", "metrics.json"]
    assert reason_fragment in (models_out / "DISABLED.txt").read_text()
    metrics = json.loads((models_out / "metrics.json").read_text())
    assert list(metrics) == ["disabled"]


def run_disabled_stages(params: Path, tmp_path: Path, data_root: Path, explicit: bool = True):
    """Both commands (in this process, from the current directory) as DVC runs them
    (``explicit``) or with the default --out, --best and --sweep-section of the smallNORB
    sections."""
    paths = ["--out", tmp_path / "sweep-smallnorb"] if explicit else []
    sweep = invoke_cli(
        "sweep", "--params", params, "--section", "smallnorb_sweep", *paths,
        "--data-root", data_root,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr
    assert "not run" in sweep.stdout
    paths = ["--best", tmp_path / "sweep-smallnorb" / "best.json"] if explicit else []
    paths += ["--sweep-section", "smallnorb_sweep"] if explicit else []
    train = invoke_cli(
        "train-final", "--params", params, "--section", "smallnorb_train", *paths,
        "--data-root", data_root,
    )  # fmt: skip
    assert train.returncode == 0, train.stderr
    assert not (tmp_path / "sweep").exists()  # the MNIST sweep's directory is left alone
    return sweep, train


def test_switched_off_in_params_writes_marked_outputs(tmp_path, norb_root, monkeypatch):
    monkeypatch.chdir(tmp_path)
    params = write_params(tmp_path / "params.yaml", tmp_path, enabled=False)
    stale = tmp_path / "models-smallnorb" / "em-capsnet-small.pt"
    stale.parent.mkdir()
    stale.write_bytes(b"a checkpoint of an earlier run")
    run_disabled_stages(params, tmp_path, norb_root, explicit=False)
    assert_disabled_outputs(tmp_path, "data.smallnorb.enabled is false")


def test_disabled_prepared_data_writes_marked_outputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from capsnet.io.outputset import write_disabled

    root = tmp_path / "data"
    write_disabled(
        root / "prepared" / "smallnorb", "data.smallnorb.enabled is false in params.yaml"
    )
    params = write_params(tmp_path / "params.yaml", tmp_path, enabled=True)
    run_disabled_stages(params, tmp_path, root)
    assert_disabled_outputs(tmp_path, "is switched off")


def test_disabled_best_json_with_the_data_on_is_a_one_line_error(tmp_path, norb_root):
    params = write_params(tmp_path / "params.yaml", tmp_path, enabled=True)
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"disabled": "data.smallnorb.enabled is false in params.yaml"}))
    result = invoke_cli(
        "train-final", "--params", params, "--section", "smallnorb_train",
        "--best", best, "--data-root", norb_root,
    )  # fmt: skip
    assert_one_line_error(result, "the sweep did not run", "rerun it")
    with pytest.raises(ConfigError, match="did not run"):
        read_best(best)
