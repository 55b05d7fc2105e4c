"""The Ray Tune sweep: search space from params, ``run_sweep`` (start or resume), failures.

Every trial starts from one base RunSpec (``base_spec``: the sweep's data, sizes, epochs and
seed, params.yaml's augmentation and smallNORB settings) and trains through
``capsnet.training.run`` (pipeline/sweep/trainable.py). The data is loaded once by the
driver and reaches trials through the object store, so trials on other machines need no
data directory.

The Tune experiment is named ``<sweep.name>-<fingerprint>``, the fingerprint hashing
everything a trial reads: the sweep settings that change results, the augmentation and
smallNORB settings the trials use, the bytes of the training and validation data and the
code the stage runs (its DVC code deps, the search space and scheduler included). Change
any of them and the sweep starts a new experiment; an interrupted run of the same one is
restored. The experiment lives under ``storage_path`` (relative: in the repository the
experiment started in, beside W&B's runs), never in a DVC output, so DVC's run-cache can
restore the stage and queued experiments share the state. Trials are named by their
number in Tune's generation order and sampled dimensions are drawn from ``sweep.seed``, so
a rerun writes the same bytes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from capsnet.config import DATA_ROOT, SEARCHABLE, Params, SearchSpace, SweepConfig, dataset_specs
from capsnet.io.errors import ConfigError
from capsnet.io.files import locked
from capsnet.training.run import RunSpec, Split, section_spec
from pipeline import tracking
from pipeline.cluster import ray_reaper
from pipeline.cluster.gpu_worker import connect
from pipeline.sweep import results
from pipeline.sweep.errors import SweepError, SweepInterrupted


@dataclass
class SweepData:
    """What the driver sends every trial: the split and, for MNIST, the rotated
    validation images (``sweep.rotation_angle``)."""

    split: Split
    rotated: Any = None


@dataclass
class SweepOutcome:
    experiment_path: str
    rows: list[dict[str, Any]]
    best: dict[str, Any] | None
    restored: bool
    outputs: dict[str, str] = field(default_factory=dict)


#: Checkpoints Tune keeps per trial (the last one resumes an interrupted trial).
CHECKPOINTS_KEPT = 3


def base_spec(
    sweep: SweepConfig, params: Params | None = None, data_root=DATA_ROOT, mirror=None
) -> RunSpec:
    """The RunSpec every trial of ``sweep`` starts from (no progress bars in trials)."""
    return section_spec(sweep, sweep, params, data_root, mirror, progress=False)


def load_data(sweep: SweepConfig, base: RunSpec) -> SweepData:
    """The sweep's split and, for MNIST, its validation images rotated by
    ``sweep.rotation_angle``."""
    from capsnet.data.datasets import rotated
    from capsnet.training.run import load_split

    split = load_split(base)
    if not dataset_specs.get(sweep.dataset).rotated_validation:
        return SweepData(split)
    return SweepData(split, rotated(split.val, sweep.rotation_angle, "val-rot"))


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


def space_values(space: SearchSpace, name: str) -> list:
    """The values a dimension can take ([] when drawn from a range)."""
    value = getattr(space, name)
    if isinstance(value, dict):
        ((kind, values),) = value.items()
        return list(values) if kind in ("grid", "choice") else []
    return [value]


def validate_space(sweep: SweepConfig, base: RunSpec) -> None:
    """Every model and augmentation named in the space exists and fits the data (checked
    before Ray starts); the error names the section."""
    from capsnet.training.run import check

    for model in space_values(sweep.space, "model"):
        for augment in space_values(sweep.space, "augment"):
            try:
                check(dataclasses.replace(base, model=model, augment=augment))
            except ConfigError as exc:
                raise ConfigError(f"{sweep.SECTION}.space: {exc}") from None


def _digest(values) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()


def data_digest(data: SweepData) -> str:
    """sha256 of every tensor of the split (images, labels, smallNORB info rows)."""
    digest = hashlib.sha256()
    for dataset in (data.split.train, data.split.val, data.rotated):
        for name in ("images", "targets", "labels", "info"):
            tensor = getattr(dataset, name, None)
            if isinstance(tensor, torch.Tensor):
                digest.update(name.encode())
                digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def code_files(root: Path, sweep: SweepConfig) -> list[str]:
    """The files the results of ``sweep`` depend on, relative to ``root``: the import
    closure of ``python -m capsnet sweep`` for the datasets the sweep section names
    (``pipeline.dvc.reach``), which is also the sweep stage's code deps in dvc.yaml."""
    from capsnet import cli
    from pipeline.dvc import deps as dvc_deps
    from pipeline.dvc import reach

    declared = reach.declarations(root, dvc_deps.project_packages(root))
    datasets = reach.named([sweep], declared)
    return sorted(dvc_deps.command_closure(root, "capsnet", cli.__name__, ["sweep"], datasets))


