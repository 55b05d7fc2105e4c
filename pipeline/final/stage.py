"""The ``train`` stage after the sweep: the best sweep config trained for params.yaml
``train.epochs``, and the baselines (lenet5) with the same augmentation.

Every run is a RunSpec built the way a trial builds its own (``pipeline.sweep.trainable.run_spec``
over the base from ``capsnet.training.run.section_spec``) and trained by
``capsnet.training.run.train_run``;
each writes ``<out_dir>/<model>.pt`` with ``capsnet.models.checkpoint.save`` and logs a W&B run
(job_type "train"). MNIST runs are scored on the validation images rotated by the sweep's
angle, the same runs on the extra sets (multimnist, expanded-mnist) go to
``<model>@<dataset>.pt``, and smallNORB runs are scored on the centre-cropped test set.

The comparison (``train.seeds``, ``equal_time``, ``baseline_augments``): every run is trained
with each seed (``<model>.pt`` for the first, ``<model>@seed<k>.pt`` for the others), each
baseline again for the best model's training time, in epochs by the cost of each model's
training steps measured back to back (``capsnet.training.run.equal_time_epochs``:
``<baseline>@equal-time[-seed<k>].pt``) and with each extra strategy
(``<baseline>@<strategy>[-seed<k>].pt``). Each of these checkpoints carries
``extra["comparison"]`` (arm, label, reference model, measured time, step costs) for the
evaluation.

``out_dir`` is built in a temporary sibling and swapped in whole when every run is done
(``capsnet.io.outputset.atomic_directory``), metrics.json included when it lies inside: a failed or
killed stage leaves the earlier directory, never a mix of old and new checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capsnet.config import DATA_ROOT, SEARCHABLE_TYPES, FinalTrainConfig, Params, SweepConfig
from capsnet.config.sweep import schedule, seed_list
from capsnet.io import outputset
from capsnet.io.errors import ConfigError
from capsnet.io.files import atomic_write_json, read_json, run_name
from capsnet.io.outputset import atomic_directory
from capsnet.training.run import (
    RunSpec,
    Split,
    equal_time_epochs,
    section_spec,
    step_costs,
    training_steps,
)
from pipeline import provenance, tracking
from pipeline.cluster.gpu_worker import Runner, placement
from pipeline.sweep.trainable import device_label, run_spec, used_settings

Score = Callable[[Any, RunSpec], dict[str, Any]]
Fields = Callable[[RunSpec], dict[str, Any]]

#: The summary of every train run's W&B run, whatever its dataset or arm: a column in the
#: project's run table for each, null where a run has no such number (an MNIST run has no
#: test_accuracy, a smallNORB run no val_rotated_accuracy).
SUMMARY_KEYS = (
    "model", "dataset", "device", "parameters", "epochs", "train_images", "train_seconds",
    "wall_seconds", "val_accuracy", "val_rotated_accuracy", "rotation_angle", "test_accuracy",
)  # fmt: skip


def run_summary(metrics: dict[str, Any], dataset: str) -> dict[str, Any]:
    """A train run's W&B summary: SUMMARY_KEYS from ``metrics`` (``dataset`` its own)."""
    return {key: metrics.get(key) for key in SUMMARY_KEYS} | {"dataset": dataset}


