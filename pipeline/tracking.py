"""W&B tracking, offline first.

Runs are offline unless an API key is configured (``WANDB_API_KEY`` or a ``wandb login``
entry in ~/.netrc) or ``wandb.mode`` says otherwise. The mode is exported as WANDB_MODE in
the driver's environment before Ray starts (Ray's own W&B integration demands an API key
unless it sees WANDB_MODE=offline there, and Ray's processes inherit it) and passed to
every ``wandb.init``. Trial runs are logged from the driver by a Tune callback, so worker
nodes need neither W&B settings nor network. Each trial run's config holds the trial's
sampled settings and what all trials share (``sweep_run_config``: epochs, batch size, data
sizes, seed, resources), plus the node and device the trial reported.

Every run says where it came from (``provenance``): the git commit, the DVC experiment
name (``$DVC_EXP_NAME`` inside ``dvc exp run``) and the hash of params.yaml, in its config;
its group is the experiment's group of its stage (``group_name``). Eval run ids follow from
the project, stage, experiment and the evaluated content (``run_id``): publishing the same
results again updates the same runs, another experiment or other numbers make new ones.
A relative W&B directory (and the sweep's Tune storage) is resolved against the repository
the experiment was started in (``$DVC_ROOT``, which DVC sets to the main workspace also for
queued experiments that run in a temporary copy), so runs outlive DVC's temporary
workspaces (``workspace_path``).

Offline runs in W&B 0.31 write no wandb-summary.json; ``read_history`` reads the logged
rows back from a run's ``.wandb`` file (a block-structured log of protobuf records).
"""

from __future__ import annotations

import hashlib
import json
import netrc
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from capsnet.io.errors import ConfigError
from pipeline.provenance import content_hash, provenance


def resolve_mode(setting: str = "auto") -> str:
    """offline | online | disabled: the explicit setting, else $WANDB_MODE, else online
    only when an API key is configured."""
    if setting != "auto":
        return setting
    env = os.environ.get("WANDB_MODE")
    if env:
        if env in ("dryrun",):
            return "offline"
        if env not in ("offline", "online", "disabled"):
            raise ConfigError(f"WANDB_MODE={env!r}: offline, online or disabled")
        return env
    return "online" if api_key_configured() else "offline"


def api_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        auth = netrc.netrc().authenticators(
            os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1]
        )
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return bool(auth and auth[2])


def prepare_environment(setting: str = "auto") -> str:
    """Resolve the mode and export it (WANDB_MODE, quiet console) for this process and the
    Ray processes it starts; returns the mode."""
    mode = resolve_mode(setting)
    os.environ["WANDB_MODE"] = mode
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ.setdefault("WANDB_CONSOLE", "off")
    return mode


#: What a trial's W&B run logs from each Tune result.
TRIAL_KEYS = (
    "epoch",
    "train_loss",
    "train_accuracy",
    "val_accuracy",
    "val_rotated_accuracy",
    "epoch_seconds",
    "eval_seconds",
    "setup_seconds",
    "time_total_s",
)


def _settings():
    import wandb

    # no console capture, no system-metrics process, no git probing: a trial's run is a
    # few rows, and nothing here may wait on the network
    return wandb.Settings(
        console="off",
        silent=True,
        init_timeout=90,
        x_disable_stats=True,
        x_disable_machine_info=True,
        disable_git=True,
        save_code=False,
    )


#: Per-trial facts a trial reports with its results, copied into its run's config.
TRIAL_FACTS = ("node", "device")


