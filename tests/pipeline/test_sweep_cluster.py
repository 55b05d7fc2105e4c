"""Sweeps on a two-node Ray cluster on loopback, node loss, and driver interrupt/resume.

Slow: the cluster tests share one head node (each adds a fresh worker node), the resume
test runs its own driver subprocesses; the trials are tiny, W&B off.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ray.tune import Callback
from sweephelpers import base

from pipeline.sweep import run_sweep

pytestmark = pytest.mark.slow


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def trial_results(experiment_root: Path) -> dict[str, list[dict]]:
    """{trial number: reported results} from every trial's result.json under the storage
    (where the node that ran each epoch is recorded; results.csv leaves it out)."""
    found = {}
    for path in experiment_root.glob("*/trial_*/result.json"):
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        rows = []
        for line in lines:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line being written right now
                break
        found[path.parent.name.removeprefix("trial_")] = rows
    return found


@pytest.fixture(scope="module")
def head_node():
    """A head node (1 CPU) on loopback, this process its driver, for the module's tests.
    Its GCS declares a node dead after 3 failed health checks 1 s apart (Ray's default:
    5 checks 3 s apart), so a killed worker's trials move on sooner."""
    import ray
    from ray.cluster_utils import Cluster

    health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "_system_config": health},
    )
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def two_node_cluster(head_node):
    """The shared head and a fresh worker node (1 CPU each), removed after the test."""
    worker = head_node.add_node(num_cpus=1, num_gpus=0)
    head_node.wait_for_nodes()
    try:
        yield head_node, worker
    finally:
        if worker in head_node.worker_nodes:
            head_node.remove_node(worker)


def test_two_node_sweep_runs_trials_on_both_nodes(
    two_node_cluster, tiny_sweep, sweep_data, tmp_path
):
    import ray

    _cluster, worker = two_node_cluster
    sweep = tiny_sweep(
        space={
            "model": "capsnet-small",
            "routing_iterations": {"grid": [1, 2, 3, 4]},
            "augment": "none",
        },
        wandb={"mode": "disabled"},
    )
    run_sweep(sweep, base(sweep), out_dir=tmp_path / "sweep", data=sweep_data)

    rows = read_csv(tmp_path / "sweep" / "results.csv")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"TERMINATED"}
    reports = trial_results(tmp_path / "ray")
    assert set(reports) == {r["trial_id"] for r in rows}
    nodes = {r["node"] for rs in reports.values() for r in rs}
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert nodes == alive and worker.node_id in nodes and len(nodes) == 2


EPOCHS = 3


class KillAtFirstReport(Callback):
    """Kills ``worker`` (without grace) as Tune takes the first result reported from it."""

    def __init__(self, cluster, worker):
        self.cluster, self.worker, self.killed = cluster, worker, False

    def __getstate__(self):  # Tune pickles its callbacks into the experiment state
        return {"killed": self.killed}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self.killed and result.get("node") == self.worker.node_id:
            self.cluster.remove_node(self.worker, allow_graceful=False)
            self.killed = True


def test_killing_the_worker_node_retries_its_trials_elsewhere(
    two_node_cluster, tiny_sweep, sweep_data, tmp_path
):
    cluster, worker = two_node_cluster
    # the kill lands as Tune takes the worker trial's first report, while the trial waits
    # for Tune to take it: two of its epochs are still to run
    sweep = tiny_sweep(
        epochs=EPOCHS,
        max_failures=3,
        space={"model": "capsnet-small", "routing_iterations": {"grid": [1, 2]}, "augment": "none"},
        wandb={"mode": "disabled"},
    )
    killer = KillAtFirstReport(cluster, worker)
    run_sweep(sweep, base(sweep), out_dir=tmp_path / "sweep", data=sweep_data, callbacks=[killer])
    assert killer.killed, "no trial ever reported from the worker node"

    rows = read_csv(tmp_path / "sweep" / "results.csv")
    assert {r["status"] for r in rows} == {"TERMINATED"}
    assert [r["epochs"] for r in rows] == [str(EPOCHS)] * 2
    # every trial finished on the surviving head node
    reports = trial_results(tmp_path / "ray")
    assert {rs[-1]["node"] for rs in reports.values()} == {cluster.head_node.node_id}
    moved = [t for t, rs in reports.items() if any(r["node"] == worker.node_id for r in rs)]
    assert moved, "the killed node's trial left no reports"
    for trial in moved:  # resumed from its checkpoint: epochs continue, none repeated
        epochs = [r["epoch"] for r in reports[trial]]
        assert epochs[-1] == EPOCHS and sorted(set(epochs)) == list(range(1, EPOCHS + 1))


def write_params(path: Path, tmp_path: Path) -> Path:
    params = {
        "augment": {"strategy": "none"},
        "sweep": {
            "name": "resume",
            "space": {
                "model": "lenet5",
                "routing_iterations": 1,
                "augment": "none",
                "lr": {"grid": [0.001, 0.002, 0.003]},
            },
            "epochs": 2,
            "batch_size": 50,
            "train_size": 300,
            "val_size": 200,
            "asha": {"enabled": False},
            "resources": {"cpus_per_trial": 1, "max_concurrent_trials": 1},
            "storage_path": str(tmp_path / "ray"),
            "wandb": {"mode": "disabled"},
        },
    }
    path.write_text(yaml.safe_dump(params))
    return path


CLI = (
    "import sys; from capsnet.cli import main; from pipeline.sweep_cli import sweep_command; "
    "main.add_command(sweep_command); main()"
)


def test_interrupted_driver_resumes_without_rerunning_finished_trials(tmp_path, mnist_root):
    params = write_params(tmp_path / "params.yaml", tmp_path)
    command = [
        sys.executable,
        "-c",
        CLI,
        "sweep",
        "--params",
        str(params),
        "--out",
        str(tmp_path / "sweep"),
        "--num-cpus",
        "1",
        "--data-root",
        str(mnist_root),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # Tune's lines arrive as printed
    env.pop("RAY_ADDRESS", None)
    first = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    # Interrupt when Tune prints that the first trial completed (its result.json is
    # flushed later, so the files cannot tell in time); two trials are still to run.
    lines = []
    try:
        for line in first.stdout:
            lines.append(line)
            if re.match(r"Trial \S+ completed after", line):
                first.send_signal(signal.SIGINT)
                break
        lines.extend(first.stdout)
        first.wait(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    output = "".join(lines)
    assert first.returncode != 0, output[-3000:]
    assert "interrupted" in output
    finished = {
        t: rs for t, rs in trial_results(tmp_path / "ray").items() if rs and rs[-1]["epoch"] == 2
    }
    assert 1 <= len(finished) < 3, f"{len(finished)} of 3 trials finished before the signal"
    assert not (tmp_path / "sweep" / "results.csv").exists(), output[-6000:]

    second = subprocess.run(command, env=env, capture_output=True, text=True)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert "resumed 3 trial(s)" in second.stdout
    rows = read_csv(tmp_path / "sweep" / "results.csv")
    assert len(rows) == 3 and {r["status"] for r in rows} == {"TERMINATED"}
    assert {r["epochs"] for r in rows} == {"2"}
    after = trial_results(tmp_path / "ray")
    for trial, reports in finished.items():  # finished trials were not trained again
        assert after[trial] == reports
