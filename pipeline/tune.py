"""The Ray Tune sweep: search space from params, the trainable around ``capsnet.train.fit``,
``run_sweep`` (start or resume) and the results export.

Each trial converts Tune's flat config into a ``RunPlan`` (pipeline/trials.py), calls the
one ``fit`` of the core and, after every epoch, reports val_accuracy (and, for MNIST, the
accuracy on the validation images rotated by ``sweep.rotation_angle``) with a checkpoint.
The datasets reach trials through the object store (``tune.with_parameters``), so trials
on other machines need no data directory. A smallNORB sweep (``dataset: smallnorb``)
trains on random crops of the prepared training set and validates on centre crops; with
smallNORB switched off, ``write_disabled`` writes marked outputs instead of running.
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

from capsnet.config import SEARCHABLE, SearchSpace, SweepConfig
from capsnet.errors import CapsnetError, ConfigError
from pipeline import tracking, trials

#: Metrics each MNIST trial reports after every epoch (both maximised); a smallNORB trial
#: reports val_accuracy only (``SweepConfig.metrics``).
METRICS = ("val_accuracy", "val_rotated_accuracy")
CHECKPOINT_FILE = "trial.pt"
DISABLED_FILE = "DISABLED.txt"


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


def validate_space(space: SearchSpace, shape: dict[str, int] | None = None) -> None:
    """Every model and augmentation named in the space exists, and every model takes the
    data's ``shape`` (checked before Ray starts)."""
    from capsnet import models

    for name in _space_values(space, "model"):
        fields = set(models.make_config(name).__dict__)
        models.make_config(name, **{k: v for k, v in (shape or {}).items() if k in fields})
    for name in _space_values(space, "augment"):
        trials.check_augment(name)


def trial_dirname(trial) -> str:
    """Trial directories named by trial id (results.csv's trial_id column)."""
    return f"trial_{trial.trial_id}"