def code_digest(sweep: SweepConfig, root: Path | None = None) -> str:
    """sha256 of ``code_files`` in ``root``, by default the repository this process
    imported capsnet/ from (a queued experiment's own copy under ``python -m``)."""
    import capsnet

    root = Path(capsnet.__file__).resolve().parents[1] if root is None else root
    digest = hashlib.sha256()
    for name in code_files(root, sweep):
        digest.update(name.encode())
        digest.update((root / name).read_bytes())
    return digest.hexdigest()


def fingerprint(sweep: SweepConfig, base: RunSpec, data: SweepData) -> str:
    """Hash of everything a trial reads (not resources, storage, retries or W&B)."""
    settings = sweep.to_dict()
    unread = ("resources", "storage_path", "max_failures", "checkpoint", "reuse_actors", "wandb",
              "compile")  # fmt: skip
    for name in unread:
        settings.pop(name)
    settings["amp"] = base.train.amp  # null and TrainConfig's default train alike
    blocks = {
        s: getattr(base.augment_params, s, None) for s in space_values(sweep.space, "augment")
    }
    used = {  # the settings of the strategies the space uses, no other augment key
        "augment": {s: dataclasses.asdict(b) if b is not None else None for s, b in blocks.items()},
        "data": dataclasses.asdict(base.settings()) if base.data.self_augmenting else None,
    }
    parts = [_digest(settings), _digest(used), data_digest(data), code_digest(sweep)]
    return _digest(parts)[:12]


