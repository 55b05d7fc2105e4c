"""Training: one ``fit`` for the CLI, the DVC stages and the Ray Tune trainable."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from capsnet import losses
from capsnet.config.training import TrainConfig
from capsnet.data.augment import random_shift
from capsnet.errors import ConfigError
from capsnet.evaluate import accuracy


def select_device(name: str = "auto") -> torch.device:
    """cuda, then mps, then cpu for "auto"; otherwise the named device, checked by running
    one small tensor operation on it (a ConfigError naming --device when it cannot run)."""
    if name == "auto":
        if torch.cuda.is_available():
            device = torch.device("cuda")
        elif getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            device = torch.device("mps")
        else:
            return torch.device("cpu")
    else:
        device = _named_device(name)
    try:
        probe = torch.ones(2, device=device)  # (2,)
        float((probe + probe).sum().cpu())
    except (RuntimeError, AssertionError, NotImplementedError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"--device {name}: torch cannot run on {device} ({first}); choose auto or cpu"
        ) from None
    return device


def _named_device(name: str) -> torch.device:
    """``torch.device(name)`` for a device type this torch has and this machine offers."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(
            f"--device {name!r} is not a torch device (auto, cpu, cuda, mps)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {name}: CUDA is not available on this machine")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(
            f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"--device {name}: MPS is not available on this machine")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"--device {name}: training runs on cpu, cuda or mps")
    return device


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
    """What a resumed run needs besides the model weights."""

    epoch: int = 0
    step: int = 0
    history: list[dict] = field(default_factory=list)
    optimizer: dict | None = None
    scheduler: dict | None = None
    rng: torch.Tensor | None = None


def _seed_everything(seed: int) -> None:
    torch.manual_seed(seed)


def _tensor_batches(dataset: Dataset, config: TrainConfig, device, generator):
    """Shuffled (images float (B, C, H, W), targets) from an in-memory dataset, on ``device``."""
    images, targets = dataset.tensors
    images, targets = images.to(device), targets.to(device)
    order = torch.randperm(images.shape[0], generator=generator, device=generator.device)
    order = order.to(device)
    for start in range(0, images.shape[0], config.batch_size):
        index = order[start : start + config.batch_size]
        yield images[index].float().div_(255.0), targets[index]


def _loader_batches(dataset: Dataset, config: TrainConfig, generator, epoch: int):
    loader = DataLoader(
        dataset,
        batch_size=config.batch_size,
        shuffle=True,
        generator=generator,
        num_workers=config.num_workers,
        worker_init_fn=getattr(dataset, "worker_init_fn", None),
        persistent_workers=False,
    )
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)
    yield from loader


def _optimiser(model: nn.Module, config: TrainConfig, state: TrainState):
    """Adam with the exponential step decay of the official code, restored from ``state``."""
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: config.lr_decay ** (step / config.lr_decay_steps)
    )
    if state.optimizer is not None:
        optimizer.load_state_dict(state.optimizer)
    if state.scheduler is not None:
        scheduler.load_state_dict(state.scheduler)
    return optimizer, scheduler


def _component_batch(images, parts, config: TrainConfig, device, generator):
    """(images, components (B, n, C, H, W), labels (B, n)) on ``device`` of a batch whose
    items carry each digit alone and its label; a batch shift moves the digits with their
    merge (one offset per example)."""
    components, labels = (p.to(device, non_blocking=True) for p in parts)
    if config.shift_pixels:
        batch, n, channels, height, width = components.shape
        stacked = torch.cat([images, components.flatten(1, 2)], 1)  # (B, C + n*C, H, W)
        stacked = random_shift(stacked, config.shift_pixels, generator)  # (B, C + n*C, H, W)
        images = stacked[:, :channels]  # (B, C, H, W)
        components = stacked[:, channels:].view(batch, n, channels, height, width)
    return images, components, labels


