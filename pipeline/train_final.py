"""The ``train`` stage after the sweep: the best sweep config trained for params.yaml
``train.epochs``, and the baselines (lenet5) with the same augmentation.

Each run is the same ``capsnet.train.fit`` a trial calls, converted from the same flat
config (pipeline/trials.py); each writes ``<out_dir>/<model>.pt`` with
``capsnet.checkpoint.save`` (atomic) and logs a W&B run (job_type "train").

For a smallNORB sweep (``smallnorb_sweep`` / ``smallnorb_train``) the runs train on random
crops of the prepared smallNORB training set and are scored on the centre-cropped test set
(``metrics["smallnorb"]``); with smallNORB switched off, ``write_disabled`` marks the
output directory instead.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from capsnet.config import FinalTrainConfig, SweepConfig
from capsnet.errors import ConfigError
from pipeline import tracking, trials

DISABLED_FILE = "DISABLED.txt"


def read_best(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    try:
        best = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found; run the sweep first (capsnet sweep)") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg})") from None
    if isinstance(best, dict) and "disabled" in best:
        raise ConfigError(
            f"{path}: the sweep did not run ({best['disabled']}); rerun it with its data on"
        )
    if not isinstance(best, dict) or not isinstance(best.get("config"), dict):
        raise ConfigError(f"{path}: no 'config' of the best trial")
    return best


def final_runs(best: dict[str, Any], final: FinalTrainConfig) -> list[dict[str, Any]]:
    """The run configs to train: the best one, then each baseline with its augmentation,
    learning rate, margins and weight decay (parameters a baseline lacks are ignored). A
    baseline trains with its own model's default loss (cross-entropy for the CNNs): the
    sweep's loss is a capsule ablation axis."""
    runs = [dict(best["config"])]
    for name in final.baselines:
        if name != best["config"].get("model"):
            run = {**best["config"], "model": name}
            if "loss" in run:
                run["loss"] = "auto"
            runs.append(run)
    return runs


def write_disabled(out_dir, reason: str, metrics_path=None) -> Path:
    """A final-training output directory for a dataset switched off: DISABLED.txt saying
    why and, with ``metrics_path``, metrics ``{"disabled": reason}``; no checkpoint (any
    from an earlier run with the data on is removed, so none looks current)."""
    from capsnet.data.sources import atomic_write_bytes

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.pt"):
        stale.unlink()
    atomic_write_bytes(out / DISABLED_FILE, (reason.rstrip() + "\n").encode())
    if metrics_path is not None:
        text = json.dumps({"disabled": reason}, indent=2) + "\n"
        atomic_write_bytes(Path(metrics_path), text.encode())
    return out


