"""The paper-scale GPU profile: it validates over params.yaml, ``capsnet profile --apply``
writes it with params.yaml's comments kept, and its resources really run four trials on
one GPU at once (a local Ray instance shaped like the RayJob's GPU workers, one logical
GPU; the trials train on the CPU, as torch finds no CUDA here)."""

from __future__ import annotations

import csv

import pytest
import yaml
from click.testing import CliRunner
from sweephelpers import base, lenet5_space

from capsnet import config
from capsnet.cli import main
from capsnet.io.errors import ConfigError
from pipeline import profile
from pipeline.sweep.stage import run_sweep

PROFILE = "paper-scale-gpu"


@pytest.fixture(scope="module")
def paper(repo_root):
    """params.yaml with the paper-scale GPU profile laid over it."""
    _path, settings, params = profile.load(repo_root / "params.yaml", PROFILE)
    return settings, params


def test_profile_packs_four_trials_per_gpu_and_uses_the_papers_models(paper):
    from capsnet import models

    _settings, params = paper
    for section in (params.sweep, params.smallnorb_sweep):
        resources = section.resources
        assert 1 / resources.gpus_per_trial == 4
        assert resources.max_concurrent_trials is None or resources.max_concurrent_trials >= 4
        assert section.checkpoint.every_epochs > 1
    assert params.sweep.space.model == "capsnet" and params.sweep.train_size is None
    assert params.train.train_size is None and params.train.extra_train_size is None
    assert set(params.train.extra_datasets) == {"multimnist", "expanded-mnist"}
    assert params.smallnorb_sweep.space.model == params.viewpoints.capsules == "em-capsnet"
    em = models.make_config("em-capsnet", (2, 32, 5))
    assert (em.A, em.B, em.C, em.D) == (32, 32, 32, 32)
    assert 300_000 < models.count_parameters(models.build("em-capsnet", (2, 32, 5))) < 330_000
    assert params.evaluate.device == "auto" and params.evaluate.limit is None
    assert params.sweep.compile and params.train.compile  # CUDA graphs, not launch-bound


def test_apply_writes_the_profile_into_the_params_file_keeping_its_comments(
    repo_root, tmp_path, paper
):
    target = tmp_path / "params.yaml"
    target.write_text((repo_root / "params.yaml").read_text())
    result = CliRunner().invoke(main, ["profile", PROFILE, "--params", str(target), "--apply"])
    assert result.exit_code == 0, result.output
    assert "sweep.resources.gpus_per_trial: 0.25  (was 0.0)" in result.output
    assert config.load(target) == paper[1]
    text = target.read_text()
    assert "# Ray Tune sweep (schema: capsnet/config/sweep.py)" in text  # comments kept
    assert "routing_iterations: {grid: [1, 2, 3, 5]}" in text  # written as params.yaml does
    assert "train_size: null" in text


def test_a_profile_replaces_a_dimension_whole_and_bad_keys_name_the_profile(tmp_path):
    merged = profile.merge(
        {"sweep": {"space": {"lr": {"grid": [1, 2]}, "m_plus": 0.9}, "epochs": 2}},
        {"sweep": {"space": {"lr": {"choice": [3]}}}},
    )
    assert merged == {"sweep": {"space": {"lr": {"choice": [3]}, "m_plus": 0.9}, "epochs": 2}}
    params = tmp_path / "params.yaml"
    params.write_text("sweep:\n  epochs: 2\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sweep:\n  resources:\n    gpus_per_trail: 0.25\n")
    with pytest.raises(ConfigError, match=r"params.yaml \+ bad.yaml: sweep.resources."
                       r"gpus_per_trail: unknown key"):  # fmt: skip
        profile.load(params, bad)
    with pytest.raises(ConfigError, match=r"profile 'nope' unknown; choose one of .*paper-scale"):
        profile.load(params, "nope")


def gpu_node_shape(repo_root) -> tuple[int, int]:
    """(CPUs, GPUs) of the RayJob's GPU worker pods (pipeline/cluster/rayjob.yaml), after
    checking that `ray up`'s cluster.yaml offers that shape (a g5.xlarge: 4 vCPUs, 1 GPU)."""
    cluster = repo_root / "pipeline" / "cluster"
    job = yaml.safe_load((cluster / "rayjob.yaml").read_text())
    worker = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
    up = yaml.safe_load((cluster / "cluster.yaml").read_text())
    assert "g5.xlarge" in str(up["available_node_types"])
    return int(limits["cpu"]), int(limits["nvidia.com/gpu"])


