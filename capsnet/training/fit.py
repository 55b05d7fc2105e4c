"""Training: one ``fit`` for the CLI, the DVC stages and the Ray Tune trainable."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from capsnet.config.training import TrainConfig
from capsnet.data.augment import augment_batch
from capsnet.data.batches import as_renderable, to_device
from capsnet.io.errors import ConfigError, TrainingDiverged
from capsnet.nn import losses
from capsnet.training.device import autocast, configure_backends, mark_step, select_device
from capsnet.training.scoring import accuracy


def spread_margin(config: TrainConfig, step: int, total_steps: int) -> float:
    """Spread-loss margin at ``step``: linear from start to end over training, or the
    official EM code's sigmoid schedule (0.2 + 0.79 * sigmoid(min(10, step / 50000 - 4)))."""
    start, end = config.spread_margin
    if config.spread_schedule == "sigmoid":
        return start + 0.79 * (1.0 / (1.0 + math.exp(-min(10.0, step / 50000.0 - 4.0))))
    frac = min(1.0, step / max(1, total_steps - 1))
    return start + (end - start) * frac


def compute_loss(
    model: nn.Module,
    output,
    images: torch.Tensor,
    targets: torch.Tensor,
    config: TrainConfig,
    step: int = 0,
    total_steps: int = 1,
    components: torch.Tensor | None = None,
) -> torch.Tensor:
    """The training loss of ``output`` for ``targets`` under ``config.loss``.

    The reconstruction is compared with ``images``, or with ``components`` (B, n, C, H, W),
    each digit of a MultiMNIST image alone, when the model was masked by the n true labels
    (paper section 6: one reconstruction per digit, their squared errors summed)."""
    kind = config.loss if config.loss != "auto" else getattr(model, "default_loss", "cross-entropy")
    if kind == "margin":
        loss = losses.margin_loss(output.scores, targets, config.m_plus, config.m_minus, config.lam)
        if output.reconstruction is not None and config.recon_weight > 0:
            truth = images if components is None else components  # (B, [n,] C, H, W)
            loss = loss + losses.reconstruction_loss(
                output.reconstruction, truth, config.recon_weight
            )
        return loss
    if kind == "cross-entropy":
        return losses.cross_entropy(output.scores, targets)
    if kind == "spread":
        margin = spread_margin(config, step, total_steps)
        return losses.spread_loss(output.scores, targets, margin)
    raise ConfigError(f"train.loss {kind!r} unknown")


@dataclass
class TrainState:
    """What a resumed run needs besides the model weights: ``rng`` is the state of the
    CPU generator (shuffling of DataLoader sets; everything on a CPU run), ``device_rng``
    that of the training device's generator on an accelerator (shuffling, rendering and
    augmentation of resident sets, augmentation of every batch)."""

    epoch: int = 0
    step: int = 0
    history: list[dict] = field(default_factory=list)
    optimizer: dict | None = None
    scheduler: dict | None = None
    rng: torch.Tensor | None = None
    device_rng: torch.Tensor | None = None


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)


def _optimiser(model: nn.Module, config: TrainConfig, state: TrainState):
    """Adam with the exponential step decay of the official code, restored from ``state``;
    the fused CUDA kernel when every parameter is a CUDA float tensor."""
    params = list(model.parameters())
    fused = all(p.is_cuda and p.is_floating_point() for p in params) and bool(params)
    optimizer = torch.optim.Adam(
        params, lr=config.lr, weight_decay=config.weight_decay, fused=fused or None
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: config.lr_decay ** (step / config.lr_decay_steps)
    )
    if state.optimizer is not None:
        optimizer.load_state_dict(state.optimizer)
    if state.scheduler is not None:
        scheduler.load_state_dict(state.scheduler)
    return optimizer, scheduler


