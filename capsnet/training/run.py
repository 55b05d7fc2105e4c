"""The one training recipe: a ``RunSpec`` in, a trained model and its history out.

``capsnet train``, a Ray Tune trial, the final training of the pipeline and the smallNORB
viewpoints experiment differ only in where their RunSpec comes from and where the results
go; all of them train through ``train_run`` (the only caller of ``fit``). The data shape
(channels, image size, classes) comes from the data, never from the caller.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from capsnet.config import (
    DATA_ROOT,
    AugmentParams,
    DataParams,
    FinalTrainConfig,
    Params,
    SweepConfig,
    dataset_specs,
)
from capsnet.data.registry import resolve
from capsnet.io.errors import ConfigError, DataError
from capsnet.training.fit import TrainConfig, TrainState, compile_record, fit


@dataclass
class RunSpec:
    """Everything one training run reads: model, data, augmentation and training settings.

    ``train.seed`` seeds the weights, the batch order and the augmentation draws;
    ``train.device`` picks the device. ``overrides`` are model config fields other than the
    shape fields, which follow the data. ``data_params`` is params.yaml's whole ``data``
    section; the dataset reads its own part of it (``settings``).
    """

    model: str
    train: TrainConfig = field(default_factory=TrainConfig)
    overrides: dict[str, Any] = field(default_factory=dict)
    dataset: str = SweepConfig.dataset
    subset: str = "all"  # smallnorb viewpoint subset (capsnet.data.smallnorb.SUBSETS)
    channels: int = 2  # smallnorb: 1 (left image) or 2 (stereo pair)
    train_size: int | None = None  # the first N training items left after validation
    val_size: int = FinalTrainConfig.val_size  # held out from the end of the training set (0: none)
    augment: str = "none"  # capsnet.data.augment.STRATEGIES
    augment_params: AugmentParams = field(default_factory=AugmentParams)
    data_params: DataParams = field(default_factory=DataParams)
    data_root: str | Path = DATA_ROOT
    mirror: str | None = None

    def __post_init__(self):
        if self.dataset not in dataset_specs.TRAIN_DATASETS:
            raise ConfigError(
                f"dataset {self.dataset!r} cannot be trained on; choose one of "
                f"{', '.join(dataset_specs.TRAIN_DATASETS)}"
            )
        if self.subset != "all" and not self.data.subsets:
            having = [s.name for s in dataset_specs.REGISTRY.values() if s.subsets]
            raise ConfigError(
                f"subset {self.subset!r}: only {', '.join(having)} has viewpoint subsets"
            )
        if self.channels not in (1, 2):
            raise ConfigError(f"channels must be 1 or 2, got {self.channels}")
        if self.val_size < 0:
            raise ConfigError(f"val_size must be >= 0, got {self.val_size}")
        if self.train_size is not None and self.train_size < 1:
            raise ConfigError(f"train_size must be >= 1 or null, got {self.train_size}")

    @property
    def data(self) -> dataset_specs.DatasetSpec:
        """The registry's declaration of this run's dataset."""
        return dataset_specs.get(self.dataset)

    def settings(self) -> Any:
        """The dataset's own settings: ``data.<its section>`` of ``data_params``."""
        return self.data.settings(self.data_params)

    def data_record(self) -> dict[str, Any]:
        """What a checkpoint of this run records of its data preprocessing (the dataset's
        ``data_record`` hook on its settings; {} without one), checked by the evaluation
        (``capsnet.evaluation.datasets.check_preprocessing``)."""
        hook = self.data.data_record
        return {} if hook is None else resolve(hook)(self.settings())


def section_spec(
    section, sweep, params: Params | None = None, data_root=DATA_ROOT, mirror=None, **train
) -> RunSpec:
    """The RunSpec a params section starts its runs from (a sweep's trials or the final
    training; they set the model, augmentation and searched settings): ``section``'s
    epochs, batch size, seed, compile, amp and sizes on ``sweep``'s dataset and channels, with
    params.yaml's augmentation and data settings; ``train``: more TrainConfig fields."""
    params = params or Params()
    if section.amp is not None:
        train = {"amp": section.amp, **train}
    return RunSpec(
        model="",
        train=TrainConfig(
            epochs=section.epochs, batch_size=section.batch_size, seed=section.seed,
            compile=section.compile, **train,
        ),
        dataset=sweep.dataset,
        channels=sweep.channels,
        train_size=section.train_size,
        val_size=section.val_size,
        augment_params=params.augment,
        data_params=params.data,
        data_root=data_root,
        mirror=mirror,
    )  # fmt: skip


@dataclass
class Split:
    """A run's data before augmentation: training items and the held-out validation items."""

    train: Dataset
    val: Dataset | None


