"""The Tune trainable: a RunSpec from the trial's config, trained by ``capsnet.training.run``.

A trial config is the flat dict Tune samples (``model``, ``routing_iterations``, ``m_plus``,
``m_minus``, ``lam``, ``augment``, ``lr``, ``recon_weight`` and the EM ablation axes
``pose``, ``coordinate_addition``, ``loss``, ``weight_decay``, ``detach_inner``,
``routing_scope``).
``run_spec`` lays it over the sweep's base RunSpec; a searched parameter a model does not
have (routing_iterations for lenet5) is ignored by that model's trials. The trial reports
after every epoch (val_accuracy and, for MNIST, the accuracy on the rotated validation
images) with a checkpoint it resumes from after a failure.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from capsnet.config import SEARCHABLE_TYPES
from capsnet.config.training import TrainConfig
from capsnet.training.run import RunSpec, Split

_RUN_FIELDS = {f.name for f in dataclasses.fields(RunSpec)}  # model, augment
_TRAIN_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)} - _RUN_FIELDS
#: Trial-config keys that are fields of TrainConfig -> their value type (SearchSpace's).
TRAIN_KEYS = {k: t for k, t in SEARCHABLE_TYPES.items() if k in _TRAIN_FIELDS}
#: Trial-config keys that are model config fields, applied to models that have them.
MODEL_KEYS = {k: t for k, t in SEARCHABLE_TYPES.items() if k not in _RUN_FIELDS | _TRAIN_FIELDS}
CHECKPOINT_FILE = "trial.pt"


def applies(model: str | None, key: str) -> bool:
    """Whether trial-config ``key`` means something for ``model`` (model config fields
    only for models that have them; training settings always)."""
    if model is None or key not in MODEL_KEYS:
        return True
    from capsnet import models

    return key in models.config_fields(model)


#: Training settings that only the margin loss (and its reconstruction term) reads.
MARGIN_KEYS = ("m_plus", "m_minus", "lam", "recon_weight")


def used_settings(config: dict[str, Any], model: str, loss: str = "auto") -> dict[str, Any]:
    """``config`` (a trial or best.json config) without the settings ``model`` does not
    use: model fields it lacks (routing_iterations for lenet5) and the margin loss's
    settings when it trains with another loss."""
    from capsnet import models

    if loss == "auto":
        loss = getattr(models.spec(model).model_cls, "default_loss", "cross-entropy")
    return {
        key: value
        for key, value in config.items()
        if applies(model, key) and (loss == "margin" or key not in MARGIN_KEYS)
    }


def run_spec(config: dict[str, Any], base: RunSpec) -> RunSpec:
    """``base`` with the model, model fields, augmentation and training settings of a
    trial config (or of best.json's ``config``)."""
    name = config.get("model")
    overrides = {
        key: convert(config[key])
        for key, convert in MODEL_KEYS.items()
        if config.get(key) is not None and applies(name, key)
    }
    values = {
        k: convert(config[k]) for k, convert in TRAIN_KEYS.items() if config.get(k) is not None
    }
    return dataclasses.replace(
        base,
        model=name,
        overrides={**base.overrides, **overrides},
        augment=str(config.get("augment", "none")),
        train=dataclasses.replace(base.train, **values),
    )


def device_label(device: torch.device) -> str:
    """``cpu``, ``mps``, or ``cuda:N <GPU name>`` for a CUDA device."""
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} {torch.cuda.get_device_name(index)}"


def peak_gpu_memory_mb(device: torch.device) -> float | None:
    """Peak GPU memory allocated by this process's tensors since the last reset (MiB),
    None off CUDA."""
    if device.type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)


def trial_state(state, keep_optimizer: bool) -> dict[str, Any]:
    """The TrainState fields a trial checkpoint holds: everything, or without the optimizer
    state (a resumed run then starts Adam afresh from the saved weights)."""
    saved = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    if not keep_optimizer:
        saved["optimizer"] = None
    return saved


def train_trial(
    config: dict[str, Any],
    *,
    base: RunSpec,
    split: Split,
    rotated: Any = None,
    threads: int = 1,
    checkpoint_every: int = 1,
    keep_optimizer: bool = True,
):
    """One trial: ``capsnet.training.run.train_run`` on the sweep's ``split`` (from the object
    store), reporting every epoch to Tune, with a checkpoint every ``checkpoint_every``
    epochs and at the last: the weights, and the optimizer state with ``keep_optimizer``
    (never at the last epoch, which no resumed run continues from)."""
    started = time.perf_counter()
    import ray
    from ray import tune

    from capsnet.training import scoring as evaluate
    from capsnet.training.device import select_device
    from capsnet.training.run import train_run

    torch.set_num_threads(threads)
    spec = run_spec(config, base)
    resume = _restore(tune.get_checkpoint())
    node = ray.get_runtime_context().get_node_id()
    device = select_device(spec.train.device)
    if device.type == "cuda":  # a reused actor's earlier trial does not count
        torch.cuda.reset_peak_memory_stats(device)
    setup_seconds = time.perf_counter() - started

    def report(record: dict, state, model) -> None:
        eval_started = time.perf_counter()
        metrics = {k: record[k] for k in ("epoch", "train_loss", "train_accuracy")}
        metrics["val_accuracy"] = record.get("val_accuracy")
        if rotated is not None:
            batch = spec.train.eval_batch_size
            metrics["val_rotated_accuracy"] = evaluate.accuracy(model, rotated, batch)["accuracy"]
        metrics |= {
            "epoch_seconds": record["seconds"],
            "eval_seconds": time.perf_counter() - eval_started,
            "setup_seconds": setup_seconds,
            "node": node,
            "device": device_label(device),
            "peak_gpu_memory_mb": peak_gpu_memory_mb(device),
            **{k: record[k] for k in ("compiled", "compile_fallback") if k in record},
        }
        epoch, last = record["epoch"], record["epoch"] >= spec.train.epochs
        if epoch % checkpoint_every and not last:
            tune.report(metrics)
            return
        payload = {
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "state": trial_state(state, keep_optimizer and not last),
        }
        with tempfile.TemporaryDirectory() as directory:
            torch.save(payload, Path(directory) / CHECKPOINT_FILE)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))

    train_run(spec, split, on_epoch=report, resume=resume)


def _restore(checkpoint):
    """(model weights, TrainState) of the trial's last checkpoint, or None."""
    from capsnet.training.fit import TrainState

    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        saved = torch.load(Path(directory) / CHECKPOINT_FILE, map_location="cpu", weights_only=True)
    return saved["model"], TrainState(**saved["state"])
