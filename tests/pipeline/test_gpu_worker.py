"""Final training and the viewpoints experiment on a GPU worker: in this process without a
Ray cluster (or with one that has no GPU: tests/pipeline/test_sweep.py, on its CPU-only
Ray); as a one-GPU Ray task on the node that has one when this machine has none (loopback
clusters declaring logical GPUs; the work itself then trains on that node's CPU)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from capsnet import config
from capsnet.config import FinalTrainConfig, SweepConfig
from capsnet.models import checkpoint
from pipeline.cluster.gpu_worker import Runner, placement
from pipeline.final.stage import train_final
from pipeline.viewpoints import stage as viewpoints

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from datahelpers import write_smallnorb_raw


def test_without_a_cluster_the_work_runs_in_this_process(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with placement() as runner:
        assert runner.remote is False and "RAY_ADDRESS unset" in runner.reason
        assert runner(os.getpid) == os.getpid()
    assert Runner()(max, 2, 5) == 5 and Runner().nodes == []


@pytest.fixture(scope="module")
def gpu_cluster():
    """A two-node loopback cluster, this module's one: a head without GPUs (this driver's)
    and a worker node declaring two GPUs; RAY_ADDRESS names it."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    worker = cluster.add_node(num_cpus=2, num_gpus=2)
    cluster.wait_for_nodes()
    before = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = cluster.address
    try:
        yield cluster, worker
    finally:
        if before is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = before
        cluster.shutdown()


def _meet(folder: Path, count: int):
    """A score that marks its arm as arrived, then waits (at most 120 s) until ``count``
    arms have: {"met": whether all of them were running at once}."""

    def score(_model, spec) -> dict:
        (folder / f"seed{spec.train.seed}").touch()
        deadline = time.monotonic() + 120
        while len(list(folder.iterdir())) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"met": len(list(folder.iterdir())) == count}

    return score


def test_final_training_arms_run_on_several_gpus_at_once(gpu_cluster, tmp_path):
    """Two seeds of one arm on the loopback cluster's worker with two logical GPUs: each
    run waits in its score for the other to arrive, so both met only if they ran at once."""
    import ray

    from capsnet.data import TensorImageDataset
    from capsnet.training.fit import TrainConfig
    from capsnet.training.run import RunSpec, Split
    from pipeline.final.stage import _Trainer, train_arms

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (16, 28, 28), dtype=torch.uint8, generator=generator)
    split = Split(TensorImageDataset(images, torch.arange(16) % 10, "tiny"), None)
    spec = RunSpec(model="lenet5", train=TrainConfig(epochs=1, batch_size=8, progress=False))
    final = FinalTrainConfig(seeds=2, equal_time=False)
    sweep = SweepConfig.from_dict({"wandb": {"mode": "disabled"}})
    (tmp_path / "met").mkdir()
    cluster, _worker = gpu_cluster
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        runner = Runner(remote=True)
        lines: list[str] = []
        trainer = _Trainer(final, sweep, {"config": {}}, lines.append, tmp_path, runner)
        results = train_arms(trainer, split, [spec], final, lambda _: {},
                             _meet(tmp_path / "met", 2))  # fmt: skip
    finally:
        ray.shutdown()
    assert list(results) == ["lenet5", "lenet5@seed1"]
    assert all(m["met"] for m in results.values())
    assert lines[0] == "2 run(s) submitted together, one GPU worker each: lenet5, lenet5@seed1"
    starts, ends = zip(*runner.spans)
    assert max(starts) < min(ends)  # every run started before any of them ended
    assert sorted(p.name for p in tmp_path.glob("*.pt")) == [f"{k}.pt" for k in results]


def _final(tmp_path: Path, out: str):
    final = FinalTrainConfig.from_dict(
        {"epochs": 1, "batch_size": 50, "train_size": 200, "val_size": 100,
         "out_dir": str(tmp_path / out), "seeds": 1, "equal_time": False}
    )  # fmt: skip
    sweep = SweepConfig.from_dict({"name": "tiny", "wandb": {"mode": "disabled"}})
    return final, sweep


