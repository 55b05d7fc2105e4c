"""The tiny local sweep, its outputs and W&B runs, and the GPU check (quick suite)."""

from __future__ import annotations

import csv
import json

import pytest

from capsnet.config import SEARCHABLE
from capsnet.errors import ConfigError
from pipeline import tracking
from pipeline.tune import param_space, run_sweep


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


def test_tiny_sweep_completes_locally(local_ray, tiny_sweep, sweep_data, tmp_path):
    sweep = tiny_sweep()
    out = tmp_path / "sweep"
    outcome = run_sweep(sweep, out_dir=out, data=sweep_data)

    rows = read_csv(out / "results.csv")
    assert sorted(r["routing_iterations"] for r in rows) == ["1", "3"]
    assert {r["status"] for r in rows} == {"TERMINATED"}
    for row in rows:
        assert row["node"] and row["model"] == "capsnet-small" and row["epochs"] == "1"
        for key in ("final_val_accuracy", "best_val_accuracy", "final_val_rotated_accuracy"):
            assert 0.0 <= float(row[key]) <= 1.0
        assert float(row["seconds"]) > 0
        # every parameter the sweep records; the smallNORB ablation axes, left at their
        # neutral values, add no columns to an MNIST sweep's results
        assert set(sweep.parameters()) <= set(row) and "pose" not in row

    best = json.loads((out / "best.json").read_text())
    top = max(rows, key=lambda r: float(r["final_val_accuracy"]))
    assert best["trial_id"] == top["trial_id"]
    assert best["config"]["routing_iterations"] == int(top["routing_iterations"])
    assert best["metrics"]["val_accuracy"] == pytest.approx(float(top["final_val_accuracy"]))
    assert outcome.restored is False

    by_routing = read_csv(out / "plots" / "by_routing.csv")
    assert [r["routing_iterations"] for r in by_routing] == ["capsnet-small/1", "capsnet-small/3"]
    assert [r["augment"] for r in read_csv(out / "plots" / "by_augment.csv")] == ["none"]

    # one offline W&B run per trial (id = trial id), grouped by sweep, with its metrics
    runs = tracking.offline_runs(tmp_path / "runs")
    assert set(runs) == {r["trial_id"] for r in rows}
    for row in rows:
        info = tracking.read_run_info(runs[row["trial_id"]])
        assert (info["group"], info["job_type"]) == ("tiny", "sweep")
        history = tracking.read_history(runs[row["trial_id"]])
        assert [h["epoch"] for h in history] == [1]
        assert history[-1]["val_accuracy"] == pytest.approx(float(row["final_val_accuracy"]))
        assert history[-1]["val_rotated_accuracy"] == pytest.approx(
            float(row["final_val_rotated_accuracy"])
        )

    # the same sweep again is restored, not rerun: finished trials keep their results
    again = run_sweep(sweep, out_dir=out, data=sweep_data)
    assert again.restored is True
    assert read_csv(out / "results.csv") == rows


def test_gpu_request_on_cpu_cluster_fails_before_any_trial(
    local_ray, tiny_sweep, sweep_data, tmp_path
):
    sweep = tiny_sweep(resources={"gpus_per_trial": 0.5})
    with pytest.raises(
        ConfigError,
        match=r"gpus_per_trial is 0.5 but the Ray cluster .* has "
        r"no GPUs",
    ):
        run_sweep(sweep, out_dir=tmp_path / "sweep", data=sweep_data)
    assert not (tmp_path / "ray").exists()  # no experiment was started
    assert not (tmp_path / "sweep").exists()


def test_trial_larger_than_every_node_fails_fast(local_ray, tiny_sweep, sweep_data, tmp_path):
    sweep = tiny_sweep(resources={"cpus_per_trial": 8})
    with pytest.raises(ConfigError, match="no node of the Ray cluster"):
        run_sweep(sweep, out_dir=tmp_path / "sweep", data=sweep_data)


def test_unknown_augmentation_fails_before_ray(tiny_sweep, sweep_data, tmp_path):
    sweep = tiny_sweep(space={"augment": {"grid": ["none", "wobble"]}})
    with pytest.raises(ConfigError, match="unknown augmentation 'wobble'"):
        run_sweep(sweep, out_dir=tmp_path / "sweep", data=sweep_data)
