"""The Ray Tune sweep: search space from params, the trainable around ``capsnet.train.fit``,
``run_sweep`` (start or resume) and the results export.

Each trial converts Tune's flat config into a ``RunPlan`` (pipeline/trials.py), calls the
one ``fit`` of the core and, after every epoch, reports val_accuracy and the accuracy on
the validation images rotated by ``sweep.rotation_angle`` with a checkpoint. The datasets
reach trials through the object store (``tune.with_parameters``), so trials on other
machines need no data directory.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from capsnet.errors import CapsnetError, ConfigError
from capsnet.sweep_config import SEARCHABLE, SearchSpace, SweepConfig
from pipeline import tracking, trials

#: Metrics each trial reports after every epoch (both maximised).
METRICS = ("val_accuracy", "val_rotated_accuracy")
CHECKPOINT_FILE = "trial.pt"


class SweepError(CapsnetError):
    """Trials still errored after their retries (the message names them)."""


class SweepInterrupted(CapsnetError):
    """The driver was interrupted; Tune saved its state and the next run resumes."""


def param_space(space: SearchSpace) -> dict[str, Any]:
    """Tune's search space: grid -> grid_search, choice/uniform/loguniform/randint ->
    sampled, anything else fixed."""
    from ray import tune

    kinds = {
        "grid": tune.grid_search,
        "choice": tune.choice,
        "uniform": lambda bounds: tune.uniform(*bounds),
        "loguniform": lambda bounds: tune.loguniform(*bounds),
        "randint": lambda bounds: tune.randint(bounds[0], bounds[1] + 1),  # inclusive high
    }
    result = {}
    for name in SEARCHABLE:
        value = getattr(space, name)
        if isinstance(value, dict):
            ((kind, values),) = value.items()
            result[name] = kinds[kind](values)
        else:
            result[name] = value
    return result


def _space_values(space: SearchSpace, name: str) -> list:
    value = getattr(space, name)
    if isinstance(value, dict):
        ((kind, values),) = value.items()
        return list(values) if kind in ("grid", "choice") else []
    return [value]


def validate_space(space: SearchSpace) -> None:
    """Every model and augmentation named in the space exists (checked before Ray starts)."""
    from capsnet import models

    for name in _space_values(space, "model"):
        models.spec(name)
    for name in _space_values(space, "augment"):
        trials.check_augment(name)


def trial_dirname(trial) -> str:
    """Trial directories named by trial id (results.csv's trial_id column)."""
    return f"trial_{trial.trial_id}"


def train_trial(config: dict[str, Any], *, data: dict[str, torch.Tensor], settings: dict):
    """The Tune trainable: one ``fit`` with Tune's config, reporting every epoch.

    ``data`` holds train/val images and labels and the rotated validation images (from the
    object store); ``settings`` the epochs, batch size, seed and threads of the sweep.
    """
    started = time.perf_counter()
    import ray
    from ray import tune

    from capsnet import evaluate
    from capsnet.data.datasets import TensorImageDataset
    from capsnet.train import TrainState, fit

    torch.set_num_threads(settings["threads"])
    run = trials.plan(
        config,
        epochs=settings["epochs"],
        batch_size=settings["batch_size"],
        seed=settings["seed"],
        progress=False,
    )
    torch.manual_seed(settings["seed"])
    model = run.build_model()
    state = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            saved = torch.load(Path(directory) / CHECKPOINT_FILE, weights_only=True)
        model.load_state_dict(saved["model"])
        state = TrainState(**saved["state"])
    train_set = trials.training_set(
        data["train_images"],
        data["train_labels"],
        run.augment,
        settings["seed"],
        settings.get("augment_params"),
    )
    val_set = TensorImageDataset(data["val_images"], data["val_labels"], "mnist-val")
    rotated = TensorImageDataset(data["rotated_images"], data["val_labels"], "mnist-val-rot")
    node = ray.get_runtime_context().get_node_id()
    setup_seconds = time.perf_counter() - started

    def report(record: dict, state: TrainState) -> None:
        eval_started = time.perf_counter()
        rotated_accuracy = evaluate.accuracy(model, rotated, run.train_config.eval_batch_size)
        metrics = {
            "epoch": record["epoch"],
            "train_loss": record["train_loss"],
            "train_accuracy": record["train_accuracy"],
            "val_accuracy": record["val_accuracy"],
            "val_rotated_accuracy": rotated_accuracy["accuracy"],
            "epoch_seconds": record["seconds"],
            "eval_seconds": time.perf_counter() - eval_started,
            "setup_seconds": setup_seconds,
            "node": node,
        }
        payload = {
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "state": {
                "epoch": state.epoch,
                "step": state.step,
                "history": state.history,
                "optimizer": state.optimizer,
                "scheduler": state.scheduler,
                "rng": state.rng,
            },
        }
        with tempfile.TemporaryDirectory() as directory:
            torch.save(payload, Path(directory) / CHECKPOINT_FILE)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))

    fit(model, train_set, val_set, run.train_config, on_epoch=report, resume=state)