def _train_epoch(model, train_data, config, device, generator, state, optimizer, scheduler):
    """One pass over ``train_data``; returns (images seen, summed loss, correct count)."""
    from tqdm.auto import tqdm

    use_amp = device.type == "cuda" and config.amp in ("auto", "bf16")
    steps_per_epoch = math.ceil(len(train_data) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    batches = (
        _tensor_batches(train_data, config, device, generator)
        if hasattr(train_data, "tensors")
        else _loader_batches(train_data, config, generator, state.epoch)
    )
    bar = tqdm(
        batches,
        total=steps_per_epoch,
        desc=f"epoch {state.epoch + 1}/{config.epochs}",
        disable=None if config.progress is None else not config.progress,
        leave=False,
        unit="batch",
    )
    for images, targets, *parts in bar:
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        components, mask = None, (targets if targets.dim() == 1 else None)
        if parts:
            images, components, mask = _component_batch(images, parts, config, device, generator)
        elif config.shift_pixels:
            images = random_shift(images, config.shift_pixels, generator)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            output = model(images, mask)
            loss = compute_loss(
                model, output, images, targets, config, state.step, total_steps, components
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        state.step += 1
        seen += images.shape[0]
        loss_sum += loss.detach() * images.shape[0]
        if targets.dim() == 1:
            correct += (output.scores.detach().argmax(1) == targets).sum()
    bar.close()
    return seen, loss_sum.item(), correct.item()


def fit(
    model: nn.Module,
    train_data: Dataset,
    val_data: Dataset | None = None,
    config: TrainConfig | None = None,
    on_epoch: Callable[[dict, TrainState], None] | None = None,
    resume: TrainState | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[dict]:
    """Train ``model`` on ``train_data`` and return the per-epoch history.

    Each epoch's record holds epoch, train_loss, train_accuracy, val_accuracy (when
    ``val_data`` is given), lr, seconds and images_per_second; ``on_epoch(record, state)``
    is called after each epoch (Ray Tune reports and checkpoints there). ``resume`` continues
    a run from a saved TrainState (weights already loaded into ``model``). ``clock``
    (seconds) measures ``config.time_budget``.
    """
    config = config or TrainConfig()
    device = select_device(config.device)
    _seed_everything(config.seed)
    model.to(device)
    if config.compile and hasattr(model, "compile_routing"):
        model.compile_routing()
    state = resume or TrainState()
    optimizer, scheduler = _optimiser(model, config, state)
    generator = torch.Generator(device="cpu")
    generator.manual_seed(config.seed)
    if state.rng is not None:
        generator.set_state(state.rng)

    fit_started = clock()
    while state.epoch < config.epochs:
        model.train()
        epoch_clock = clock()
        started = time.perf_counter()
        seen, loss_sum, correct = _train_epoch(
            model, train_data, config, device, generator, state, optimizer, scheduler
        )
        seconds = time.perf_counter() - started
        record = {
            "epoch": state.epoch + 1,
            "train_loss": loss_sum / max(1, seen),
            "train_accuracy": correct / max(1, seen),
            "lr": scheduler.get_last_lr()[0],
            "seconds": seconds,
            "images_per_second": seen / seconds if seconds > 0 else float("nan"),
        }
        if val_data is not None and len(val_data):
            scored = accuracy(model, val_data, config.eval_batch_size, device)
            record["val_accuracy"] = scored["accuracy"]
        state.epoch += 1
        state.history.append(record)
        state.optimizer = optimizer.state_dict()
        state.scheduler = scheduler.state_dict()
        state.rng = generator.get_state()
        if on_epoch is not None:
            on_epoch(record, state)
        if _budget_spent(config.time_budget, fit_started, epoch_clock, clock()):
            break
    return state.history


def _budget_spent(budget: float | None, fit_started: float, epoch_started: float,
                  now: float | None = None) -> bool:  # fmt: skip
    """Whether a run with a ``budget`` (seconds of its clock; ``now`` default: the wall
    clock) stops now: another epoch as long as the last would end further from the budget
    than stopping here."""
    if budget is None:
        return False
    now = time.perf_counter() if now is None else now
    return now - fit_started + (now - epoch_started) / 2 >= budget