def test_profile_resources_run_four_trials_on_one_gpu_at_once(
    paper, tiny_sweep, sweep_data, tmp_path, repo_root
):
    """Four trials at once on a Ray node shaped like the RayJob's GPU workers."""
    import ray
    from ray.tune import Callback

    class Occupancy(Callback):
        """At every result: the trials running and the GPU Ray has left unassigned."""

        def __init__(self):
            self.running: list[int] = []
            self.free_gpu: list[float] = []
            self.requests: set[tuple] = set()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            self.running.append(sum(t.status == "RUNNING" for t in trials))
            self.free_gpu.append(ray.available_resources().get("GPU", 0.0))
            required = trial.placement_group_factory.required_resources
            self.requests.add(tuple(sorted(required.items())))

    resources = config.to_dict(paper[1].sweep.resources)
    sweep = tiny_sweep(
        epochs=3,
        resources=resources,
        space=lenet5_space(4),
        wandb={"mode": "disabled"},
    )  # fmt: skip
    occupancy = Occupancy()
    node_cpus, node_gpus = gpu_node_shape(repo_root)
    ray.init(address="local", num_cpus=node_cpus, num_gpus=node_gpus, include_dashboard=False,
             log_to_driver=False)  # fmt: skip
    try:
        run_sweep(sweep, base(sweep), out_dir=tmp_path / "sweep", data=sweep_data,
                  callbacks=[occupancy])  # fmt: skip
    finally:
        ray.shutdown()
    assert occupancy.requests == {(("CPU", 1.0), ("GPU", 0.25))}
    assert max(occupancy.running) == 4  # all four trials at once ...
    assert min(occupancy.free_gpu) == 0.0  # ... holding the whole GPU between them
    with open(tmp_path / "sweep" / "results.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"TERMINATED"}
    # Ray assigned each trial a quarter of GPU 0; torch finds no CUDA here, so they ran
    # on the CPU, and say so
    assert {(r["device"], r["peak_gpu_memory_mb"]) for r in rows} == {("cpu", "")}


PARAMS_TEXT = """\
# the settings
sweep:
  epochs: 2             # two epochs: a quick look
  name:   'capsnet-sweep'     # spacing and quotes as written
  list: [1,2]   # a flow list written tightly
  resources:
    max_concurrent_trials: 1  # one at a time
                              # (a continuation of that comment)
    cpus: 2.0
  space: {lr: 0.1, m: 0.9}  # a flow mapping

train:
  epochs: 3
"""


def test_apply_edits_only_the_lines_the_profile_sets_and_drops_their_old_comments():
    profile_settings = {
        "sweep": {
            "epochs": 30,
            "list": [1, 2],  # the value it has: line and comment stay
            "resources": {"max_concurrent_trials": None},
            "space": {"lr": 0.2},
            "seed": 5,
        },
        "evaluate": {"limit": 8},
    }
    text = profile.edit_text(PARAMS_TEXT, profile_settings, "p.yaml")
    assert (
        text
        == """\
# the settings
sweep:
  epochs: 30            # from p.yaml
  name:   'capsnet-sweep'     # spacing and quotes as written
  list: [1,2]   # a flow list written tightly
  resources:
    max_concurrent_trials: null # from p.yaml
    cpus: 2.0
  space: {lr: 0.2, m: 0.9}  # from p.yaml
  seed: 5  # from p.yaml

train:
  epochs: 3
evaluate:
  limit: 8  # from p.yaml
"""
    )
    assert yaml.safe_load(text) == profile.merge(yaml.safe_load(PARAMS_TEXT), profile_settings)


def test_apply_replaces_a_block_list_whole_at_its_keys_column():
    text = "train:\n  baselines:\n  - lenet5\n  - x  # two\n  epochs: 3\n"
    out = profile.edit_text(text, {"train": {"baselines": ["a", "b"]}}, "p.yaml")
    assert out == "train:\n  baselines: [a, b]\n  epochs: 3\n"