def check_resources(cpus: float, gpus: float, *, address: str) -> None:
    """Fail before any trial starts when no node can ever hold one trial (which Tune would
    otherwise leave PENDING forever)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total_gpus = sum(n["Resources"].get("GPU", 0) for n in nodes)
    if gpus > 0 and total_gpus == 0:
        raise ConfigError(
            f"sweep.resources.gpus_per_trial is {gpus:g} but the Ray cluster at {address} "
            f"has no GPUs ({len(nodes)} node(s), "
            f"{sum(n['Resources'].get('CPU', 0) for n in nodes):g} CPUs); set "
            f"gpus_per_trial: 0 or connect to a cluster with GPU workers"
        )
    fits = [
        n
        for n in nodes
        if n["Resources"].get("CPU", 0) >= cpus and n["Resources"].get("GPU", 0) >= gpus
    ]
    if not fits:
        largest = max(
            ((n["Resources"].get("CPU", 0), n["Resources"].get("GPU", 0)) for n in nodes),
            default=(0, 0),
        )
        raise ConfigError(
            f"no node of the Ray cluster at {address} has {cpus:g} CPU(s) and {gpus:g} "
            f"GPU(s) for one trial (largest node: {largest[0]:g} CPUs, {largest[1]:g} GPUs)"
        )


def _storage_path(storage: str) -> str:
    if "://" in storage:
        return storage.rstrip("/")
    return str(Path(storage).expanduser().resolve())


def load_data(sweep: SweepConfig, data_root, mirror) -> dict[str, torch.Tensor]:
    """The sweep's MNIST split and the rotated validation images, as plain tensors."""
    from capsnet.data.datasets import rotate_images

    train_images, train_labels, val_images, val_labels = trials.split_mnist(
        data_root, trials.default_mirror(mirror), sweep.train_size, sweep.val_size
    )
    return {
        "train_images": train_images,
        "train_labels": train_labels,
        "val_images": val_images,
        "val_labels": val_labels,
        "rotated_images": rotate_images(val_images, sweep.rotation_angle),
    }


@dataclass
class SweepOutcome:
    experiment_path: str
    rows: list[dict[str, Any]]
    best: dict[str, Any] | None
    restored: bool
    outputs: dict[str, str] = field(default_factory=dict)