def read_best(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    best = read_json(path, "run the sweep first (capsnet sweep)", ConfigError)
    if isinstance(best, dict) and "disabled" in best:
        raise ConfigError(
            f"{path}: the sweep did not run ({best['disabled']}); rerun it with its data on"
        )
    if not isinstance(best, dict) or not isinstance(best.get("config"), dict):
        raise ConfigError(f"{path}: no 'config' of the best trial")
    for key, value in best["config"].items():
        problem = config_value_problem(key, value)
        if problem is not None:
            raise ConfigError(f"{path}: config.{key}: {problem}, got {value!r:.60}")
    return best


def config_value_problem(key: str, value: Any) -> str | None:
    """Why ``value`` cannot be trial-config ``key`` (see pipeline.sweep.trainable), or None."""
    kind = SEARCHABLE_TYPES.get(key)
    if value is None or kind is None:
        return None
    if kind is bool:
        return None if isinstance(value, bool) else "expected true or false"
    if kind is str:
        return None if isinstance(value, str) else "expected a name"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected a number"
    if not math.isfinite(value):
        return "expected a finite number"
    if kind is int and not (isinstance(value, int) or float(value).is_integer()):
        return "expected a whole number"
    return None


def final_runs(best: dict[str, Any], final: FinalTrainConfig) -> list[dict[str, Any]]:
    """The run configs to train: the best one, then each baseline with its augmentation,
    learning rate (``final.baseline_lr`` when set), margins and weight decay (parameters a
    baseline lacks are ignored). A baseline trains with its own model's default loss
    (cross-entropy for the CNNs): the sweep's loss is a capsule ablation axis.
    ``final.augment``, when set, replaces every run's augmentation."""
    first = dict(best["config"])
    if final.augment is not None:
        first["augment"] = final.augment
    runs = [first]
    for name in final.baselines:
        if name != first.get("model"):
            run = {**first, "model": name}
            if "loss" in run:
                run["loss"] = "auto"
            if final.baseline_lr is not None:
                run["lr"] = final.baseline_lr
            runs.append(run)
    return runs


def model_dir_files(metrics_path=None, out_dir=None) -> tuple[str, ...]:
    """What final training writes into its ``out_dir`` (replaced whole): checkpoints,
    metrics.json (or the ``metrics_path`` inside it) and ORIGIN.json."""
    inside = None if metrics_path is None else outputset.inside(metrics_path, out_dir)
    extra = () if inside is None else (inside.as_posix(),)
    return ("*.pt", "metrics.json", provenance.ORIGIN_FILE, *extra)


def train_final(
    final: FinalTrainConfig,
    sweep: SweepConfig,
    params: Params | None = None,
    *,
    best_path: str | os.PathLike = "sweep/best.json",
    data_root: str | os.PathLike = DATA_ROOT,
    mirror: str | None = None,
    metrics_path: str | os.PathLike | None = None,
    log=print,
) -> dict[str, dict[str, Any]]:
    """Train every final run; returns {checkpoint name: metrics} and writes the
    checkpoints (and, with ``metrics_path``, the metrics as JSON). ``sweep.dataset`` picks
    the data; it must be the dataset of the sweep that wrote ``best_path``."""
    from capsnet.training.run import check

    best = read_best(best_path)
    swept = best.get("dataset", SweepConfig.dataset)  # best files before the record: MNIST
    if swept != sweep.dataset:
        raise ConfigError(
            f"{best_path}: the best config of a {swept} sweep, but {sweep.SECTION}.dataset "
            f"is {sweep.dataset}; pass the matching --best or --sweep-section"
        )
    base = section_spec(final, sweep, params, data_root, mirror, **schedule(final))
    specs = [run_spec(run, base) for run in final_runs(best, final)]
    for spec in specs:  # fail on a bad name before loading data or training anything
        check(spec)
    inside = None if metrics_path is None else outputset.inside(metrics_path, final.out_dir)
    own = model_dir_files(metrics_path, final.out_dir)
    with placement(log=log) as runner, atomic_directory(final.out_dir, own) as staging:
        trainer = _Trainer(final, sweep, best, log, staging, runner)
        if not base.data.rotated_validation:
            results = _train_scored_on_test(trainer, base, specs, final)
        else:
            angle = float(best.get("rotation_angle", sweep.rotation_angle))
            results = _train_mnist(trainer, base, specs, angle, final)
            for dataset in final.extra_datasets:
                results.update(_train_extra_set(trainer, base, specs, dataset, final))
        if inside is not None:
            atomic_write_json(staging / inside, results)
        atomic_write_json(staging / provenance.ORIGIN_FILE, provenance.origin())
    log(f"wrote {final.out_dir}: {len(results)} checkpoint(s)")
    if metrics_path is not None and inside is None:  # after the checkpoints: the manifest
        atomic_write_json(Path(metrics_path), results)
    return results


def _role(specs: list[RunSpec], spec: RunSpec) -> str:
    return "best" if spec.model == specs[0].model else "baseline"


def _seeded(spec: RunSpec, seed: int) -> RunSpec:
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, seed=seed))


