"""A sweep on a two-node Ray cluster on loopback: its trials run on both nodes, and those
of a node that dies move to the other (slow; tiny lenet5 trials, W&B off). An interrupted
driver resuming is tests/faults/test_fault_boundary.py's Ctrl+C case."""

from __future__ import annotations

import contextlib
import csv
import os
import signal

import pytest
from ray.tune import Callback
from sweephelpers import base, lenet5_space
from tunehelpers import trial_results

from pipeline.sweep.stage import run_sweep

pytestmark = pytest.mark.slow


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
def two_node_cluster():
    """A head node and a worker node (1 CPU each) on loopback, this process the driver.
    The GCS declares a node dead after 3 failed health checks 1 s apart (Ray's default:
    5 checks 3 s apart), so a killed worker's trials move on sooner."""
    import ray
    from ray.cluster_utils import Cluster

    health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "_system_config": health},
    )
    worker = cluster.add_node(num_cpus=1, num_gpus=0)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


EPOCHS = 3


class KillAtFirstReport(Callback):
    """Kills ``worker`` (without grace) and the trial process that reported, as Tune takes
    the first result reported from that node."""

    def __init__(self, cluster, worker):
        self.cluster, self.worker, self.killed = cluster, worker, False

    def __getstate__(self):  # Tune pickles its callbacks into the experiment state
        return {"killed": self.killed}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if not self.killed and result.get("node") == self.worker.node_id:
            self.cluster.remove_node(self.worker, allow_graceful=False)
            # remove_node ends the node's daemons, not its worker processes: the trial's own
            # process could still take Tune's next call and finish the trial where it was
            with contextlib.suppress(ProcessLookupError):
                os.kill(result["pid"], signal.SIGKILL)
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
        space=lenet5_space(2),
        wandb={"mode": "disabled"},
    )
    killer = KillAtFirstReport(cluster, worker)
    run_sweep(sweep, base(sweep), out_dir=tmp_path / "sweep", data=sweep_data, callbacks=[killer])
    assert killer.killed, "no trial ever reported from the worker node"

    rows = read_csv(tmp_path / "sweep" / "results.csv")
    assert len(rows) == 2 and {r["status"] for r in rows} == {"TERMINATED"}
    assert [r["epochs"] for r in rows] == [str(EPOCHS)] * 2
    reports = trial_results(tmp_path / "ray")
    assert set(reports) == {r["trial_id"] for r in rows}
    # trials ran on both nodes, and every trial finished on the surviving head node
    nodes = {r["node"] for rs in reports.values() for r in rs}
    assert nodes == {cluster.head_node.node_id, worker.node_id}
    assert {rs[-1]["node"] for rs in reports.values()} == {cluster.head_node.node_id}
    moved = [t for t, rs in reports.items() if any(r["node"] == worker.node_id for r in rs)]
    assert moved, "the killed node's trial left no reports"
    for trial in moved:  # resumed from its checkpoint: epochs continue, none repeated
        epochs = [r["epoch"] for r in reports[trial]]
        assert epochs[-1] == EPOCHS and sorted(set(epochs)) == list(range(1, EPOCHS + 1))