@dataclass
class RunResult:
    """A trained model (on the CPU unless ``train_run`` was told otherwise) with its
    per-epoch history, its wall-clock training time and its time by the run's
    ``budget_clock`` (what an equal-time budget is spent in)."""

    model: nn.Module
    history: list[dict]
    train_seconds: float
    train_config: TrainConfig
    train_images: int
    clock_seconds: float = 0.0
    clock: str = "process-cpu"
    data: dict[str, Any] = field(default_factory=dict)  # RunSpec.data_record()
    compile: dict[str, Any] = field(default_factory=dict)  # fit.compile_record: what ran


class CudaEventClock:
    """Seconds on the GPU since this clock was made: the time between CUDA events on the
    device's current stream (each reading waits for the queued work to finish)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.origin = torch.cuda.Event(enable_timing=True)
        self.origin.record(torch.cuda.current_stream(device))

    def __call__(self) -> float:
        mark = torch.cuda.Event(enable_timing=True)
        mark.record(torch.cuda.current_stream(self.device))
        mark.synchronize()
        return self.origin.elapsed_time(mark) / 1000.0


def budget_clock(device: torch.device) -> tuple[str, Callable[[], float]]:
    """(name, clock) that times a run for an equal-time budget, so that other load on the
    machine moves neither the budget nor the epochs it buys: on CUDA the GPU time between
    CUDA events ("cuda-events"); elsewhere this process's CPU time, every thread summed
    ("process-cpu", ``time.process_time``: a core another job takes is not counted)."""
    if device.type == "cuda":
        return "cuda-events", CudaEventClock(device)
    return "process-cpu", time.process_time


def step_clock(device: torch.device) -> Callable[[], float]:
    """The clock one training step's cost is read by: the calling thread's CPU time on a CPU
    (``paired_step_costs`` trains on that one thread, so a core another job holds neither
    counts nor makes threads spin), the GPU time between CUDA events on CUDA, else the wall
    clock."""
    if device.type == "cuda":
        return CudaEventClock(device)
    return time.thread_time if device.type == "cpu" else time.perf_counter


def step_costs(specs: list[RunSpec], split: Split) -> list[float]:
    """Seconds of one training step of each spec's model on ``split``'s training items, with
    its augmentation and batch size, all measured here, steps of the models taken back to
    back (``capsnet.training.fit.paired_step_costs``: the first spec's median step, the
    others' from the median ratio of their steps to it)."""
    from capsnet.data.datasets import shape_of
    from capsnet.training.fit import paired_step_costs

    shape = shape_of(split.train)
    runs = [(build_model(spec, shape), split.train, _fit_config(spec)) for spec in specs]
    return paired_step_costs(runs, step_clock)


def training_steps(spec: RunSpec, train_items: int, epochs: int | None = None) -> int:
    """The optimisation steps of ``epochs`` (default ``spec.train.epochs``) epochs of
    ``train_items`` items in ``spec``'s batches (the last partial batch counted)."""
    epochs = spec.train.epochs if epochs is None else epochs
    return epochs * math.ceil(train_items / spec.train.batch_size)


def equal_time_epochs(reference: RunSpec, baseline: RunSpec, costs: tuple[float, float],
                      train_items: int) -> int:  # fmt: skip
    """The epochs ``baseline`` trains for the training time of ``reference``'s
    ``reference.train.epochs`` epochs of ``train_items`` items, counted in steps of their
    costs ``costs`` = (reference's, baseline's) seconds per step (``step_costs``): the
    nearest whole number, at least 1."""
    reference_seconds = training_steps(reference, train_items) * costs[0]
    per_epoch = training_steps(baseline, train_items, epochs=1)
    return max(1, round(reference_seconds / (costs[1] * per_epoch)))


def load_split(spec: RunSpec, progress: bool = False, model_config: Any = None) -> Split:
    """The training and validation items of ``spec``: the dataset's ``split`` hook, or
    validation the last ``val_size`` training items and training the first ``train_size``
    of the rest. ``model_config``: the run's (``check``), when the caller has it."""
    from capsnet.data.datasets import load, split_tail

    if spec.data.split is not None:
        return Split(*resolve(spec.data.split)(spec))
    options = {"components": True} if reconstructs_digits(spec, model_config) else {}
    full = load(
        spec.dataset, "train", spec.data_root, mirror=spec.mirror, progress=progress,
        data=spec.data_params, **options,
    )  # fmt: skip
    if spec.val_size >= len(full):
        raise ConfigError(f"val_size {spec.val_size} >= {len(full)} {spec.dataset} images")
    train, val = split_tail(full, spec.val_size, spec.train_size)
    return Split(train, val)


def reconstructs_digits(spec: RunSpec, model_config: Any = None) -> bool:
    """Whether ``spec`` trains a decoder on a multi-label dataset (MultiMNIST): then each digit
    is reconstructed from its own true-label capsule against its own image (paper section 6)."""
    if not spec.data.multi_label:
        return False
    return bool(getattr(model_config or check(spec), "decoder", False))


def load_test(spec: RunSpec, limit: int | None = None, subset: str | None = None) -> Dataset:
    """The first ``limit`` test items of ``spec``'s dataset (its ``test_set`` hook, such as
    smallNORB's centre crops; ``subset`` picks another viewpoint subset than the run's)."""
    from capsnet.data.datasets import Slice, load

    if spec.data.test_set is not None:
        test = resolve(spec.data.test_set)(spec, subset)
    else:
        test = load(spec.dataset, "test", spec.data_root, mirror=spec.mirror, data=spec.data_params)
    if limit is None or limit >= len(test):
        return test
    return test.subset(limit) if hasattr(test, "subset") else Slice(test, 0, limit)


def build_model(spec: RunSpec, shape, model_config: Any = None) -> nn.Module:
    """``spec.model`` for data of ``shape``, seeded by ``spec.train.seed``, from the run's
    model config (``check``; built here when not given)."""
    from capsnet import models

    torch.manual_seed(spec.train.seed)
    config = models.with_shape(spec.model, model_config or check(spec), shape)
    return models.from_config(spec.model, config)


def check(spec: RunSpec) -> Any:
    """Fail before any data is read on an unknown model, override or augmentation; return
    the run's model config (without the data's shape: ``build_model`` adds it)."""
    from capsnet import models
    from capsnet.data.augment import check_strategy

    model_config = models.make_config(spec.model, **spec.overrides)
    models.check_shape_overrides(spec.model, spec.overrides)
    check_strategy(spec.augment)
    if spec.data.self_augmenting and spec.augment != "none":
        raise ConfigError(
            f"augment {spec.augment!r}: {spec.dataset} augments itself (random crops, "
            f"brightness and contrast: data.{spec.data.section}); use none"
        )
    return model_config


def _fit_config(spec: RunSpec) -> TrainConfig:
    """The TrainConfig ``fit`` reads for ``spec``: its training settings and augmentation."""
    return dataclasses.replace(spec.train, augment=spec.augment, augment_params=spec.augment_params)


OnEpoch = Callable[[dict, TrainState, nn.Module], None]
#: ``on_check(epoch, model)`` within an epoch (``fit``'s ``on_check``, with the model).
OnCheck = Callable[[float, nn.Module], None]


def train_run(
    spec: RunSpec,
    split: Split | None = None,
    *,
    on_epoch: OnEpoch | None = None,
    resume: tuple[dict[str, torch.Tensor], TrainState] | None = None,
    progress: bool = False,
    to_cpu: bool = True,
    checks_per_epoch: int = 1,
    on_check: OnCheck | None = None,
) -> RunResult:
    """Load the data (unless ``split`` is given), build the model, fit it; return the
    model and its history. ``on_epoch(record, state, model)`` runs after every epoch;
    ``resume`` is (model weights, TrainState) of an interrupted run. The model is moved
    to the CPU unless ``to_cpu`` is false (a caller that scores it first, on the device).
    ``on_check(epoch, model)`` runs ``checks_per_epoch - 1`` times within every epoch."""
    from capsnet.data.datasets import shape_of
    from capsnet.training.device import select_device

    model_config = check(spec)
    split = split if split is not None else load_split(spec, progress, model_config)
    if len(split.train) == 0:
        raise DataError(f"{spec.dataset}: no training items left")
    config = _fit_config(spec)
    model = build_model(spec, shape_of(split.train), model_config)
    state = None
    if resume is not None:
        weights, state = resume
        model.load_state_dict(weights)

    def report(record: dict, train_state: TrainState) -> None:
        if on_epoch is not None:
            on_epoch(record, train_state, model)

    clock_name, clock = budget_clock(select_device(config.device))
    started, clock_started = time.perf_counter(), clock()
    history = fit(
        model, split.train, split.val, config, on_epoch=report, resume=state, clock=clock,
        checks_per_epoch=checks_per_epoch,
        on_check=None if on_check is None else (lambda epoch: on_check(epoch, model)),
    )  # fmt: skip
    seconds, clock_seconds = time.perf_counter() - started, clock() - clock_started
    return RunResult(
        model.cpu() if to_cpu else model, history, seconds, config, len(split.train),
        clock_seconds, clock_name, spec.data_record(), compile_record(model, config),
    )  # fmt: skip