def check_resources(cpus: float, gpus: float, *, address: str) -> None:
    """Fail before any trial starts when no node can ever hold one trial (which Tune would
    otherwise leave PENDING forever)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]

    def has(node, kind):
        return node["Resources"].get(kind, 0)

    if gpus > 0 and sum(has(n, "GPU") for n in nodes) == 0:
        raise ConfigError(
            f"sweep.resources.gpus_per_trial is {gpus:g} but the Ray cluster at {address} "
            f"has no GPUs ({len(nodes)} node(s), {sum(has(n, 'CPU') for n in nodes):g} CPUs); "
            f"set gpus_per_trial: 0 or connect to a cluster with GPU workers"
        )
    if not any(has(n, "CPU") >= cpus and has(n, "GPU") >= gpus for n in nodes):
        largest = max(((has(n, "CPU"), has(n, "GPU")) for n in nodes), default=(0, 0))
        raise ConfigError(
            f"no node of the Ray cluster at {address} has {cpus:g} CPU(s) and {gpus:g} "
            f"GPU(s) for one trial (largest node: {largest[0]:g} CPUs, {largest[1]:g} GPUs)"
        )


def storage_root(storage: str) -> str:
    """Where Tune keeps the sweep's experiments: a URI as given, a relative directory under
    the repository the experiment started in (``tracking.workspace_path``)."""
    if "://" in storage:
        return storage.rstrip("/")
    return str(tracking.workspace_path(storage))


#: The address every server of a local Ray instance listens on: this machine alone.
LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def _loopback_node():
    """Let ``ray.init(_node_ip_address=LOOPBACK)`` keep that address: Ray replaces a loopback
    node address by the machine's own unless its cluster support is off (the switch it
    keeps for Windows and macOS), and its servers listen on the node address."""
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def _init_ray(address: str, num_cpus: int | None, mode: str) -> bool:
    """Start or join Ray unless this process already did; True when this call did."""
    import ray

    if ray.is_initialized():
        return False
    options = {
        "log_to_driver": False,
        "runtime_env": {"env_vars": {"WANDB_MODE": mode, "WANDB_SILENT": "true"}},
    }
    if address == "local":
        # watched from before ray.init: what Ray starts ends with this process, even one
        # SIGKILLed while Ray is still starting
        ray_reaper.watch()
        try:
            with _loopback_node():  # its gRPC ports reachable from this machine only
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                         _node_ip_address=LOOPBACK, **options)  # fmt: skip
        except BaseException:
            ray.shutdown()
            ray_reaper.stop()
            raise
    else:
        connect(address, **options)
    return True


def _trainable(sweep: SweepConfig, base: RunSpec, data: SweepData):
    from ray import tune

    from pipeline.sweep.trainable import train_trial

    resources = sweep.resources
    threads = max(1, math.floor(resources.cpus_per_trial))
    trial = tune.with_parameters(
        train_trial, base=base, split=data.split, rotated=data.rotated, threads=threads,
        checkpoint_every=sweep.checkpoint.every_epochs,
        keep_optimizer=sweep.checkpoint.keeps_optimizer(sweep.max_failures),
    )  # fmt: skip
    return tune.with_resources(
        trial,
        {"cpu": resources.cpus_per_trial, "gpu": resources.gpus_per_trial},
    )


def trial_dirname(trial) -> str:
    """Trial directories named by the trial's number (results.csv's trial_id column)."""
    return f"trial_{tracking.trial_number(trial.trial_id)}"


def _new_tuner(
    sweep: SweepConfig, trainable, name: str, storage: str, callbacks, mode: str, shared=None
):
    from ray import tune

    from pipeline.sweep.restore import (
        CappedASHA,
        CappedFIFO,
        CappedVariantGenerator,
        StateRecorder,
    )

    scheduler = CappedFIFO()
    if sweep.asha.enabled:
        scheduler = CappedASHA(
            time_attr="epoch",
            max_t=sweep.epochs,
            grace_period=sweep.asha.grace_period,
            reduction_factor=sweep.asha.reduction_factor,
        )
    callbacks = [StateRecorder(f"{storage}/{name}"), *(callbacks or [])]
    wandb_callback = tracking.sweep_callback(
        sweep.wandb.project, sweep.name, mode, sweep.wandb.dir, shared
    )
    if wandb_callback is not None:
        callbacks.append(wandb_callback)
    return tune.Tuner(
        trainable,
        param_space=param_space(sweep.space),
        tune_config=tune.TuneConfig(
            metric=sweep.metric,
            mode="max",
            scheduler=scheduler,
            # sampled dimensions drawn from the sweep's seed: the same trials on every run;
            # generator and scheduler hold the cap, set by run_sweep (cap_concurrency)
            search_alg=CappedVariantGenerator(random_state=sweep.seed),
            num_samples=sweep.num_samples,
            reuse_actors=sweep.reuse_actors,
            trial_dirname_creator=trial_dirname,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage,
            failure_config=tune.FailureConfig(max_failures=sweep.max_failures),
            # Tune forces an experiment snapshot once a trial has made num_to_keep new
            # checkpoints: at 1 after every epoch of every trial, which repeats its
            # "snapshotting has been triggered multiple times" warning on short epochs
            checkpoint_config=tune.CheckpointConfig(num_to_keep=CHECKPOINTS_KEPT),
            callbacks=callbacks,
            verbose=1,
        ),
    )


def run_sweep(
    sweep: SweepConfig,
    base: RunSpec,
    *,
    out_dir: str | os.PathLike = "sweep",
    address: str = "local",
    data: SweepData | None = None,
    callbacks: list | None = None,
    num_cpus: int | None = None,
    interrupted=lambda: False,
) -> SweepOutcome:
    """Run (or resume) the sweep and write results.csv, best.json and the plot data.

    Joins ``address`` ("local": a private instance) unless Ray is already initialised in
    this process. Raises SweepError naming the trials that still errored after their
    retries, SweepInterrupted when ``interrupted()`` or unfinished trials say the driver
    was interrupted; neither writes any output."""
    from ray import tune

    from pipeline.sweep.restore import cap_concurrency, record_state, restore_tuner

    validate_space(sweep, base)
    mode = tracking.prepare_environment(sweep.wandb.mode)
    data = data if data is not None else load_data(sweep, base)
    storage = storage_root(sweep.storage_path)
    name = f"{sweep.name}-{fingerprint(sweep, base, data)}"
    experiment_path = f"{storage}/{name}"
    owns_ray = _init_ray(address, num_cpus, mode)
    try:
        resources = sweep.resources
        check_resources(resources.cpus_per_trial, resources.gpus_per_trial, address=address)
        with _one_driver(experiment_path), _storage_errors(sweep, experiment_path):
            trainable = _trainable(sweep, base, data)
            restored = tune.Tuner.can_restore(experiment_path)
            if restored:
                tuner = restore_tuner(
                    experiment_path, trainable, resume_unfinished=True, resume_errored=True
                )
            else:
                shared = tracking.sweep_run_config(sweep, base, data.split)
                tuner = _new_tuner(sweep, trainable, name, storage, callbacks, mode, shared)
            cap_concurrency(tuner, resources.max_concurrent_trials)
            try:
                fitted = tuner.fit()
            finally:
                record_state(experiment_path)
            expected = expected_trials(sweep.space, sweep.num_samples)
            unfinished = _unfinished_trials(experiment_path, trainable, expected)
            if unfinished or interrupted():
                raise SweepInterrupted(
                    f"sweep interrupted with {unfinished} unfinished trial(s); its state is in "
                    f"{experiment_path} and the next run resumes it",
                    experiment_path,
                )
            rows = results.result_rows(fitted, sweep)
            _raise_errored(rows, sweep, experiment_path)  # a failed sweep writes no best.json
            best = results.best_result(fitted, sweep, experiment=name)
            outputs = results.write_outputs(out_dir, rows, best, sweep)
    finally:
        if owns_ray:
            import ray

            ray.shutdown()
            ray_reaper.stop()
    return SweepOutcome(experiment_path, rows, best, restored, outputs)


def _one_driver(experiment_path: str):
    """The lock of a local experiment directory (``capsnet.io.files.locked``): queued experiments
    share the storage, so a second driver of the same sweep waits for the first and then
    restores what it finished; none for remote storage."""
    if "://" in experiment_path:
        return contextlib.nullcontext()
    return locked(experiment_path)


@contextlib.contextmanager
def _storage_errors(sweep: SweepConfig, experiment_path: str):
    """A full disk met while Tune writes its state (an OSError naming no file, often
    without an errno: pyarrow's) is reported as the storage's, not as an input's."""
    from capsnet.cli.boundary import OS_ERRORS, os_errno

    try:
        yield
    except OSError as exc:
        code = os_errno(exc)
        if exc.filename is not None or code not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise SweepError(
            f"{experiment_path}: {OS_ERRORS[code][0]} while Tune saved the sweep's state "
            f"({sweep.SECTION}.storage_path {sweep.storage_path}): free space there or set "
            f"{sweep.SECTION}.storage_path elsewhere"
        ) from exc


def _raise_errored(rows, sweep: SweepConfig, experiment_path: str) -> None:
    errored = [row for row in rows if row["status"] == "ERROR"]
    if errored:
        names = ", ".join(f"{row['trial_id']} ({row['error']})" for row in errored)
        raise SweepError(
            f"{len(errored)} of {len(rows)} trial(s) errored after "
            f"{sweep.max_failures} retries: {names}; see {experiment_path}"
        )


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
    from pipeline.sweep.restore import restore_tuner

    saved = restore_tuner(experiment_path, trainable).get_results()
    return expected - saved.num_terminated - saved.num_errors