def train_trial(config: dict[str, Any], *, data: dict[str, torch.Tensor], settings: dict):
    """The Tune trainable: one ``fit`` with Tune's config, reporting every epoch.

    ``data`` holds train/val images and labels and, for MNIST, the rotated validation
    images (from the object store); ``settings`` the dataset, model shape, epochs, batch
    size, seed and threads of the sweep.
    """
    started = time.perf_counter()
    import ray
    from ray import tune

    from capsnet import evaluate
    from capsnet.data.datasets import TensorImageDataset
    from capsnet.train import TrainState, fit

    torch.set_num_threads(settings["threads"])
    smallnorb = settings.get("dataset") == "smallnorb"
    run = trials.plan(
        config,
        epochs=settings["epochs"],
        batch_size=settings["batch_size"],
        seed=settings["seed"],
        progress=False,
        shape=settings.get("shape"),
        compile=settings.get("compile", False),
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
    if smallnorb:
        train_set = trials.smallnorb_training_set(
            data["train_images"],
            data["train_labels"],
            data["train_info"],
            settings["seed"],
            **settings["smallnorb"],
        )
        rotated = None
    else:
        train_set = trials.training_set(
            data["train_images"],
            data["train_labels"],
            run.augment,
            settings["seed"],
            settings.get("augment_params"),
        )
        rotated = TensorImageDataset(data["rotated_images"], data["val_labels"], "mnist-val-rot")
    name = "smallnorb-val" if smallnorb else "mnist-val"
    val_set = TensorImageDataset(data["val_images"], data["val_labels"], name)
    node = ray.get_runtime_context().get_node_id()
    setup_seconds = time.perf_counter() - started

    def report(record: dict, state: TrainState) -> None:
        eval_started = time.perf_counter()
        metrics = {
            "epoch": record["epoch"],
            "train_loss": record["train_loss"],
            "train_accuracy": record["train_accuracy"],
            "val_accuracy": record["val_accuracy"],
        }
        if rotated is not None:
            metrics["val_rotated_accuracy"] = evaluate.accuracy(
                model, rotated, run.train_config.eval_batch_size
            )["accuracy"]
        metrics |= {
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


def load_data(sweep: SweepConfig, data_root, mirror, smallnorb=None) -> dict[str, torch.Tensor]:
    """The sweep's MNIST split and the rotated validation images, or its smallNORB split
    (training images at 48x48 with their info rows, centre-cropped validation images), as
    plain tensors. ``smallnorb``: params.yaml ``data.smallnorb`` (crop size)."""
    from capsnet.data.datasets import rotate_images

    if sweep.dataset == "smallnorb":
        crop = trials.smallnorb_settings(smallnorb)["crop"]
        images, labels, info, val_images, val_labels = trials.split_smallnorb(
            data_root, sweep.channels, sweep.train_size, sweep.val_size, crop
        )
        return {
            "train_images": images,
            "train_labels": labels,
            "train_info": info,
            "val_images": val_images,
            "val_labels": val_labels,
        }

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
    smallnorb=None,
) -> SweepOutcome:
    """Run (or resume) the sweep and write results.csv, best.json and the plot data.

    Connects to ``address`` (else $RAY_ADDRESS, else a new local Ray instance) unless Ray
    is already initialised in this process. ``augment_params`` (params.yaml ``augment``)
    sets each strategy's strength; ``smallnorb`` (params.yaml ``data.smallnorb``) the crop
    size, brightness and contrast of a smallNORB sweep. Raises SweepError naming the
    trials that still errored after their retries, SweepInterrupted when the driver was
    interrupted.
    """
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    norb = trials.smallnorb_settings(smallnorb)
    shape = trials.data_shape(sweep.dataset, sweep.channels, norb["crop"])
    validate_space(sweep.space, shape)
    mode = tracking.prepare_environment(sweep.wandb.mode)
    if data is None:
        data = load_data(sweep, data_root, mirror, smallnorb)
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
            "dataset": sweep.dataset,
            "shape": shape,
            "smallnorb": norb,
            "epochs": sweep.epochs,
            "batch_size": sweep.batch_size,
            "seed": sweep.seed,
            "threads": max(1, math.floor(resources.cpus_per_trial)),
            "augment_params": augment_params,
            "compile": sweep.compile,
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
        for name in sweep.parameters():
            row[name] = result.config.get(name)
        for metric in sweep.metrics():
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
    data = {"dataset": sweep.dataset}
    if sweep.dataset == "smallnorb":
        data["channels"] = sweep.channels
    else:
        data["rotation_angle"] = sweep.rotation_angle
    return {
        "sweep": sweep.name,
        "metric": sweep.metric,
        "mode": "max",
        **data,
        "trial_id": best.metrics.get("trial_id"),
        "config": {name: best.config.get(name) for name in sweep.parameters()},
        "metrics": {
            "epoch": best.metrics.get("epoch"),
            **{metric: best.metrics.get(metric) for metric in sweep.metrics()},
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


def _applies(model: str | None, key: str) -> bool:
    """Whether a model config field ``key`` (routing_iterations, pose, ...) exists in
    ``model``; run-config keys that are not model fields always apply."""
    if model is None or key not in trials.MODEL_KEYS:
        return True
    from capsnet import models

    return key in models.make_config(model).__dict__


def plot_rows(
    rows: list[dict[str, Any]], key: str, metrics: tuple[str, ...] = METRICS
) -> list[dict[str, Any]]:
    """The best final val accuracy (and its other metrics) per value of ``key``."""
    groups: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["status"] != "TERMINATED" or row["final_val_accuracy"] is None:
            continue
        value = str(row[key]) if row[key] is not None else "n/a"
        if not _applies(row["model"], key):
            value = "n/a"
        label = f"{row['model']}/{value}" if key == "routing_iterations" else value
        current = groups.get(label)
        if current is None or row["final_val_accuracy"] > current["val_accuracy"]:
            groups[label] = {key: label, **{m: row[f"final_{m}"] for m in metrics}}
    return [groups[k] for k in sorted(groups)]


ABLATION_COLUMNS = ["setting", "parameter", "value", "val_accuracy", "mean_val_accuracy", "trials"]


def ablation_rows(rows: list[dict[str, Any]], sweep: SweepConfig) -> list[dict[str, Any]]:
    """One row per value of each searched parameter ("pose=vector"): the best and the mean
    final val accuracy of the finished trials with that value, and how many there were
    (the ablation of the EM paper's table, the other axes at their best or averaged)."""
    out = []
    for key in sweep.space.searched():
        groups: dict[str, list[float]] = {}
        for row in rows:
            if row["status"] != "TERMINATED" or row["final_val_accuracy"] is None:
                continue
            value = str(row[key]) if _applies(row["model"], key) else "n/a"
            groups.setdefault(value, []).append(float(row["final_val_accuracy"]))
        for value in sorted(groups):
            scores = groups[value]
            out.append(
                {
                    "setting": f"{key}={value}",
                    "parameter": key,
                    "value": value,
                    "val_accuracy": max(scores),
                    "mean_val_accuracy": round(sum(scores) / len(scores), 6),
                    "trials": len(scores),
                }
            )
    return out


def result_columns(sweep: SweepConfig) -> list[str]:
    """results.csv's columns: id, status, node, the recorded parameters, final and best
    metrics, epochs, early stopping, seconds and the error."""
    columns = ["trial_id", "status", "node", *sweep.parameters()]
    columns += [f"{kind}_{metric}" for kind in ("final", "best") for metric in sweep.metrics()]
    return [*columns, "epochs", "early_stopped", "seconds", "error"]


def output_paths(out_dir, sweep: SweepConfig) -> dict[str, Path]:
    """results.csv, best.json and the plot data: by_routing and by_augment for MNIST,
    by_routing and ablation (every searched parameter) for smallNORB."""
    out = Path(out_dir)
    plots = ("by_routing", "ablation") if sweep.dataset == "smallnorb" else PLOTS
    return {
        "results": out / "results.csv",
        "best": out / "best.json",
        **{name: out / "plots" / f"{name}.csv" for name in plots},
    }


PLOTS = ("by_routing", "by_augment")


def write_outputs(out_dir, rows, best, sweep: SweepConfig) -> dict[str, str]:
    """<out>/results.csv, best.json and plots/ (``output_paths``)."""
    paths = output_paths(out_dir, sweep)
    _atomic_write(paths["results"], _csv(rows, result_columns(sweep)))
    if best is not None:
        _atomic_write(paths["best"], json.dumps(best, indent=2) + "\n")
    else:
        paths.pop("best")
    metrics = sweep.metrics()
    for name, key in (("by_routing", "routing_iterations"), ("by_augment", "augment")):
        if name in paths:
            _atomic_write(paths[name], _csv(plot_rows(rows, key, metrics), [key, *metrics]))
    if "ablation" in paths:
        _atomic_write(paths["ablation"], _csv(ablation_rows(rows, sweep), ABLATION_COLUMNS))
    stale = Path(out_dir) / DISABLED_FILE  # left by an earlier run with the data off
    if stale.exists():
        stale.unlink()
    return {k: str(v) for k, v in paths.items()}


def write_disabled(out_dir, sweep: SweepConfig, reason: str) -> dict[str, str]:
    """The outputs of a sweep whose dataset is switched off, so DVC finds every declared
    output and nothing looks like a result: <out>/DISABLED.txt saying why, best.json
    ``{"disabled": reason}``, results.csv and the plot files with their header and no
    rows, and the (local) Tune storage directory, left as it was."""
    paths = output_paths(out_dir, sweep)
    _atomic_write(Path(out_dir) / DISABLED_FILE, reason.rstrip() + "\n")
    _atomic_write(paths["best"], json.dumps({"disabled": reason}, indent=2) + "\n")
    _atomic_write(paths["results"], _csv([], result_columns(sweep)))
    metrics = list(sweep.metrics())
    headers = {
        "by_routing": ["routing_iterations", *metrics],
        "by_augment": ["augment", *metrics],
        "ablation": ABLATION_COLUMNS,
    }
    for name, columns in headers.items():
        if name in paths:
            _atomic_write(paths[name], _csv([], columns))
    if "://" not in sweep.storage_path:
        Path(sweep.storage_path).mkdir(parents=True, exist_ok=True)
    return {"disabled": str(Path(out_dir) / DISABLED_FILE), **{k: str(v) for k, v in paths.items()}}
