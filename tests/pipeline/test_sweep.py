"""The tiny local sweep, its outputs and W&B runs, and the GPU check (quick suite)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from sweephelpers import ONE_PROCESS, base, lenet5_space

from capsnet.config import SEARCHABLE
from capsnet.io.errors import ConfigError
from pipeline import tracking
from pipeline.sweep import results
from pipeline.sweep.stage import param_space, run_sweep, storage_root


@pytest.fixture(scope="module")
def local_ray():
    """One private local Ray instance (2 CPUs, no GPU) for this module's sweeps."""
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_param_space_maps_grid_and_distributions(tiny_sweep):
    from ray.tune.search.sample import Categorical, Float

    sweep = tiny_sweep(
        space={
            "routing_iterations": {"grid": [1, 2]},
            "lr": {"loguniform": [1e-4, 1e-2]},
            "augment": {"choice": ["none", "shift"]},
        }
    )
    space = param_space(sweep.space)
    assert space["routing_iterations"] == {"grid_search": [1, 2]}
    assert isinstance(space["lr"], Float) and space["lr"].lower == 1e-4
    assert isinstance(space["augment"], Categorical)
    assert space["m_plus"] == 0.9 and set(space) == set(SEARCHABLE)


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


#: The tiny sweep's grid with a sampled learning rate (drawn from the sweep's seed).
SAMPLED = {
    "model": "capsnet-small",
    "routing_iterations": {"grid": [1, 3]},
    "augment": "none",
    "lr": {"loguniform": [0.001, 0.002]},
}


