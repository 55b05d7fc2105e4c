"""Restoring a Tune experiment: only the state this project wrote, under today's settings.

Tune unpickles an experiment's state files (``tuner.pkl``, ``experiment_state-*.json``, the
searcher's) when it restores one, so a planted file would run its code. ``record_state``
writes the sha256 of every file at the top of the experiment directory to ``STATE_FILE``
beside them (atomically, after every snapshot Tune takes: ``StateRecorder``, and after every
``fit``); ``restore_tuner`` refuses to restore a
directory whose files differ from that record or that has none. Trial checkpoints are read
with ``torch.load(weights_only=True)`` (pipeline/sweep/trainable.py), so they need no record.

A restored tuner keeps the TuneConfig it was made with; ``cap_concurrency`` sets the
current ``max_concurrent_trials`` on its searcher (``CappedVariantGenerator`` keeps it over
the searcher's saved state) and on its scheduler (``CappedFIFO``, ``CappedASHA``), which
also holds back restored unfinished trials beyond the cap (PAUSED until a slot is free).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ray.tune import Callback
from ray.tune.experiment import Trial
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import BasicVariantGenerator

from capsnet.io.files import LOCK_NAME, atomic_write_json, is_temporary, read_json
from pipeline.sweep.errors import SweepError

#: The record of the experiment's state files this project wrote, beside them.
STATE_FILE = "capsnet-state.json"


def state_entries(directory: Path) -> list[str]:
    """Sorted names at the top of the experiment directory that Tune wrote: all but the
    record, the lock and temporaries ([] when the directory is missing)."""
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n for n in names if n not in (STATE_FILE, LOCK_NAME) and not is_temporary(n))


def state_digests(experiment_path: str | os.PathLike) -> dict[str, str]:
    """{name: sha256} of the regular files at the top of the experiment directory (not the
    record, the lock or temporaries)."""
    directory = Path(experiment_path)
    return {
        name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
        for name in state_entries(directory)
        if not (directory / name).is_dir()
    }


def record_state(experiment_path: str | os.PathLike) -> None:
    """Write STATE_FILE: the digests of the state Tune just wrote (local storage only)."""
    if "://" in str(experiment_path) or not Path(experiment_path).is_dir():
        return
    atomic_write_json(
        Path(experiment_path) / STATE_FILE, {"sha256": state_digests(experiment_path)}
    )


class StateRecorder(Callback):
    """``record_state`` after every experiment snapshot Tune takes (it snapshots at the end
    of a step, before ``on_step_end``), so a driver killed between two resumes from its
    last snapshot; the files are hashed only when their sizes or times changed."""

    def __init__(self, experiment_path: str):
        self.experiment_path = experiment_path
        self._seen: dict[str, tuple[int, int]] | None = None

    def _stats(self) -> dict[str, tuple[int, int]]:
        directory = Path(self.experiment_path)
        stats = {}
        for name in state_entries(directory):
            try:
                found = (directory / name).stat()
            except FileNotFoundError:
                continue
            stats[name] = (found.st_mtime_ns, found.st_size)
        return stats

    def on_step_end(self, iteration, trials, **info):
        stats = self._stats()
        if stats != self._seen:
            record_state(self.experiment_path)
            self._seen = stats

    def __getstate__(self):
        return {"experiment_path": self.experiment_path, "_seen": None}


def verify_state(experiment_path: str | os.PathLike) -> None:
    """SweepError naming the directory unless its state files are exactly the recorded
    ones (remote storage is trusted as it is)."""
    if "://" in str(experiment_path):
        return
    fresh = "remove that directory to start the sweep afresh"
    record = Path(experiment_path) / STATE_FILE
    if not record.is_file():
        raise SweepError(
            f"{experiment_path}: saved sweep state without the {STATE_FILE} capsnet sweep "
            f"writes, not restored (Tune would unpickle it); {fresh}"
        )
    saved = read_json(record, error=SweepError)
    recorded = saved.get("sha256") if isinstance(saved, dict) else None
    if recorded != state_digests(experiment_path):
        raise SweepError(
            f"{experiment_path}: saved sweep state differs from the one capsnet sweep "
            f"recorded in {STATE_FILE}, not restored (Tune would unpickle it); {fresh}"
        )


def restore_tuner(experiment_path: str, trainable, **options):
    """``tune.Tuner.restore`` of a verified experiment; SweepError naming the state
    when it is not the recorded one or cannot be read (a truncated tuner.pkl)."""
    from ray import tune

    verify_state(experiment_path)
    try:
        return tune.Tuner.restore(experiment_path, trainable=trainable, **options)
    except Exception as exc:  # whatever unpickling damaged state raises
        from capsnet.cli.boundary import error_cause

        raise SweepError(
            f"{experiment_path}: the saved sweep state cannot be read ({error_cause(exc)}); "
            "remove that directory to start the sweep afresh"
        ) from exc


class CappedVariantGenerator(BasicVariantGenerator):
    """Tune's variant generator whose cap survives restoring its saved state."""

    def set_state(self, state):
        cap = self.max_concurrent
        super().set_state(state)
        self.max_concurrent = cap


class _Capped:
    """A scheduler that starts no trial while ``cap`` trials are pending or running (0:
    no cap); a restored unfinished trial beyond the cap waits PAUSED."""

    cap = 0

    def _busy(self, controller) -> int:
        return sum(t.status in (Trial.PENDING, Trial.RUNNING) for t in controller.get_trials())

    def on_trial_add(self, controller, trial):
        super().on_trial_add(controller, trial)
        if self.cap and trial.status == Trial.PENDING and self._busy(controller) > self.cap:
            trial.set_status(Trial.PAUSED)

    def choose_trial_to_run(self, controller):
        if self.cap and self._busy(controller) >= self.cap:
            return None
        return super().choose_trial_to_run(controller)


class CappedFIFO(_Capped, FIFOScheduler):
    """FIFOScheduler with ``_Capped``'s cap."""


class CappedASHA(_Capped, ASHAScheduler):
    """ASHAScheduler with ``_Capped``'s cap."""


def cap_concurrency(tuner, cap: int | None) -> None:
    """Set ``cap`` (None: no cap) on a tuner's searcher and scheduler: a restored tuner runs
    under the current ``max_concurrent_trials``, not the one it was made with."""
    config = tuner._local_tuner._tune_config  # Tuner.restore takes no TuneConfig
    config.search_alg.max_concurrent = cap or 0
    config.scheduler.cap = cap or 0