def train_final(
    final: FinalTrainConfig,
    sweep: SweepConfig,
    *,
    best_path: str | os.PathLike = "sweep/best.json",
    data_root: str | os.PathLike | None = None,
    mirror: str | None = None,
    augment_params=None,
    metrics_path: str | os.PathLike | None = None,
    log=print,
    smallnorb=None,
) -> dict[str, dict[str, Any]]:
    """Train every final run; returns {model name: metrics} and writes the checkpoints
    (and, with ``metrics_path``, the metrics as JSON). ``sweep.dataset`` picks the data
    (it must be the dataset of the sweep that wrote ``best_path``); ``smallnorb`` is
    params.yaml ``data.smallnorb`` (crop size, brightness, contrast)."""
    from capsnet import evaluate, models
    from capsnet.data.datasets import TensorImageDataset, rotate_images

    best = read_best(best_path)
    swept = best.get("dataset", "mnist")
    if swept != sweep.dataset:
        raise ConfigError(
            f"{best_path}: the best config of a {swept} sweep, but {sweep.SECTION}.dataset "
            f"is {sweep.dataset}; pass the matching --best or --sweep-section"
        )
    runs = final_runs(best, final)
    for run in runs:  # fail on a bad name before loading data or training anything
        models.spec(run["model"])
        trials.check_augment(run.get("augment", "none"))
    mode = tracking.prepare_environment(sweep.wandb.mode)
    if sweep.dataset == "smallnorb":
        results = _train_smallnorb(runs, final, sweep, best, data_root, smallnorb, mode, log)
        if metrics_path is not None:
            from capsnet.data.sources import atomic_write_bytes

            text = json.dumps(results, indent=2) + "\n"
            atomic_write_bytes(Path(metrics_path), text.encode())
        return results
    train_images, train_labels, val_images, val_labels = trials.split_mnist(
        data_root, trials.default_mirror(mirror), final.train_size, final.val_size
    )
    val_set = TensorImageDataset(val_images, val_labels, "mnist-val") if final.val_size else None
    angle = float(best.get("rotation_angle", sweep.rotation_angle))
    rotated = (
        TensorImageDataset(rotate_images(val_images, angle), val_labels, "mnist-val-rot")
        if final.val_size
        else None
    )
    out_dir = Path(final.out_dir)
    results: dict[str, dict[str, Any]] = {}

    def score_rotated(model, plan):
        if rotated is None:
            return {}
        scored = evaluate.accuracy(model, rotated, plan.train_config.eval_batch_size)
        return {"rotation_angle": angle, "val_rotated_accuracy": scored["accuracy"]}

    for run in runs:
        plan = _plan(run, final)
        train_set = trials.training_set(
            train_images, train_labels, plan.augment, final.seed, augment_params
        )
        results[plan.model_name] = _fit_and_save(
            plan,
            train_set,
            val_set,
            key=plan.model_name,
            path=out_dir / f"{plan.model_name}.pt",
            tracking_settings=(sweep, mode),
            log=log,
            wandb_config={**run, "epochs": final.epochs, "train_images": len(train_set)},
            fields={"augment": plan.augment},
            describe=f", augment {plan.augment}",
            score=score_rotated,
            extra={
                "run_config": run,
                "sweep": best.get("sweep"),
                "sweep_trial": best.get("trial_id"),
                "role": "best" if run is runs[0] else "baseline",
            },
        )
    for dataset in final.extra_datasets:
        results.update(
            _train_on_extra_set(dataset, runs, final, best, data_root, mirror, sweep, mode, log)
        )
    if metrics_path is not None:
        from capsnet.data.sources import atomic_write_bytes

        atomic_write_bytes(Path(metrics_path), (json.dumps(results, indent=2) + "\n").encode())
    return results


def _train_on_extra_set(dataset, runs, final, best, data_root, mirror, sweep, mode, log):
    """Train every final run on ``dataset`` (its own input size) without augmentation;
    write <out_dir>/<model>@<dataset>.pt. Returns {"<model>@<dataset>": metrics}."""
    from capsnet import models
    from capsnet.data.datasets import load, split_tail

    full = load(dataset, "train", data_root, mirror=trials.default_mirror(mirror))
    val_size = min(final.val_size, 1000)
    train_set, val_set = split_tail(full, val_size, final.extra_train_size)
    sample, _ = full[0]  # (C, H, W)
    results = {}
    for run in runs:
        plan = _plan(run, final)
        plan.train_config.shift_pixels = 0  # the set carries its own translations
        fields = set(models.make_config(plan.model_name).__dict__)
        shape = {"in_channels": sample.shape[0], "input_size": sample.shape[-1]}
        plan.overrides.update({k: v for k, v in shape.items() if k in fields})
        key = f"{plan.model_name}@{dataset}"
        results[key] = _fit_and_save(
            plan,
            train_set,
            val_set,
            key=key,
            path=Path(final.out_dir) / f"{key}.pt",
            tracking_settings=(sweep, mode),
            log=log,
            wandb_config={
                **run,
                "dataset": dataset,
                "epochs": final.epochs,
                "train_images": len(train_set),
            },
            fields={"dataset": dataset},
            extra={"run_config": run, "dataset": dataset, "sweep_trial": best.get("trial_id")},
        )
    return results