@dataclass
class Arm:
    """One final run: what it trains on, its checkpoint name (``key``) and what it records."""

    spec: RunSpec
    split: Split
    key: str
    fields: dict[str, Any]
    role: str | None
    score: Score | None = None
    comparison: dict[str, Any] | None = None


def train_arms(
    trainer, split: Split, specs: list[RunSpec], final, fields: Fields, score: Score | None
) -> dict[str, dict[str, Any]]:
    """The comparison on one split: every run with every seed (equal augmentation and
    epochs; the best run first, its mean time is the budget), then each baseline for that
    budget (equal time) and with each of ``final.baseline_augments``. The runs of each of
    the two rounds are trained together (``_Trainer.fit_all``)."""
    seeds = seed_list(final.seed, final.seeds)
    reference, baselines = specs[0].model, specs[1:]

    def arms(spec: RunSpec, tag: str, arm: dict[str, Any]) -> list[Arm]:
        comparison = {**arm, "reference": reference}
        return [
            Arm(_seeded(spec, seed), split, run_name(spec.model, tag, seed, seeds[0]), fields(spec),
                _role(specs, spec), score, comparison)
            for seed in seeds
        ]  # fmt: skip

    results = trainer.fit_all(
        [a for spec in specs for a in arms(spec, "", {"arm": "equal_augmentation",
                                                      "label": spec.model})]
    )  # fmt: skip
    later: list[Arm] = []
    if final.equal_time and baselines:
        budget = statistics.fmean(results[run_name(reference, "", s, seeds[0])]["train_seconds"]
                                  for s in seeds)  # fmt: skip
        clock = results[run_name(reference, "", seeds[0], seeds[0])]["time_clock"]
        trainer.log(f"equal time: {reference}'s mean training time {budget:.1f} s of {clock} time")
        costs = trainer.runner(step_costs, specs, split)
        items = len(split.train)
        budgeted = training_steps(specs[0], items) * costs[0]  # what the rule spends
        for spec, cost in zip(baselines, costs[1:], strict=True):
            epochs = equal_time_epochs(specs[0], spec, (costs[0], cost), items)
            planned = training_steps(spec, items, epochs) * cost
            trainer.log(f"equal time: {spec.model} trains {epochs} epochs (step costs "
                        f"{costs[0] * 1000:.2f} ms and {cost * 1000:.2f} ms: {planned:.1f} s "
                        f"budgeted against {reference}'s {budgeted:.1f} s)")  # fmt: skip
            timed = dataclasses.replace(spec.train, epochs=epochs)
            arm = {"arm": "equal_time", "label": spec.model, "time_budget_seconds": budget,
                   "step_seconds": [costs[0], cost], "budgeted_seconds": budgeted,
                   "planned_seconds": planned}  # fmt: skip
            later += arms(dataclasses.replace(spec, train=timed), "equal-time", arm)
    for strategy in final.baseline_augments:
        for spec in baselines:
            arm = {"arm": "baseline_augmentation", "label": f"{spec.model} ({strategy})"}
            later += arms(dataclasses.replace(spec, augment=strategy), strategy, arm)
    results.update(trainer.fit_all(later))
    return results


def _train_mnist(trainer, base: RunSpec, specs: list[RunSpec], angle: float, final) -> dict:
    """The comparison on MNIST (``train_arms``), each run scored on the rotated validation
    images."""
    from capsnet.data.datasets import rotated
    from capsnet.training import scoring as evaluate
    from capsnet.training.run import load_split

    split = load_split(base)
    val_rotated = None if split.val is None else rotated(split.val, angle, "mnist-val-rot")

    def score(model, spec: RunSpec) -> dict[str, Any]:
        if val_rotated is None:
            return {}
        scored = evaluate.accuracy(model, val_rotated, spec.train.eval_batch_size)
        return {"rotation_angle": angle, "val_rotated_accuracy": scored["accuracy"]}

    return train_arms(trainer, split, specs, final, lambda spec: {"augment": spec.augment}, score)


