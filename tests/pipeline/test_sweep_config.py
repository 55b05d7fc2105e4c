"""The sweep/train sections of params.yaml: defaults, distributions, rejected values."""

from __future__ import annotations

from pathlib import Path

import pytest

from capsnet.config import FinalTrainConfig, SweepConfig
from capsnet.io.errors import ConfigError


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
        (
            {"space": {"routing_iterations": {"grid": [1, 2.5]}}},
            r"routing_iterations\.grid\[1\]: expected an integer, got 2\.5",
        ),
        ({"space": {"model": {"grid": []}}}, "non-empty list"),
        ({"resources": {"gpus_per_trial": 1.5}}, "whole number"),
        ({"resources": {"cpus_per_trial": 0}}, "must be > 0"),
        ({"epochs": True}, "expected"),
        ({"metric": "loss"}, "sweep.metric: 'loss' unknown; choose one of val_accuracy, val_rot"),
        ({"epochs": 2, "asha": {"grace_period": 3}}, "exceeds sweep.epochs"),
        ({"wandb": {"mode": "cloud"}}, "'cloud' unknown; choose one of auto, offline, online, dis"),
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


def test_compile_must_be_a_boolean():
    with pytest.raises(ConfigError, match=r"sweep\.compile: expected true or false"):
        SweepConfig.from_dict({"compile": "yes"})


# --- the smallNORB ablation: smallnorb_sweep / smallnorb_train and the new axes ---------------


def test_smallnorb_sections_default_to_the_papers_ablation():
    from capsnet.config import SEARCHABLE, SmallnorbSweepConfig, SmallnorbTrainConfig

    sweep = SmallnorbSweepConfig.from_dict({})
    assert (sweep.dataset, sweep.channels, sweep.batch_size) == ("smallnorb", 2, 64)
    assert sweep.space.searched() == [
        "routing_iterations", "pose", "coordinate_addition", "loss", "routing_scope",
    ]  # fmt: skip
    assert sweep.space.model == "em-capsnet-small" and sweep.space.weight_decay == 2e-7
    assert sweep.metrics() == ("val_accuracy",) and sweep.parameters() == list(SEARCHABLE)
    final = SmallnorbTrainConfig.from_dict({})
    assert final.baselines == ["smallnorb-cnn"] and final.out_dir == "models-smallnorb"


def test_mnist_sweep_records_the_ablation_axes_only_when_searched():
    """The EM ablation axes at their neutral values add no columns to an MNIST sweep."""
    sweep = SweepConfig.from_dict({})
    assert sweep.parameters() == [
        "model", "routing_iterations", "m_plus", "m_minus", "lam", "augment", "lr",
        "recon_weight",
    ]  # fmt: skip
    assert sweep.metrics() == ("val_accuracy", "val_rotated_accuracy")
    searched = SweepConfig.from_dict({"space": {"weight_decay": {"grid": [0.0, 1e-4]}}})
    assert "weight_decay" in searched.parameters()
    assert SweepConfig.from_dict({"space": {"loss": "margin"}}).parameters()[-1] == "loss"


def test_detach_inner_is_an_axis_whose_neutral_value_is_the_model_default():
    from capsnet import models
    from capsnet.config import ABLATION
    from capsnet.training.run import RunSpec, build_model
    from pipeline.sweep.trainable import run_spec

    assert models.build("capsnet-small").config.detach_inner is ABLATION["detach_inner"]
    assert "detach_inner" not in SweepConfig.from_dict({}).parameters()
    searched = SweepConfig.from_dict({"space": {"detach_inner": {"grid": [True, False]}}})
    assert searched.space.searched()[-1] == "detach_inner"
    assert searched.parameters()[-1] == "detach_inner"
    spec = run_spec({"model": "capsnet-small", "detach_inner": False}, RunSpec("capsnet-small"))
    assert spec.overrides["detach_inner"] is False
    assert build_model(spec, models.Shape(1, 28, 10)).config.detach_inner is False
    assert "detach_inner" not in run_spec({"model": "lenet5", "detach_inner": False},
                                          RunSpec("lenet5")).overrides  # fmt: skip
    with pytest.raises(ConfigError, match=r"sweep\.space\.detach_inner: expected true or false"):
        SweepConfig.from_dict({"space": {"detach_inner": "no"}})