def run_id(*parts: str) -> str:
    """A W&B run id derived from ``parts`` (project, stage, experiment, entry, content
    hash): the same parts always name the same run."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def group_name(base: str, stage: str) -> str:
    """The W&B group of a stage's runs: ``base`` (the sweep or experiment name), the DVC
    experiment when inside ``dvc exp run``, and the stage, e.g. ``capsnet-sweep/eval``."""
    experiment = os.environ.get("DVC_EXP_NAME")
    return "/".join(p for p in (base, experiment, stage) if p)[:128]


def workspace_path(setting: str | os.PathLike) -> Path:
    """Where state that outlives an experiment goes (W&B's ``<dir>/wandb``, Tune's storage):
    ``setting`` as given when absolute, else under the repository the experiment started in
    ($DVC_ROOT), else the working directory."""
    path = Path(setting).expanduser()
    root = os.environ.get("DVC_ROOT")
    if not path.is_absolute() and root:
        path = Path(root) / path
    return path.resolve()


def trial_number(trial_id: str) -> str:
    """A Tune trial's number in its experiment's generation order (``"00002"`` of
    ``"05142_00002"``): Tune's trial id without the prefix it draws at random per run, so
    a rerun names its trials alike (results.csv, best.json, trial directories, W&B runs)."""
    return trial_id.rsplit("_", 1)[-1]


def sweep_run_config(sweep, base, split) -> dict[str, Any]:
    """What every trial of ``sweep`` shares, for its W&B run's config: the dataset, epochs,
    batch size and seed of the base RunSpec, the data sizes actually loaded and the
    resources a trial asks for."""
    return {
        "sweep": sweep.name,
        "dataset": base.dataset,
        "epochs": base.train.epochs,
        "batch_size": base.train.batch_size,
        "seed": base.train.seed,
        "train_size": len(split.train),
        "val_size": len(split.val) if split.val is not None else 0,
        "cpus_per_trial": sweep.resources.cpus_per_trial,
        "gpus_per_trial": sweep.resources.gpus_per_trial,
    }


def _trial_run(project: str, group: str, mode: str, directory: Path, trial, shared: dict):
    """The W&B run of one Tune trial (job_type "sweep", group ``group_name(group,
    "sweep")``): its id follows from the experiment, params and the trial's settings."""
    import wandb

    directory.mkdir(parents=True, exist_ok=True)
    origin = provenance()
    number = trial_number(trial.trial_id)
    identity = run_id(
        project, group_name(group, "sweep"), content_hash(origin), content_hash(trial.config),
        number,
    )  # fmt: skip
    return wandb.init(
        project=project,
        group=group_name(group, "sweep"),
        job_type="sweep",
        id=identity,
        name=f"{group}-{number}",
        mode=mode,
        dir=str(directory),
        config={**shared, **trial.config, "trial_id": number, **origin},
        reinit="create_new",
        settings=_settings(),
    )


def log_trial_result(run, result: dict) -> None:
    """One epoch's TRIAL_KEYS as a history row at step = epoch; the TRIAL_FACTS (node,
    device) into the run's config the first time they appear."""
    facts = {k: result[k] for k in TRIAL_FACTS if result.get(k) and k not in run.config}
    if facts:
        run.config.update(facts, allow_val_change=True)
    row = {k: result[k] for k in TRIAL_KEYS if isinstance(result.get(k), (int, float))}
    run.log(row, step=int(result.get("epoch", 0)))


def sweep_callback(
    project: str,
    group: str,
    mode: str,
    wandb_dir: str | os.PathLike,
    shared: dict[str, Any] | None = None,
):
    """A Tune callback logging one W&B run per trial (id = trial id, group = sweep name,
    job_type "sweep") from the driver, its config the trial's settings over ``shared``
    (``sweep_run_config``) plus the node and device of its first result; None when W&B
    is disabled."""
    if mode == "disabled":
        return None
    from ray.tune import Callback

    class TrialRuns(Callback):
        """Runs live in the driver process (``reinit="create_new"``: several at once), so
        a trial costs no extra Ray actors or processes and works on any cluster."""

        def __init__(self):
            self.directory = workspace_path(wandb_dir)
            self.shared = dict(shared or {})
            self.runs: dict[str, Any] = {}

        def __getstate__(self):  # Tune pickles callbacks with the experiment
            return {"directory": self.directory, "shared": self.shared, "runs": {}}

        def _run(self, trial):
            run = self.runs.get(trial.trial_id)
            if run is None:
                run = _trial_run(project, group, mode, self.directory, trial, self.shared)
                self.runs[trial.trial_id] = run
            return run

        def on_trial_start(self, iteration, trials, trial, **info):
            self._run(trial)

        def on_trial_result(self, iteration, trials, trial, result, **info):
            log_trial_result(self._run(trial), result)

        def _finish(self, trial):
            run = self.runs.pop(trial.trial_id, None)
            if run is not None:
                run.finish()

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._finish(trial)

        def on_trial_error(self, iteration, trials, trial, **info):
            self._finish(trial)

        def on_experiment_end(self, trials, **info):
            finish_all(self.runs.values())  # also an interrupted sweep's open runs
            self.runs.clear()

    return TrialRuns()