def _train_extra_set(trainer, base, specs: list[RunSpec], dataset: str, final) -> dict:
    """Every run on ``dataset`` (its own input size) without augmentation; checkpoints
    ``<model>@<dataset>.pt``. Each run loads its own split: what an item carries depends on
    the model (MultiMNIST digits alone for a model with a decoder)."""
    from capsnet.training.run import load_split

    sizes = {"train_size": final.extra_train_size, "val_size": min(final.val_size, 1000)}
    arms = []
    for spec in specs:
        spec = dataclasses.replace(spec, dataset=dataset, augment="none", **sizes)
        arms.append(Arm(spec, load_split(spec), f"{spec.model}@{dataset}", {"dataset": dataset},
                        None))  # fmt: skip
    return trainer.fit_all(arms)


def _train_scored_on_test(trainer, base: RunSpec, specs: list[RunSpec], final) -> dict:
    """Every run on the sweep's dataset (smallNORB random crops), scored on its test set
    (centre crops); the score under the dataset's name."""
    from capsnet.training import scoring as evaluate
    from capsnet.training.run import load_split, load_test

    split = load_split(base)
    test = load_test(base, final.test_size)

    def score(model, spec: RunSpec) -> dict[str, Any]:
        scored = evaluate.score(model, base.dataset, test, spec.train.eval_batch_size)
        return {base.dataset: scored, "test_accuracy": scored[base.data.headline_metric]}

    def fields(spec: RunSpec) -> dict[str, Any]:
        return {"dataset": base.dataset, "channels": base.channels, "loss": spec.train.loss}

    return train_arms(trainer, split, specs, final, fields, score)


def fit_and_score(spec: RunSpec, split: Split, score: Score | None, on_epoch=None):
    """(RunResult with the model on the CPU, ``score``'s metrics, the device label): the
    run trained and scored on its device, moved to the CPU only afterwards. What a GPU
    worker runs (``pipeline.cluster.gpu_worker``)."""
    from capsnet.training.run import train_run

    result = train_run(spec, split, on_epoch=on_epoch, to_cpu=False)
    device = next(result.model.parameters()).device
    scores = score(result.model, spec) if score is not None else {}
    result.model.cpu()
    return result, scores, device_label(device)