def run_sweep(
    sweep: SweepConfig,
    *,
    out_dir: str | os.PathLike = "sweep",
    data_root: str | os.PathLike | None = None,
    mirror: str | None = None,
    address: str | None = None,
    data: dict[str, torch.Tensor] | None = None,
    callbacks: list | None = None,
    num_cpus: int | None = None,
    augment_params=None,
) -> SweepOutcome:
    """Run (or resume) the sweep and write results.csv, best.json and the plot data.

    Connects to ``address`` (else $RAY_ADDRESS, else a new local Ray instance) unless Ray
    is already initialised in this process. ``augment_params`` (params.yaml ``augment``)
    sets each strategy's strength. Raises SweepError naming the trials that still
    errored after their retries, SweepInterrupted when the driver was interrupted.
    """
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    validate_space(sweep.space)
    mode = tracking.prepare_environment(sweep.wandb.mode)
    if data is None:
        data = load_data(sweep, data_root, mirror)
    address = address or os.environ.get("RAY_ADDRESS") or "local"
    owns_ray = not ray.is_initialized()
    if owns_ray:
        env = {"WANDB_MODE": mode, "WANDB_SILENT": "true"}
        if address == "local":
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": env},
            )
        else:
            ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        resources = sweep.resources
        check_resources(resources.cpus_per_trial, resources.gpus_per_trial, address=address)
        settings = {
            "epochs": sweep.epochs,
            "batch_size": sweep.batch_size,
            "seed": sweep.seed,
            "threads": max(1, math.floor(resources.cpus_per_trial)),
            "augment_params": augment_params,
        }
        trainable = tune.with_resources(
            tune.with_parameters(train_trial, data=data, settings=settings),
            {"cpu": resources.cpus_per_trial, "gpu": resources.gpus_per_trial},
        )
        storage = _storage_path(sweep.storage_path)
        name = f"{sweep.name}-{sweep.fingerprint()}"
        experiment_path = f"{storage}/{name}"
        if "://" in storage:  # DVC's persisted sweep/ray output: a pointer to the state
            _atomic_write(
                Path(out_dir) / "ray" / "experiment.json",
                json.dumps({"experiment_path": experiment_path}) + "\n",
            )
        restored = tune.Tuner.can_restore(experiment_path)
        if restored:
            tuner = tune.Tuner.restore(
                experiment_path, trainable=trainable, resume_unfinished=True, resume_errored=True
            )
        else:
            scheduler = (
                ASHAScheduler(
                    time_attr="epoch",
                    max_t=sweep.epochs,
                    grace_period=sweep.asha.grace_period,
                    reduction_factor=sweep.asha.reduction_factor,
                )
                if sweep.asha.enabled
                else FIFOScheduler()
            )
            run_callbacks = list(callbacks or [])
            wandb_callback = tracking.sweep_callback(
                sweep.wandb.project, sweep.name, mode, sweep.wandb.dir
            )
            if wandb_callback is not None:
                run_callbacks.append(wandb_callback)
            tuner = tune.Tuner(
                trainable,
                param_space=param_space(sweep.space),
                tune_config=tune.TuneConfig(
                    metric=sweep.metric,
                    mode="max",
                    scheduler=scheduler,
                    num_samples=sweep.num_samples,
                    max_concurrent_trials=resources.max_concurrent_trials,
                    reuse_actors=sweep.reuse_actors,
                    trial_dirname_creator=trial_dirname,
                ),
                run_config=tune.RunConfig(
                    name=name,
                    storage_path=storage,
                    failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                    callbacks=run_callbacks,
                    verbose=1,
                ),
            )
        results = tuner.fit()
        unfinished = _unfinished_trials(
            experiment_path, trainable, expected_trials(sweep.space, sweep.num_samples)
        )
        if unfinished:
            raise SweepInterrupted(
                f"sweep interrupted with {unfinished} unfinished trial(s); its state is in "
                f"{experiment_path} and the next run resumes it"
            )
        rows = result_rows(results, sweep)
        best = best_result(results, sweep)
        outputs = write_outputs(out_dir, rows, best, sweep)
    finally:
        if owns_ray:
            ray.shutdown()
    errored = [row for row in rows if row["status"] == "ERROR"]
    if errored:
        names = ", ".join(f"{row['trial_id']} ({row['error']})" for row in errored)
        raise SweepError(
            f"{len(errored)} of {len(rows)} trial(s) errored after "
            f"{sweep.max_failures} retries: {names}; see {experiment_path}"
        )
    return SweepOutcome(experiment_path, rows, best, restored, outputs)


def expected_trials(space: SearchSpace, num_samples: int) -> int:
    """How many trials Tune makes: num_samples times the product of the grid sizes."""
    count = num_samples
    for name in SEARCHABLE:
        value = getattr(space, name)
        if isinstance(value, dict) and "grid" in value:
            count *= len(value["grid"])
    return count


def _unfinished_trials(experiment_path: str, trainable, expected: int) -> int:
    """Trials not yet TERMINATED or ERROR in the saved experiment state, plus those not
    created yet. After an interrupt Tune stops the running trials and marks them
    TERMINATED in memory, but the state it saved first still has them RUNNING."""
    from ray import tune

    saved = tune.Tuner.restore(experiment_path, trainable=trainable).get_results()
    return expected - saved.num_terminated - saved.num_errors


def _first_line(error: BaseException | None) -> str:
    if error is None:
        return ""
    text = str(error).strip().splitlines()
    tail = [line for line in text if line.strip()][-1:] or [type(error).__name__]
    return tail[0].strip()[:200]