def train_step(
    model: nn.Module,
    batch: tuple,
    optimizer: torch.optim.Optimizer,
    scheduler,
    config: TrainConfig,
    step: int = 0,
    total_steps: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimisation step on ``batch`` = (images (B, C, H, W), targets[, components
    (B, n, C, H, W), labels (B, n)]), already on the model's device and augmented.

    Returns (the batch's summed loss, its correct count) as device scalars: nothing here
    reads a value back to the host, so steps queue without a sync."""
    images, targets, *parts = batch
    components, mask = parts if parts else (None, targets if targets.dim() == 1 else None)
    mark_step(images.device)  # a compiled model's new step
    with autocast(images.device, config.amp):
        output = model(images, mask)
        loss = compute_loss(model, output, images, targets, config, step, total_steps, components)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    scheduler.step()
    if targets.dim() == 1:
        correct = (output.scores.detach().argmax(1) == targets).sum()
    else:
        correct = torch.zeros((), dtype=torch.long, device=images.device)
    return loss.detach().float() * images.shape[0], correct


def augment(batch: tuple, config: TrainConfig, generator: torch.Generator) -> tuple:
    """``config.augment`` applied to a batch on its device; a batch that carries each digit
    alone (MultiMNIST) moves the digits with their merge (one draw per example)."""
    images, targets, *parts = batch
    if config.augment == "none":
        return batch
    if not parts:
        return (augment_batch(images, config.augment, config.augment_params, generator), targets)
    components, labels = parts
    batch_size, n, channels, height, width = components.shape
    stacked = torch.cat([images, components.flatten(1, 2)], 1)  # (B, C + n*C, H, W)
    stacked = augment_batch(stacked, config.augment, config.augment_params, generator)
    images = stacked[:, :channels]  # (B, C, H, W)
    components = stacked[:, channels:].reshape(batch_size, n, channels, height, width)
    return images, targets, components, labels


class _Batches:
    """The batches of one training set for ``fit``: rendered on the device from tensors
    moved there once (``DeviceRenderable``), or from a DataLoader and moved per batch."""

    def __init__(self, dataset: Dataset, config: TrainConfig, device, drop_last: bool):
        self.dataset, self.config, self.device = dataset, config, device
        self.source = as_renderable(dataset)
        self.tensors = (
            to_device(self.source.resident_tensors(), device) if self.source is not None else None
        )
        self.drop_last = drop_last and len(dataset) >= config.batch_size

    def __len__(self) -> int:
        n, size = len(self.dataset), self.config.batch_size
        return n // size if self.drop_last else math.ceil(n / size)

    def epoch(self, epoch: int, generator: torch.Generator, cpu_generator: torch.Generator):
        """Shuffled batches of ``epoch`` on the device, not yet augmented."""
        size = self.config.batch_size
        if self.source is not None:
            n = len(self.source)
            order = torch.randperm(n, generator=generator, device=self.device)  # (N,)
            for start in range(0, len(self) * size, size):
                index = order[start : start + size]  # (B,)
                yield self.source.render_batch(self.tensors, index, epoch, generator)
            return
        loader = DataLoader(
            self.dataset,
            batch_size=size,
            shuffle=True,
            generator=cpu_generator,
            num_workers=self.config.num_workers,
            worker_init_fn=getattr(self.dataset, "worker_init_fn", None),
            persistent_workers=False,
            drop_last=self.drop_last,
            pin_memory=self.device.type == "cuda",
        )
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        for batch in loader:
            yield tuple(torch.as_tensor(t).to(self.device, non_blocking=True) for t in batch)


def _prepare(model: nn.Module, data: Dataset, config: TrainConfig, state: TrainState):
    """(batches, generators, optimiser, scheduler) of a run of ``model`` on ``data``, the
    model moved to the run's device (and compiled where ``config.compile`` asks)."""
    device = select_device(config.device)
    configure_backends(device)
    _seed_everything(config.seed)
    model.to(device)
    compiled = compiles(model, config)
    if compiled:
        model.compile_routing()
    optimizer, scheduler = _optimiser(model, config, state)
    generators = _generators(config, device, state)
    # a compiled model trains on one batch shape (no recompile for an epoch's partial last
    # batch; CUDA graphs replay one shape): a compiled run drops that batch
    batches = _Batches(data, config, device, drop_last=compiled)
    return batches, generators, optimizer, scheduler


#: Timed rounds (one step of each model after one untimed warm-up round) when step costs are
#: measured: enough that the median ratio moves little between measurements.
STEP_SAMPLES = 60


def paired_step_costs(
    runs: list[tuple[nn.Module, Dataset, TrainConfig]],
    clock_for: Callable[[torch.device], Callable[[], float]],
    steps: int = STEP_SAMPLES,
) -> list[float]:
    """Seconds of one training step (augmentation, forward, loss, backward, optimiser) of
    each (model, training data, config) in ``runs``, on one batch of its data, in the first
    run's terms: the first run's median step, and each other run's that divided by the
    median of its pair ratios (the first run's step over its own, the two timed back to
    back by a new ``clock_for(device)`` in each of ``steps`` rounds). Load that slows both
    steps of a pair cancels in their ratio, and the median drops the pairs a preemption or
    a burst split. The steps run on one CPU thread."""
    prepared = []
    for model, data, config in runs:
        batches, generators, optimizer, scheduler = _prepare(model, data, config, TrainState())
        batch = next(iter(batches.epoch(0, *generators)))
        model.train()
        prepared.append((model, batch, config, generators[0], optimizer, scheduler, batches.device))
    threads = torch.get_num_threads()
    seconds: list[list[float]] = [[] for _ in prepared]  # [run][round]
    try:
        torch.set_num_threads(1)
        for sample in range(steps + 1):  # round 0 warms up (allocations, kernel choice)
            for i, (model, batch, config, generator, optimizer, scheduler, device) in enumerate(
                prepared
            ):
                clock = clock_for(device)
                started = clock()
                train_step(model, augment(batch, config, generator), optimizer, scheduler, config)
                if sample:
                    seconds[i].append(clock() - started)
    finally:
        torch.set_num_threads(threads)
    first = statistics.median(seconds[0])
    return [first] + [
        first / statistics.median(a / b for a, b in zip(seconds[0], other, strict=True))
        for other in seconds[1:]
    ]


#: ``on_check(epoch)`` within an epoch: ``epoch`` the fraction of training done (1.25: a
#: quarter into the second epoch), the model in training mode again when it returns.
OnCheck = Callable[[float], None]


def check_steps(steps: int, checks_per_epoch: int) -> dict[int, float]:
    """{step within the epoch (1-based): fraction of the epoch} of the ``checks_per_epoch
    - 1`` checks inside an epoch of ``steps`` steps, evenly spaced (the last check is the
    epoch's end, ``on_epoch``); a check that would fall on no step of its own is dropped."""
    checks = {}
    for k in range(1, checks_per_epoch):
        step = round(k * steps / checks_per_epoch)
        if 0 < step < steps and step not in checks:
            checks[step] = k / checks_per_epoch
    return checks


def _train_epoch(
    model,
    batches,
    config,
    generators,
    state,
    optimizer,
    scheduler,
    checks: dict[int, float] | None = None,
    on_check: OnCheck | None = None,
):
    """One pass over ``batches``; returns (images seen, summed loss, correct count, seconds
    in ``on_check``), the two sums still on the device. After the steps of ``checks``
    ({step within the epoch: fraction}) it calls ``on_check(epoch + fraction)``, the global
    CPU generator restored after it, so training draws the same numbers with any checks."""
    from tqdm.auto import tqdm

    generator, cpu_generator = generators
    total_steps = len(batches) * config.epochs
    loss_sum = torch.zeros((), device=batches.device)
    correct = torch.zeros((), device=batches.device, dtype=torch.long)
    seen, checking = 0, 0.0
    bar = tqdm(
        batches.epoch(state.epoch, generator, cpu_generator),
        total=len(batches),
        desc=f"epoch {state.epoch + 1}/{config.epochs}",
        disable=None if config.progress is None else not config.progress,
        leave=False,
        unit="batch",
    )
    for done, batch in enumerate(bar, start=1):
        batch = augment(batch, config, generator)
        batch_loss, batch_correct = train_step(
            model, batch, optimizer, scheduler, config, state.step, total_steps
        )
        state.step += 1
        seen += batch[0].shape[0]
        loss_sum += batch_loss
        correct += batch_correct
        if on_check is not None and done in (checks or {}):
            check_started = time.perf_counter()
            rng = torch.get_rng_state()  # what a check draws (a DataLoader's base seed)
            on_check(state.epoch + checks[done])  # is not taken from dropout's masks
            torch.set_rng_state(rng)
            model.train()
            checking += time.perf_counter() - check_started
    bar.close()
    return seen, loss_sum, correct, checking


def _epoch_totals(model: nn.Module, loss_sum, correct, epoch: int, lr: float):
    """(summed loss, correct count) read back once per epoch; TrainingDiverged (naming the
    epoch and the run's learning rate ``lr``) when the loss or any weight is not finite
    (checked on the device, read with them)."""
    finite = torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()
    totals = torch.stack([loss_sum.float(), correct.float(), finite.float()])  # (3,)
    loss, right, weights_ok = totals.tolist()  # the epoch's one read-back
    if not math.isfinite(loss) or not weights_ok:
        what = (
            f"the training loss is {loss}" if not math.isfinite(loss) else "weights are not finite"
        )
        raise TrainingDiverged(
            f"training diverged in epoch {epoch}: {what} (lr {lr:g}); "
            f"lower the learning rate (train.lr, --lr)"
        )
    return loss, int(right)


def _generators(config: TrainConfig, device: torch.device, state: TrainState):
    """(device generator, CPU generator), both seeded by ``config.seed`` and restored from
    ``state``: one generator on a CPU run."""
    cpu_generator = torch.Generator(device="cpu")
    cpu_generator.manual_seed(config.seed)
    if state.rng is not None:
        cpu_generator.set_state(state.rng)
    if device.type == "cpu":
        return cpu_generator, cpu_generator
    generator = torch.Generator(device=device)
    generator.manual_seed(config.seed)
    if state.device_rng is not None:
        generator.set_state(state.device_rng)
    return generator, cpu_generator


def fit(
    model: nn.Module,
    train_data: Dataset,
    val_data: Dataset | None = None,
    config: TrainConfig | None = None,
    on_epoch: Callable[[dict, TrainState], None] | None = None,
    resume: TrainState | None = None,
    clock: Callable[[], float] = time.perf_counter,
    checks_per_epoch: int = 1,
    on_check: OnCheck | None = None,
) -> list[dict]:
    """Train ``model`` on ``train_data`` and return the per-epoch history.

    Each epoch's record holds epoch, train_loss, train_accuracy, val_accuracy (when
    ``val_data`` is given), lr, seconds and images_per_second, and ``compile_record``'s
    keys for a run that compiles its routing; ``on_epoch(record, state)``
    is called after each epoch (Ray Tune reports and checkpoints there). ``resume`` continues
    a run from a saved TrainState (weights already loaded into ``model``). A training set
    that is ``DeviceRenderable`` (or in memory) lives on the device for the whole run.
    Raises TrainingDiverged (before ``on_epoch``, so nothing is saved) when the loss or
    the weights stop being finite. ``clock`` (seconds) measures ``config.time_budget``.
    ``on_check(epoch)`` is also called ``checks_per_epoch - 1`` times evenly within each
    epoch (``check_steps``), e.g. to measure a model more often than once an epoch.
    """
    config = config or TrainConfig()
    state = resume or TrainState()
    batches, generators, optimizer, scheduler = _prepare(model, train_data, config, state)
    if checks_per_epoch < 1:
        raise ConfigError(f"checks_per_epoch must be at least 1, got {checks_per_epoch}")
    checks = check_steps(len(batches), checks_per_epoch)

    fit_started = clock()
    while state.epoch < config.epochs:
        epoch_clock = clock()
        record = _fit_epoch(
            model, batches, val_data, config, generators, state, optimizer, scheduler,
            checks, on_check,
        )  # fmt: skip
        record |= compile_record(model, config)
        state.epoch += 1
        state.history.append(record)
        state.optimizer = optimizer.state_dict()
        state.scheduler = scheduler.state_dict()
        state.rng = generators[1].get_state()
        state.device_rng = None if batches.device.type == "cpu" else generators[0].get_state()
        if on_epoch is not None:
            on_epoch(record, state)
        if _budget_spent(config.time_budget, fit_started, epoch_clock, clock()):
            break
    return state.history


def compiles(model: nn.Module, config: TrainConfig) -> bool:
    """Whether a run of ``config`` compiles ``model`` (one with ``compile_routing``)."""
    return config.compile and hasattr(model, "compile_routing")


def compile_record(model: nn.Module, config: TrainConfig) -> dict:
    """What ran of ``config.compile``: {} unless it asked to compile a model's routing;
    else {"compiled": whether the routing ran compiled} and, after a fallback to eager,
    {"compile_fallback": the error}."""
    if not compiles(model, config):
        return {}
    fallback = model.compile_fallback()
    return {"compiled": fallback is None} | ({"compile_fallback": fallback} if fallback else {})


def _fit_epoch(model, batches, val_data, config, generators, state, optimizer, scheduler,
               checks=None, on_check: OnCheck | None = None) -> dict:  # fmt: skip
    """Train one epoch (``on_check`` within it, ``_train_epoch``), score ``val_data``; the
    epoch's record (TrainingDiverged when the loss or the weights stop being finite). Its
    ``seconds`` are training alone; time in ``on_check`` is ``check_seconds``, present when
    checks ran."""
    model.train()
    started = time.perf_counter()
    seen, loss_sum, correct, checking = _train_epoch(
        model, batches, config, generators, state, optimizer, scheduler, checks, on_check
    )
    lr = scheduler.get_last_lr()[0]
    loss_total, correct_total = _epoch_totals(model, loss_sum, correct, state.epoch + 1, config.lr)
    seconds = time.perf_counter() - started - checking
    record = {
        "epoch": state.epoch + 1,
        "train_loss": loss_total / max(1, seen),
        "train_accuracy": correct_total / max(1, seen),
        "lr": lr,
        "seconds": seconds,
        "images_per_second": seen / seconds if seconds > 0 else float("nan"),
    }
    if on_check is not None and checks:
        record["check_seconds"] = checking
    if val_data is not None and len(val_data):
        scored = accuracy(model, val_data, config.eval_batch_size, batches.device, config.amp)
        record["val_accuracy"] = scored["accuracy"]
    return record


def _budget_spent(budget: float | None, fit_started: float, epoch_started: float,
                  now: float | None = None) -> bool:  # fmt: skip
    """Whether a run with a ``budget`` (seconds of its clock; ``now`` default: the wall
    clock) stops now: another epoch as long as the last would end further from the budget
    than stopping here."""
    if budget is None:
        return False
    now = time.perf_counter() if now is None else now
    return now - fit_started + (now - epoch_started) / 2 >= budget