class _Trainer:
    """Trains one final run (a log line and a W&B step per epoch), scores it and writes
    its checkpoint with the metrics, the run config and where it came from into
    ``staging``, the directory that becomes ``final.out_dir``. ``runner`` trains in this
    process or on a GPU worker (then the epochs are logged when the run returns)."""

    def __init__(self, final: FinalTrainConfig, sweep: SweepConfig, best: dict, log, staging,
                 runner: Runner | None = None):  # fmt: skip
        self.out_dir, self.sweep, self.best, self.log = Path(final.out_dir), sweep, best, log
        self.staging = Path(staging)
        self.runner = runner or Runner()
        self.mode = tracking.prepare_environment(sweep.wandb.mode)

    def fit_all(self, arms: list[Arm]) -> dict[str, dict[str, Any]]:
        """{key: metrics} of every arm, trained and saved in order. Remote, every arm is
        submitted before the first result is taken: a cluster with N GPUs trains N at once
        (each split goes to the object store once)."""
        if not self.runner.remote or not arms:
            return {arm.key: self.fit_and_save(arm) for arm in arms}
        shared: dict[int, Any] = {}
        for arm in arms:
            shared.setdefault(id(arm.split), self.runner.share(arm.split))
        pending = [
            self.runner.submit(fit_and_score, arm.spec, shared[id(arm.split)], arm.score, None)
            for arm in arms
        ]
        self.log(f"{len(arms)} run(s) submitted together, one GPU worker each: "
                 + ", ".join(arm.key for arm in arms))  # fmt: skip
        return {arm.key: self.fit_and_save(arm, task) for arm, task in zip(arms, pending)}

    def fit_and_save(self, arm: Arm, pending: Any = None) -> dict[str, Any]:
        """Train ``arm`` (or take the result of its ``pending`` submitted run), log it and
        write its checkpoint; its metrics."""
        from capsnet import models
        from capsnet.models import checkpoint

        spec, split, key, fields = arm.spec, arm.split, arm.key, arm.fields
        role, score, comparison = arm.role, arm.score, arm.comparison

        run_config = {**self.best["config"], "model": spec.model}
        if "augment" in run_config:
            run_config["augment"] = spec.augment
        wandb_config = {
            **used_settings(run_config, spec.model, spec.train.loss),
            "dataset": spec.dataset, **fields, "epochs": spec.train.epochs,
            "batch_size": spec.train.batch_size, "seed": spec.train.seed,
            "time_budget": spec.train.time_budget, "comparison": comparison,
            "train_images": len(split.train),
            "val_images": len(split.val) if split.val is not None else 0,
        }  # fmt: skip
        wandb_run = tracking.start_run(
            self.sweep.wandb.project, self.sweep.name, f"train-{key}", self.mode,
            self.sweep.wandb.dir, wandb_config,
        )  # fmt: skip
        budget = spec.train.time_budget
        length = f"{budget:.1f} s" if budget is not None else f"{spec.train.epochs} epoch(s)"
        self.log(f"training {key} on {len(split.train)} images for {length}")
        try:
            report = self._reporter(wandb_run, key)
            result, measured = self._train(spec, split, score, report, pending)
            metrics = {
                "model": spec.model,
                **fields,
                "parameters": models.count_parameters(result.model),
                "epochs": len(result.history),
                "train_images": result.train_images,
                **measured,
                **result.compile,
            }
            if wandb_run is not None:
                wandb_run.summary.update(run_summary(metrics, spec.dataset))
        finally:
            if wandb_run is not None:
                tracking.finish_all([wandb_run])
        extra = {"run_config": run_config, "sweep": self.best.get("sweep"), **fields}
        extra |= {"sweep_trial": self.best.get("trial_id"), "data": result.data}
        if role is not None:
            extra["role"] = role
        if comparison is not None:
            extra["comparison"] = comparison
        checkpoint.save(
            self.staging / f"{key}.pt", result.model, train_config=result.train_config.to_dict(),
            metrics={**metrics, "history": result.history}, extra=extra,
        )  # fmt: skip
        self.log(f"saved {key}.pt (into {self.out_dir} once every run is done)")
        return metrics

    def _train(self, spec: RunSpec, split: Split, score: Score | None, report, pending=None):
        """(RunResult, its times, device, node and scores): trained through the runner (or
        ``pending``, the run submitted for it); ``report`` sees each epoch as it ends, or all
        of them when a remote run returns."""
        live = None if self.runner.remote else report
        load_before = os.getloadavg()[0]
        if pending is None:
            pending = self.runner.submit(fit_and_score, spec, split, score, live)
        result, scores, device = self.runner.result(pending)
        load = {} if self.runner.remote else {
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "cpus": os.cpu_count(),
        }  # fmt: skip
        if live is None:
            for record in result.history:
                report(record)
        if "test_accuracy" in scores:
            self.log(f"{spec.model}: smallnorb test accuracy {scores['test_accuracy']:.4f}")
        measured = {
            "train_seconds": round(result.clock_seconds, 3),
            "time_clock": result.clock,
            "wall_seconds": round(result.train_seconds, 3),
            "device": device,
            **load,
            **({"node": self.runner.nodes[-1]} if self.runner.remote else {}),
            "val_accuracy": result.history[-1].get("val_accuracy"),
            **scores,
        }
        return result, measured

    def _reporter(self, wandb_run, name: str):
        def on_epoch(record, *_):
            val = record.get("val_accuracy")
            self.log(
                f"{name} epoch {record['epoch']}: loss {record['train_loss']:.4f}"
                + (f" val acc {val:.4f}" if val is not None else "")
                + f" ({record['seconds']:.1f} s)"
            )
            if wandb_run is not None:
                wandb_run.log(record, step=record["epoch"])

        return on_epoch
