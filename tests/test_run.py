"""The one run recipe: data shape from the data, augmentation by name, resume, early errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from capsnet import models
from capsnet.config import AugmentParams, ShiftAugment
from capsnet.data.datasets import TensorImageDataset, shape_of
from capsnet.io.errors import ConfigError
from capsnet.training.fit import TrainConfig
from capsnet.training.run import RunSpec, Split, check, load_split, train_run


def tiny_split(n: int = 64, size: int = 28, classes: int = 10) -> Split:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 1, size, size), dtype=torch.uint8, generator=generator)
    labels = torch.arange(n) % classes
    train = TensorImageDataset(images[: n - 16], labels[: n - 16], "tiny", classes)
    return Split(train, TensorImageDataset(images[n - 16 :], labels[n - 16 :], "tiny-val", classes))


def spec(**changes) -> RunSpec:
    train = TrainConfig(epochs=1, batch_size=16, device="cpu", progress=False)
    return dataclasses.replace(RunSpec(model="lenet5", train=train), **changes)


def test_model_shape_follows_the_data_not_the_caller():
    result = train_run(spec(), tiny_split(size=40, classes=5))
    config = result.model.config
    assert (config.in_channels, config.input_size, config.num_classes) == (1, 40, 5)
    assert result.model(torch.zeros(2, 1, 40, 40)).scores.shape == (2, 5)


def test_shape_fields_may_not_be_overridden():
    with pytest.raises(ConfigError, match="input_size follow"):
        train_run(spec(overrides={"input_size": 32}), tiny_split())


def test_a_run_builds_its_model_config_once(monkeypatch):
    """check, the data loader and the model all use the one config ``check`` built."""
    built = []
    make_config = models.make_config
    monkeypatch.setattr(
        models, "make_config", lambda *a, **k: built.append(a) or make_config(*a, **k)
    )
    result = train_run(spec(), tiny_split(size=40))
    assert len(built) == 1
    assert result.model.config.input_size == 40


def test_the_strategy_and_its_params_reach_the_training_config():
    split = tiny_split()
    params = AugmentParams(shift=ShiftAugment(pixels=3))
    result = train_run(spec(augment="shift", augment_params=params), split)
    assert result.train_config.augment == "shift"
    assert result.train_config.augment_params.shift.pixels == 3
    assert train_run(spec(augment="none"), split).train_config.augment == "none"


@pytest.mark.parametrize("strategy", ["rotate", "affine", "elastic"])
def test_every_strategy_trains_on_the_unwrapped_training_set(strategy):
    split = tiny_split()
    result = train_run(spec(augment=strategy), split)
    assert result.train_config.augment == strategy and result.train_images == len(split.train)
    assert shape_of(split.train) == (1, 28, 10)


def test_same_spec_same_weights_and_history():
    split = tiny_split()
    first, second = train_run(spec(), split), train_run(spec(), split)
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(a, b)
    assert [r["train_loss"] for r in first.history] == [r["train_loss"] for r in second.history]
    other = train_run(spec(train=dataclasses.replace(spec().train, seed=1)), split)
    assert not torch.equal(
        next(iter(other.model.state_dict().values())),
        next(iter(first.model.state_dict().values())),
    )


def test_resume_continues_from_the_saved_epoch():
    split = tiny_split()
    saved = {}

    def keep(record, state, model):
        saved["weights"] = {k: v.clone() for k, v in model.state_dict().items()}
        saved["state"] = dataclasses.replace(state, history=list(state.history))

    two = dataclasses.replace(spec().train, epochs=2)
    train_run(spec(), split, on_epoch=keep)  # one epoch
    resumed = train_run(spec(train=two), split, resume=(saved["weights"], saved["state"]))
    straight = train_run(spec(train=two), split)
    assert [r["epoch"] for r in resumed.history] == [1, 2]
    assert resumed.history[1]["train_loss"] == pytest.approx(straight.history[1]["train_loss"])


def test_bad_names_fail_before_any_data_is_read(tmp_path):
    with pytest.raises(ConfigError, match="unknown model 'lenet6'"):
        check(spec(model="lenet6"))
    with pytest.raises(ConfigError, match=r"augment\.strategy 'blur' unknown"):
        check(spec(augment="blur"))
    with pytest.raises(ConfigError, match="smallnorb augments itself"):
        check(spec(dataset="smallnorb", augment="shift"))
    with pytest.raises(ConfigError, match="no config field"):
        check(spec(overrides={"routing_iterations": 2}))  # lenet5 has no routing
    with pytest.raises(ConfigError, match="only smallnorb has viewpoint subsets"):
        spec(subset="azimuth-familiar")


def test_load_split_holds_out_the_tail(mnist_root):
    split = load_split(spec(data_root=mnist_root, train_size=100, val_size=50))
    images, _ = split.train.tensors
    val_images, _ = split.val.tensors
    assert images.shape == (100, 1, 28, 28) and val_images.shape == (50, 1, 28, 28)
    assert shape_of(split.train) == models.Shape(1, 28, 10)
    with pytest.raises(ConfigError, match="val_size 60000 >= 60000"):
        load_split(spec(data_root=mnist_root, val_size=60000))