def test_trainer_reads_the_loss_choices_from_the_config():
    from capsnet.config import LOSSES
    from capsnet.config.training import LOSSES as TRAIN_LOSSES

    assert TRAIN_LOSSES is LOSSES


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"space": {"pose": "cube"}},
            r"^params: sweep\.space\.pose: 'cube' unknown; choose one of matrix",
        ),
        (
            {"space": {"pose": {"grid": ["matrix", 4]}}},
            r"^params: sweep\.space\.pose\.grid\[1\]: 4 unknown",
        ),
        (
            {"space": {"pose": {"uniform": [0, 1]}}},
            r"^params: sweep\.space\.pose: uniform needs numbers",
        ),
        (
            {"space": {"coordinate_addition": "yes"}},
            r"^params: sweep\.space\.coordinate_addition: expected true or false, got 'yes'",
        ),
        (
            {"space": {"coordinate_addition": {"grid": [True, 0]}}},
            r"^params: sweep\.space\.coordinate_addition\.grid\[1\]: expected true or false, got 0",
        ),
        (
            {"space": {"loss": "hinge"}},
            r"^params: sweep\.space\.loss: 'hinge' unknown; choose one of auto",
        ),
        (
            {"space": {"weight_decay": -1e-7}},
            r"^params: sweep\.space\.weight_decay: -1e-07 must be >= 0",
        ),
        (
            {"space": {"weight_decay": "2e-7"}},
            r"^params: sweep\.space\.weight_decay: expected a number, got '2e-7'",
        ),
        (
            {"dataset": "cifar"},
            r"^params: sweep\.dataset: 'cifar' unknown; choose one of mnist, smallnorb",
        ),
        ({"channels": 3}, r"^params: sweep\.channels: must be 1 \(left image\) or 2"),
        ({"channels": True}, r"^params: sweep\.channels: expected an integer, got True"),
        (
            {
                "dataset": "smallnorb",
                "space": {"augment": "none"},
                "metric": "val_rotated_accuracy",
            },
            r"^params: sweep\.metric: 'val_rotated_accuracy': a smallnorb sweep reports only",
        ),
        ({"dataset": "smallnorb"}, r"^params: sweep\.space\.augment: must be none for smallnorb"),
    ],
)
def test_invalid_smallnorb_axes_are_rejected(values, message):
    with pytest.raises(ConfigError, match=message):
        SweepConfig.from_dict(values)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "smallnorb_sweep:\n  space:\n    pose: {grid: [matrix, quaternion]}\n",
            r"^params\.yaml: smallnorb_sweep\.space\.pose\.grid\[1\]: 'quaternion' unknown",
        ),
        ("smallnorb_sweep:\n  metric: val_rotated_accuracy\n", r"smallnorb_sweep\.metric"),
        ("smallnorb_sweep:\n  asha: {grace_period: 0}\n", r"smallnorb_sweep\.asha\.grace_period"),
        ("smallnorb_sweep:\n  chanels: 1\n", r"smallnorb_sweep\.chanels: unknown key"),
        ("smallnorb_train:\n  test_size: 0\n", r"smallnorb_train\.test_size: must be >= 1"),
        (
            "smallnorb_train:\n  extra_datasets: [multimnist]\n",
            r"smallnorb_train\.extra_datasets: must be \[\]",
        ),
        (
            "smallnorb_train:\n  baselines: [1]\n",
            r"smallnorb_train\.baselines\[0\]: expected a string, got 1",
        ),
    ],
)
def test_smallnorb_sections_validate_through_capsnet_config(tmp_path, text, message):
    from capsnet import config

    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        config.load(path)


def test_committed_params_hold_both_smallnorb_sections(repo_root):
    from capsnet import config

    params = config.load(repo_root / "params.yaml")
    sweep, final = params.smallnorb_sweep, params.smallnorb_train
    assert sweep.dataset == "smallnorb"
    # both sweeps keep Tune's state beside W&B's runs, outside every DVC output
    assert sweep.storage_path == params.sweep.storage_path == "runs/ray"
    # the default CPU run on the stand-in: 2 and 3 routing iterations (the E-step runs),
    # the other axes at the paper's choice (profiles/paper-scale-gpu.yaml widens them)
    assert sweep.space.routing_iterations == {"grid": [2, 3]}
    assert (sweep.space.pose, sweep.space.coordinate_addition) == ("matrix", True)
    assert (sweep.space.loss, sweep.compile) == ("spread", True)
    assert final.out_dir == "models-smallnorb" and final.baselines == ["smallnorb-cnn"]


def test_the_sweep_stages_keep_their_outputs_and_tune_state_is_none_of_them(repo_root):
    """Tune's state (storage_path) is no output of the sweep stages (DVC would delete it
    before a run, and a finished sweep is restored from it); their git-tracked files are
    metrics and plots kept with ``persist`` (a refused `dvc exp run -S` deletes nothing,
    docs/pipeline.md; DVC's run cache skips such stages, Tune's state stands in for it)."""
    import yaml

    from capsnet import config

    params = config.load(repo_root / "params.yaml")
    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    for name, section in (("sweep", params.sweep), ("sweep_smallnorb", params.smallnorb_sweep)):
        stage = stages[name]
        entries = [e for kind in ("outs", "metrics", "plots") for e in stage.get(kind, [])]
        settings = {next(iter(e)): e[next(iter(e))] for e in entries if isinstance(e, dict)}
        storage = Path(section.storage_path)
        for path in [next(iter(e)) if isinstance(e, dict) else e for e in entries]:
            assert storage != Path(path) and storage not in Path(path).parents, path
            assert Path(path) not in storage.parents, path
            assert settings.get(path, {}).get("persist") is True, path
        plain = [next(iter(e)) if isinstance(e, dict) else e for e in stage.get("outs", [])]
        assert all(settings.get(path, {}).get("cache", True) for path in plain), name


def test_the_trainable_s_key_tables_are_the_search_space_s():
    """Every searchable key lands in one table with SearchSpace's value type."""
    from capsnet.config import SEARCHABLE_TYPES
    from pipeline.sweep import trainable

    tables = {**trainable.TRAIN_KEYS, **trainable.MODEL_KEYS}
    assert set(tables) | {"model", "augment"} == set(SEARCHABLE_TYPES)
    assert not set(trainable.TRAIN_KEYS) & set(trainable.MODEL_KEYS)
    assert trainable.TRAIN_KEYS["loss"] is str and trainable.TRAIN_KEYS["lr"] is float
    assert trainable.MODEL_KEYS["routing_iterations"] is int