def test_tiny_sweep_completes_locally(local_ray, tiny_sweep, sweep_data, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # restored after the W&B-less rerun below
    sweep = tiny_sweep(space=SAMPLED, resources=ONE_PROCESS)
    out = tmp_path / "sweep"
    outcome = run_sweep(sweep, base(sweep), out_dir=out, data=sweep_data)

    rows = read_csv(out / "results.csv")
    # trials by their number in Tune's order (the grid's), in directories of that name
    assert [(r["trial_id"], r["routing_iterations"]) for r in rows] == [
        ("00000", "1"),
        ("00001", "3"),
    ]
    trial_dirs = sorted(p.name for p in Path(outcome.experiment_path).glob("trial_*"))
    assert trial_dirs == ["trial_00000", "trial_00001"]
    assert {r["status"] for r in rows} == {"TERMINATED"}
    # no node ids or wall times: what a rerun on the same machine reproduces
    assert list(rows[0]) == results.result_columns(sweep)
    assert not {"node", "seconds"} & set(rows[0])
    for row in rows:
        assert row["model"] == "capsnet-small" and row["epochs"] == "1"
        assert row["device"] == "cpu" and 0.001 <= float(row["lr"]) <= 0.002
        for key in ("final_val_accuracy", "best_val_accuracy", "final_val_rotated_accuracy"):
            assert 0.0 <= float(row[key]) <= 1.0
        # every parameter the sweep records; the smallNORB ablation axes, left at their
        # neutral values, add no columns to an MNIST sweep's results
        assert set(sweep.parameters()) <= set(row) and "pose" not in row

    best = json.loads((out / "best.json").read_text())
    top = max(rows, key=lambda r: float(r["final_val_accuracy"]))
    assert best["trial_id"] == top["trial_id"]
    assert best["experiment"] == Path(outcome.experiment_path).name
    assert best["config"]["routing_iterations"] == int(top["routing_iterations"])
    assert best["metrics"]["val_accuracy"] == pytest.approx(float(top["final_val_accuracy"]))
    assert outcome.restored is False

    by_routing = read_csv(out / "plots" / "by_routing.csv")
    assert [r["routing_iterations"] for r in by_routing] == ["capsnet-small/1", "capsnet-small/3"]
    assert [r["augment"] for r in read_csv(out / "plots" / "by_augment.csv")] == ["none"]

    # one offline W&B run per trial (its trial id in the config), grouped by sweep and
    # stage, with its metrics
    found = tracking.offline_runs(tmp_path / "runs").values()
    runs = {tracking.read_run_info(d)["config"]["trial_id"]: d for d in found}
    assert set(runs) == {r["trial_id"] for r in rows}
    for row in rows:
        info = tracking.read_run_info(runs[row["trial_id"]])
        assert (info["group"], info["job_type"]) == ("tiny/sweep", "sweep")
        history = tracking.read_history(runs[row["trial_id"]])
        assert [h["epoch"] for h in history] == [1]
        assert history[-1]["val_accuracy"] == pytest.approx(float(row["final_val_accuracy"]))
        assert history[-1]["val_rotated_accuracy"] == pytest.approx(
            float(row["final_val_rotated_accuracy"])
        )

    # the same sweep again is restored, not rerun: finished trials keep their results
    tracked = tree_bytes(out)
    assert set(tracked) == {
        "results.csv",
        "best.json",
        "plots/by_routing.csv",
        "plots/by_augment.csv",
    }
    again = run_sweep(sweep, base(sweep), out_dir=out, data=sweep_data)
    assert again.restored is True
    assert tree_bytes(out) == tracked

    # trained afresh (new Tune state, W&B off), it writes the same bytes
    fresh = tiny_sweep(
        space=SAMPLED,
        resources=ONE_PROCESS,
        storage_path=str(tmp_path / "ray2"),
        wandb={"mode": "disabled"},
    )
    rerun = run_sweep(fresh, base(fresh), out_dir=tmp_path / "rerun", data=sweep_data)
    assert rerun.restored is False and rerun.experiment_path != outcome.experiment_path
    assert tree_bytes(tmp_path / "rerun") == tracked


def test_a_relative_storage_path_lands_in_the_experiments_repository(tmp_path, monkeypatch):
    """Queued experiments run in a temporary copy; Tune's state goes where W&B's runs go."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "main"))
    assert storage_root("runs/ray") == str(tmp_path / "main" / "runs" / "ray")
    assert storage_root(str(tmp_path / "abs")) == str(tmp_path / "abs")
    assert storage_root("s3://bucket/sweeps/") == "s3://bucket/sweeps"


def test_gpu_request_on_cpu_cluster_fails_before_any_trial(
    local_ray, tiny_sweep, sweep_data, tmp_path
):
    sweep = tiny_sweep(resources={"gpus_per_trial": 0.5})
    with pytest.raises(
        ConfigError,
        match=r"gpus_per_trial is 0.5 but the Ray cluster .* has "
        r"no GPUs",
    ):
        run_sweep(sweep, base(sweep), out_dir=tmp_path / "sweep", data=sweep_data)
    assert not (tmp_path / "ray").exists()  # no experiment was started
    assert not (tmp_path / "sweep").exists()


def test_a_cluster_without_gpus_keeps_gpu_worker_stages_in_this_process(local_ray):
    """Final training and the viewpoints (pipeline.cluster.gpu_worker) stay in this process."""
    from pipeline.cluster.gpu_worker import placement

    lines: list[str] = []
    with placement("local", lines.append) as runner:
        assert runner.remote is False and runner(os.getpid) == os.getpid()
    assert lines == ["training in this process: the Ray cluster at local has no GPU"]


def test_trial_larger_than_every_node_fails_fast(local_ray, tiny_sweep, sweep_data, tmp_path):
    sweep = tiny_sweep(resources={"cpus_per_trial": 8})
    with pytest.raises(ConfigError, match="no node of the Ray cluster"):
        run_sweep(sweep, base(sweep), out_dir=tmp_path / "sweep", data=sweep_data)


def test_unknown_augmentation_fails_before_ray(tiny_sweep, sweep_data, tmp_path):
    sweep = tiny_sweep(space={"augment": {"grid": ["none", "wobble"]}})
    with pytest.raises(ConfigError, match=r"sweep\.space: augment\.strategy 'wobble' unknown"):
        run_sweep(sweep, base(sweep), out_dir=tmp_path / "sweep", data=sweep_data)


# --- the experiment name hashes everything a trial reads ---------------------------------


def test_fingerprint_follows_what_trials_read(tiny_sweep, sweep_data, monkeypatch):
    import dataclasses

    from capsnet.config import AugmentParams, RotateAugment, ShiftAugment
    from pipeline.sweep import stage as sweep_module
    from pipeline.sweep.stage import SweepData, fingerprint

    # the code's digest, read once (each reading walks the stage's import closure); what
    # changes it is tests/faults/test_fault_experiments.py's
    code = sweep_module.code_digest()
    monkeypatch.setattr(sweep_module, "code_digest", lambda: code)

    sweep = tiny_sweep(space={"augment": {"grid": ["none", "shift"]}})
    spec = base(sweep)
    reference = fingerprint(sweep, spec, sweep_data)
    assert fingerprint(sweep, base(sweep), sweep_data) == reference  # deterministic

    wider = dataclasses.replace(spec, augment_params=AugmentParams(shift=ShiftAugment(pixels=3)))
    assert fingerprint(sweep, wider, sweep_data) != reference  # a strategy the space uses
    rotate = dataclasses.replace(
        spec, augment_params=AugmentParams(rotate=RotateAugment(degrees=1.0))
    )
    assert fingerprint(sweep, rotate, sweep_data) == reference  # a strategy it does not use

    images, labels = sweep_data.split.train.tensors
    changed = images.clone()
    changed[0, 0, 0, 0] ^= 1  # one bit of one training pixel
    other = SweepData(
        dataclasses.replace(sweep_data.split, train=type(sweep_data.split.train)(changed, labels)),
        sweep_data.rotated,
    )
    assert fingerprint(sweep, spec, other) != reference
    assert fingerprint(tiny_sweep(epochs=2), spec, sweep_data) != reference
    assert fingerprint(tiny_sweep(resources={"cpus_per_trial": 2}), spec, sweep_data) == (
        fingerprint(tiny_sweep(), spec, sweep_data)
    )
    precision = {amp: tiny_sweep(amp=amp) for amp in (None, "auto", "bf16", "fp32")}
    prints = {amp: fingerprint(s, base(s), sweep_data) for amp, s in precision.items()}
    assert prints[None] == prints["auto"]  # null: TrainConfig's auto
    assert len({prints["auto"], prints["bf16"], prints["fp32"]}) == 3


def test_changed_shift_setting_starts_a_fresh_experiment(
    local_ray, tiny_sweep, sweep_data, tmp_path
):
    """``augment.shift.pixels`` changes what a shift trial trains on: the sweep must not
    restore the experiment finished under the old setting; the same settings restore it.
    Its trials, one CPU each on two CPUs, run one at a time: only the cap keeps the
    others waiting."""
    import dataclasses

    from ray.tune import Callback

    from capsnet.config import AugmentParams, ShiftAugment

    running: list[int] = []

    class Watch(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            running.append(sum(t.status == "RUNNING" for t in trials))

    sweep = tiny_sweep(
        space={**lenet5_space(3), "augment": "shift"},
        resources={"cpus_per_trial": 1, "max_concurrent_trials": 1},
        wandb={"mode": "disabled"},
    )
    spec, data = base(sweep), sweep_data
    first = run_sweep(sweep, spec, out_dir=tmp_path / "sweep", data=data, callbacks=[Watch()])
    assert running and max(running) == 1, running
    assert len(read_csv(tmp_path / "sweep" / "results.csv")) == 3
    again = run_sweep(sweep, spec, out_dir=tmp_path / "sweep", data=data)
    assert (first.restored, again.restored) == (False, True)
    assert again.experiment_path == first.experiment_path

    shifted = dataclasses.replace(spec, augment_params=AugmentParams(shift=ShiftAugment(pixels=4)))
    fresh = run_sweep(sweep, shifted, out_dir=tmp_path / "sweep", data=data)
    assert fresh.restored is False and fresh.experiment_path != first.experiment_path


def test_a_resumed_sweep_runs_under_the_current_cap(local_ray, tiny_sweep, sweep_data, tmp_path):
    """Interrupted with two trials running under ``max_concurrent_trials: 2``, the sweep
    resumed with the cap at 1 runs one trial at a time, restored ones included."""
    import signal

    from ray.tune import Callback

    from pipeline.sweep.stage import SweepInterrupted

    log, stopped = tmp_path / "running.txt", tmp_path / "interrupted"

    class Watch(Callback):  # pickled into the experiment: the resumed run keeps it
        def on_trial_result(self, iteration, trials, trial, result, **info):
            running = sum(t.status == "RUNNING" for t in trials)
            with open(log, "a") as fh:
                fh.write(f"{running}\n")
            if running == 2 and not stopped.exists():
                stopped.touch()
                os.kill(os.getpid(), signal.SIGINT)  # Tune saves its state and stops

    def sweep(cap):
        resources = {"cpus_per_trial": 1, "max_concurrent_trials": cap}
        return tiny_sweep(space=lenet5_space(2), epochs=4, resources=resources,
                          wandb={"mode": "disabled"})  # fmt: skip

    out = tmp_path / "sweep"
    with pytest.raises(SweepInterrupted):
        run_sweep(sweep(2), base(sweep(2)), out_dir=out, data=sweep_data, callbacks=[Watch()])
    assert stopped.exists()
    log.write_text("")
    resumed = run_sweep(sweep(1), base(sweep(1)), out_dir=out, data=sweep_data)
    assert resumed.restored is True and len(resumed.rows) == 2
    counts = [int(line) for line in log.read_text().split()]
    assert counts and max(counts) == 1, counts