def start_run(
    project: str,
    group: str,
    name: str,
    mode: str,
    wandb_dir,
    config: dict,
    job_type="train",
    content: str | None = None,
):
    """A W&B run for one final training (job_type "train", or an evaluation: "eval") in
    ``group_name(group, job_type)``, its config ``config`` plus ``provenance``; None when
    disabled. Its id follows from the project, group, name, provenance and ``content`` (a
    hash of what the run holds; default the config's). An existing run of that id is
    continued online (``resume="allow"``) and an offline run syncs into it, never beside it."""
    if mode == "disabled":
        return None
    import wandb

    directory = workspace_path(wandb_dir)
    directory.mkdir(parents=True, exist_ok=True)
    config = {**config, **provenance()}
    group = group_name(group, job_type)
    identity = run_id(project, group, name, content or content_hash(config))
    return wandb.init(
        project=project,
        group=group,
        job_type=job_type,
        name=name,
        mode=mode,
        dir=str(directory),
        config=config,
        id=identity,
        resume="allow" if mode == "online" else None,
        settings=_settings(),
    )


def finish_all(runs) -> None:
    """Finish ``runs`` and shut W&B's service down, which waits until it has written the
    runs' files (after ``finish`` alone the last rows of an offline run may still be in
    flight)."""
    import wandb

    for run in runs:
        if run is not None:
            run.finish()
    wandb.teardown()


def offline_runs(wandb_dir: str | os.PathLike) -> dict[str, Path]:
    """{run id: run directory} of the offline runs under ``wandb_dir``/wandb."""
    runs = {}
    for path in sorted(Path(wandb_dir).glob("wandb/offline-run-*")):
        for record_file in path.glob("run-*.wandb"):
            runs[record_file.stem[len("run-") :]] = path
    return runs


_BLOCK = 32768
_RECORD_HEADER = struct.Struct("<IHB")  # crc32, length, type
_FILE_HEADER = struct.Struct("<4sHB")  # magic ":W&B", 0xBEE1, version
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> Iterator[bytes]:
    """The payloads of a ``.wandb`` file: 32 KiB blocks of chunks, each with a 7-byte
    header (crc32 of type + data, length, type); a record spans chunks FIRST..LAST."""
    data = path.read_bytes()
    ident, magic, version = _FILE_HEADER.unpack_from(data, 0)
    if ident != b":W&B" or magic != 0xBEE1 or version not in (0, 1):
        raise ValueError(f"{path}: not a W&B transaction log")
    offset, pending = _FILE_HEADER.size, b""
    while offset + _RECORD_HEADER.size <= len(data):
        room = _BLOCK - offset % _BLOCK
        if room < _RECORD_HEADER.size:  # block tail padding
            offset += room
            continue
        checksum, length, kind = _RECORD_HEADER.unpack_from(data, offset)
        start = offset + _RECORD_HEADER.size
        chunk = data[start : start + length]
        if kind == 0 and length == 0:  # zero fill at the end of a block
            offset += room
            continue
        if len(chunk) < length or zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF != checksum:
            break  # a torn write at the end of a live run
        offset = start + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
            pending = b""


def read_history(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows ``wandb.log`` wrote to an offline run, as dicts (values JSON-decoded)."""
    from wandb.proto import wandb_internal_pb2

    (record_file,) = Path(run_dir).glob("run-*.wandb")
    rows = []
    for payload in _records(record_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in record.history.item:
            key = item.key or "/".join(item.nested_key)
            row[key] = json.loads(item.value_json)
        rows.append(row)
    return rows


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any]:
    """The summary of an offline run: its last value of every key ``run.summary`` set."""
    from wandb.proto import wandb_internal_pb2

    (record_file,) = Path(run_dir).glob("run-*.wandb")
    summary: dict[str, Any] = {}
    for payload in _records(record_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


def read_run_info(run_dir: str | os.PathLike) -> dict[str, Any]:
    """group, job_type, run id, project and config of an offline run."""
    from wandb.proto import wandb_internal_pb2

    (record_file,) = Path(run_dir).glob("run-*.wandb")
    info: dict[str, Any] = {"config": {}}
    for payload in _records(record_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
            info.update(
                run_id=run.run_id,
                group=run.run_group,
                job_type=run.job_type,
                project=run.project,
                name=run.display_name,
            )
            for item in run.config.update:
                info["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                info["config"][item.key] = json.loads(item.value_json)
    return info