def _best(path: Path) -> Path:
    config_ = {"model": "capsnet-small", "routing_iterations": 2, "augment": "none", "lr": 0.002}
    path.write_text(json.dumps({"sweep": "tiny", "trial_id": "t1", "config": config_}))
    return path


@pytest.mark.slow
def test_final_training_runs_on_the_gpu_worker_and_writes_the_same_checkpoints(
    gpu_cluster, tmp_path, mnist_root, monkeypatch
):
    _cluster, worker = gpu_cluster
    best = _best(tmp_path / "best.json")
    lines: list[str] = []
    final, sweep = _final(tmp_path, "remote")
    remote = train_final(final, sweep, best_path=best, data_root=mnist_root, log=lines.append)
    assert any("on a GPU worker of the Ray cluster" in line for line in lines)
    assert {m["node"] for m in remote.values()} == {worker.node_id}
    assert any(line.startswith("capsnet-small epoch 1: loss") for line in lines)

    monkeypatch.delenv("RAY_ADDRESS")
    final, sweep = _final(tmp_path, "local")
    local = train_final(final, sweep, best_path=best, data_root=mnist_root, log=lambda _: None)
    assert list(remote) == list(local) == ["capsnet-small", "lenet5"]
    assert all("node" not in m for m in local.values())
    for name in remote:
        model, meta = checkpoint.load(tmp_path / "remote" / f"{name}.pt")
        twin, twin_meta = checkpoint.load(tmp_path / "local" / f"{name}.pt")
        assert meta["model_config"] == twin_meta["model_config"]
        assert meta["train_config"] == twin_meta["train_config"]
        assert {k: v.shape for k, v in model.state_dict().items()} == {
            k: v.shape for k, v in twin.state_dict().items()
        }
        for key in ("epochs", "train_images", "device", "time_clock"):
            assert remote[name][key] == local[name][key]


@pytest.mark.slow
def test_viewpoints_train_on_the_gpu_worker(gpu_cluster, tmp_path):
    import ray

    from capsnet.data import stages

    def pid_and_gpus() -> tuple[int, list]:  # a closure: it travels by value
        return os.getpid(), ray.get_gpu_ids()

    _cluster, worker = gpu_cluster
    root = tmp_path / "data"
    write_smallnorb_raw(root / "raw" / "smallnorb", n=72, side=48)
    on = config.Params(data=config.DataParams(smallnorb=config.SmallnorbParams(enabled=True)))
    stages.prepare("smallnorb", on, root)
    # the smallest run: one batch of 12 training images, 12 familiar and 12 novel test
    # images, one routing iteration
    tiny = {"capsules": {"A": 8, "B": 4, "C": 4, "D": 4, "routing_iterations": 1},
            "cnn": {"channels": [4, 8], "hidden": 16}}  # fmt: skip
    params_path = tmp_path / "params.yaml"
    params_path.write_text(
        "data:\n  smallnorb: {enabled: true}\nviewpoints:\n"
        f"  out_dir: {tmp_path / 'vp'}\n  kinds: [azimuth]\n  channels: 1\n  epochs: 1\n"
        "  batch_size: 12\n  train_limit: 12\n  test_limit: 12\n  tolerance: 0.5\n"
        f"  overrides: {json.dumps(tiny)}\n"
    )
    params = config.load(params_path)
    with placement() as runner:
        payload = viewpoints.run(params, root, runner=runner)
        pid, gpus = runner(pid_and_gpus)  # one task: each GPU task is a new process
    # the capsules, the CNN, then the call above: on the worker, in a Ray worker process
    # holding one of its two GPUs (which one: whichever Ray had free)
    assert runner.remote and runner.nodes == [worker.node_id] * 3
    assert pid != os.getpid() and len(gpus) == 1 and gpus[0] in (0, 1)
    models = payload["kinds"]["azimuth"]["models"]
    for entry in models.values():
        _model, meta = checkpoint.load(tmp_path / "vp" / entry["checkpoint"])
        assert meta["metrics"]["epoch"] == 1 and meta["train_config"]["device"] == "auto"
    assert sorted(p.name for p in (tmp_path / "vp" / "azimuth").iterdir()) == [
        "em-capsnet-small.pt", "smallnorb-cnn.pt"
    ]  # fmt: skip