def _train_smallnorb(runs, final, sweep, best, data_root, smallnorb, mode, log):
    """Every final run on smallNORB: random crops of the training set (the first
    ``final.train_size`` before the last ``final.val_size``, which validate as centre
    crops), scored on the centre-cropped test set; writes <out_dir>/<model>.pt."""
    from capsnet import evaluate
    from capsnet.data.datasets import TensorImageDataset, load

    norb = trials.smallnorb_settings(smallnorb)
    channels = sweep.channels
    shape = trials.data_shape("smallnorb", channels, norb["crop"])
    images, labels, info, val_images, val_labels = trials.split_smallnorb(
        data_root, channels, final.train_size, final.val_size, norb["crop"]
    )
    val_set = (
        TensorImageDataset(val_images, val_labels, "smallnorb-val") if final.val_size else None
    )
    test = load(
        "smallnorb",
        "test",
        data_root,
        channels=trials.smallnorb_channels(channels),
        crop=norb["crop"],
    ).subset(final.test_size)
    out_dir = Path(final.out_dir)
    stale = out_dir / DISABLED_FILE  # left by an earlier run with smallNORB off
    if stale.exists():
        stale.unlink()
    results: dict[str, dict[str, Any]] = {}

    def score_test(model, plan):
        scored = evaluate.accuracy(model, test, plan.train_config.eval_batch_size)
        log(f"{plan.model_name}: smallnorb test accuracy {scored['accuracy']:.4f}")
        return {"smallnorb": scored, "test_accuracy": scored["accuracy"]}

    for run in runs:
        plan = _plan(run, final, shape=shape)
        train_set = trials.smallnorb_training_set(images, labels, info, final.seed, **norb)
        results[plan.model_name] = _fit_and_save(
            plan,
            train_set,
            val_set,
            key=plan.model_name,
            path=out_dir / f"{plan.model_name}.pt",
            tracking_settings=(sweep, mode),
            log=log,
            wandb_config={
                **run,
                "dataset": "smallnorb",
                "channels": channels,
                "epochs": final.epochs,
            },
            fields={"dataset": "smallnorb", "channels": channels, "loss": plan.train_config.loss},
            describe=f", {channels} smallNORB channel(s)",
            score=score_test,
            extra={
                "run_config": run,
                "dataset": "smallnorb",
                "channels": channels,
                "sweep": best.get("sweep"),
                "sweep_trial": best.get("trial_id"),
                "role": "best" if run is runs[0] else "baseline",
            },
        )
    return results


def _plan(run, final: FinalTrainConfig, shape=None):
    return trials.plan(
        run,
        epochs=final.epochs,
        batch_size=final.batch_size,
        seed=final.seed,
        progress=None,
        shape=shape,
        compile=final.compile,
    )


def _fit_and_save(
    plan, train_set, val_set, *, key, path, tracking_settings, log, wandb_config, fields,
    extra, describe="", score=None,
) -> dict[str, Any]:  # fmt: skip
    """Train one final run with ``fit`` (a log line and a W&B step per epoch), add
    ``score(model, plan)``'s results to its metrics, write its checkpoint; returns the metrics."""
    from capsnet import checkpoint, models
    from capsnet.train import fit

    sweep, mode = tracking_settings
    torch.manual_seed(plan.train_config.seed)
    model = plan.build_model()
    parameters = models.count_parameters(model)
    wandb_run = tracking.start_run(
        sweep.wandb.project, sweep.name, f"train-{key}", mode, sweep.wandb.dir, wandb_config
    )
    log(
        f"training {key} ({parameters:,} parameters{describe}) on {len(train_set)} images "
        f"for {plan.train_config.epochs} epoch(s)"
    )
    started = time.perf_counter()
    try:
        history = fit(
            model, train_set, val_set, plan.train_config, _epoch_reporter(log, wandb_run, key)
        )
        metrics = {
            "model": plan.model_name,
            **fields,
            "parameters": parameters,
            "epochs": plan.train_config.epochs,
            "train_images": len(train_set),
            "train_seconds": round(time.perf_counter() - started, 3),
            "val_accuracy": history[-1].get("val_accuracy"),
        }
        if score is not None:
            metrics.update(score(model, plan))
        if wandb_run is not None:
            wandb_run.summary.update(
                {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            )
    finally:
        if wandb_run is not None:
            tracking.finish_all([wandb_run])
    saved = checkpoint.save(
        path,
        model.cpu(),
        train_config=plan.train_config.to_dict(),
        metrics={**metrics, "history": history},
        extra=extra,
    )
    log(f"wrote {saved}")
    return metrics


def _epoch_reporter(log, wandb_run, name: str):
    """fit's on_epoch callback: one log line per epoch, and the record to W&B."""

    def on_epoch(record, state):
        val = record.get("val_accuracy")
        log(
            f"{name} epoch {record['epoch']}: loss {record['train_loss']:.4f}"
            + (f" val acc {val:.4f}" if val is not None else "")
            + f" ({record['seconds']:.1f} s)"
        )
        if wandb_run is not None:
            wandb_run.log(record, step=record["epoch"])

    return on_epoch