def result_rows(results, sweep: SweepConfig) -> list[dict[str, Any]]:
    """One row per trial: id, status, node, the searched parameters, final and best
    metrics, epochs run and seconds."""
    rows = []
    for result in results:
        metrics = result.metrics or {}
        frame = result.metrics_dataframe
        row: dict[str, Any] = {
            "trial_id": metrics.get("trial_id") or Path(result.path).name.removeprefix("trial_"),
            "status": "ERROR" if result.error else "TERMINATED",
            "node": metrics.get("node", ""),
        }
        for name in SEARCHABLE:
            row[name] = result.config.get(name)
        for metric in METRICS:
            row[f"final_{metric}"] = metrics.get(metric)
            values = frame[metric].dropna() if frame is not None and metric in frame else []
            row[f"best_{metric}"] = float(max(values)) if len(values) else None
        row["epochs"] = metrics.get("epoch", 0)
        row["early_stopped"] = bool(not result.error and row["epochs"] < sweep.epochs)
        row["seconds"] = round(float(metrics.get("time_total_s", 0.0)), 3)
        row["error"] = _first_line(result.error)
        rows.append(row)
    rows.sort(key=lambda r: r["trial_id"])
    return rows


def best_result(results, sweep: SweepConfig) -> dict[str, Any] | None:
    """The best trial by ``sweep.metric`` at its last epoch: its config and metrics."""
    good = [r for r in results if not r.error and r.metrics.get(sweep.metric) is not None]
    if not good:
        return None
    best = results.get_best_result(metric=sweep.metric, mode="max", scope="last")
    return {
        "sweep": sweep.name,
        "metric": sweep.metric,
        "mode": "max",
        "rotation_angle": sweep.rotation_angle,
        "trial_id": best.metrics.get("trial_id"),
        "config": {name: best.config.get(name) for name in SEARCHABLE},
        "metrics": {
            "epoch": best.metrics.get("epoch"),
            **{metric: best.metrics.get(metric) for metric in METRICS},
        },
    }


def _atomic_write(path: Path, text: str) -> None:
    from capsnet.data.sources import atomic_write_bytes

    atomic_write_bytes(path, text.encode())


def _csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: "" if row.get(c) is None else row.get(c) for c in columns})
    return buffer.getvalue()


def plot_rows(rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The best final val accuracy (and its rotated accuracy) per value of ``key``."""
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["status"] != "TERMINATED" or row["final_val_accuracy"] is None:
            continue
        value = str(row[key]) if row[key] is not None else "n/a"
        if row["model"] is not None and key == "routing_iterations":
            from capsnet import models

            fields = models.make_config(row["model"]).__dict__
            if "routing_iterations" not in fields:
                value = "n/a"
        label = f"{row['model']}/{value}" if key == "routing_iterations" else value
        current = groups.get(label)
        if current is None or row["final_val_accuracy"] > current["val_accuracy"]:
            groups[label] = {
                key: label,
                "val_accuracy": row["final_val_accuracy"],
                "val_rotated_accuracy": row["final_val_rotated_accuracy"],
            }
    return [groups[k] for k in sorted(groups)]


def write_outputs(out_dir, rows, best, sweep: SweepConfig) -> dict[str, str]:
    """sweep/results.csv, sweep/best.json, sweep/plots/by_{routing,augment}.csv."""
    out = Path(out_dir)
    columns = ["trial_id", "status", "node", *SEARCHABLE]
    columns += [f"{kind}_{metric}" for kind in ("final", "best") for metric in METRICS]
    columns += ["epochs", "early_stopped", "seconds", "error"]
    paths = {
        "results": out / "results.csv",
        "best": out / "best.json",
        "by_routing": out / "plots" / "by_routing.csv",
        "by_augment": out / "plots" / "by_augment.csv",
    }
    _atomic_write(paths["results"], _csv(rows, columns))
    if best is not None:
        _atomic_write(paths["best"], json.dumps(best, indent=2) + "\n")
    else:
        paths.pop("best")
    for key, path_key in (("routing_iterations", "by_routing"), ("augment", "by_augment")):
        _atomic_write(
            paths[path_key],
            _csv(plot_rows(rows, key), [key, "val_accuracy", "val_rotated_accuracy"]),
        )
    return {k: str(v) for k, v in paths.items()}
